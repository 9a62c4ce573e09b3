"""Bounded capture of a one-shot command's output.

`exec("yes", timeout=3)` must not hold gigabytes. Each stream keeps the same shape the
PTY windows keep (see `sandbox.output.buffer`): the first half of the bound, then a
rolling tail of the other half, and a count of the bytes dropped in between. A backend
appends each chunk as it arrives, so memory stays bounded whatever the command prints
(unless the provider's SDK hands over the whole output at once: then only what is kept
is bounded).
"""

from __future__ import annotations

from typing import Protocol

from .backends.toolkit.check import CHECK_FAILED_EXIT, CommandCheck
from .errors import ExecTimeoutError, SandboxError
from .output.buffer import BoundedOutput
from .types import ExecResult

DEFAULT_EXEC_OUTPUT_LIMIT = 16 * 1024 * 1024
# The first bytes of a stream are also kept apart, whatever the bound: the command
# check's failure marker is found there (see `sandbox.backends.toolkit.check`).
START_BYTES = 4096


class BoundedBytes:
    """One stream's bytes: a `BoundedOutput` (head of `limit // 2`, rolling tail of the
    rest, `omitted` dropped between), plus the first bytes ever appended (`start`) and
    the `total` count."""

    __slots__ = ("_buffer", "start", "total")

    def __init__(self, limit: int) -> None:
        self._buffer = BoundedOutput(limit)
        self.total = 0
        self.start = bytearray()  # the first START_BYTES bytes ever appended

    @property
    def omitted(self) -> int:
        """Bytes dropped from the middle."""
        return self._buffer.omitted

    def append(self, data: bytes | bytearray | memoryview) -> None:
        """Append a chunk; what exceeds the bound is dropped from the middle."""
        self.total += len(data)
        if len(self.start) < START_BYTES:
            self.start += memoryview(data)[: START_BYTES - len(self.start)]
        self._buffer.append(data)

    def value(self) -> bytes:
        """The kept bytes: the head, then the tail."""
        return b"".join(self._buffer.since(0))


class ExecCapture:
    """What a backend's `_exec` collects: stdout and stderr, each bounded to `limit`.

    The backend appends chunks with `add_stdout` / `add_stderr` as they arrive and ends
    with `result(exit_code)` or, at the timeout, raises `timeout_error(...)`. When the
    command ran behind a `CommandCheck` (`check`), `result` raises the check's error
    (`WorkdirError`, `CommandNotFoundError`) instead of returning its exit status.
    """

    def __init__(
        self, limit: int = DEFAULT_EXEC_OUTPUT_LIMIT, *, timeout: float | None = None
    ) -> None:
        self.limit = limit
        self.stdout = BoundedBytes(limit)
        self.stderr = BoundedBytes(limit)
        self.check: CommandCheck | None = None
        # The caller's timeout (None: none). The base session enforces it; a backend may
        # read it to give the provider a backstop just after it.
        self.timeout = timeout

    def add_stdout(self, data: bytes | bytearray | memoryview) -> None:
        """Append a stdout chunk."""
        self.stdout.append(data)

    def add_stderr(self, data: bytes | bytearray | memoryview) -> None:
        """Append a stderr chunk."""
        self.stderr.append(data)

    def check_error(self, exit_code: int) -> SandboxError | None:
        """The check's error if the command check failed (`exit_code` is its status and
        its marker is in the first bytes of a stream), else None."""
        if self.check is not None and exit_code == CHECK_FAILED_EXIT:
            # On stderr; on stdout for a provider that merges the two (old Blaxel APIs).
            for stream in (self.stderr, self.stdout):
                error = self.check.failure_in(bytes(stream.start))
                if error is not None:
                    return error
        return None

    def result(self, exit_code: int) -> ExecResult:
        """The command's `ExecResult`; raises the check's error if the check failed."""
        error = self.check_error(exit_code)
        if error is not None:
            raise error
        return ExecResult(
            stdout=self.stdout.value(),
            stderr=self.stderr.value(),
            exit_code=exit_code,
            stdout_omitted=self.stdout.omitted,
            stderr_omitted=self.stderr.omitted,
        )

    def timeout_error(self, display: str, timeout: float | None) -> ExecTimeoutError:
        """The `ExecTimeoutError` for a command killed at its timeout, with what it
        printed (bounded the same way)."""
        return ExecTimeoutError.killed(
            display,
            timeout,
            self.stdout.value(),
            self.stderr.value(),
            stdout_omitted=self.stdout.omitted,
            stderr_omitted=self.stderr.omitted,
        )


class OneShotProcess(Protocol):
    """A one-shot command a backend started with `_start_exec`; the base session owns
    its life from then on (timeout, cancellation, the settled kill, ownership at close).
    """

    async def wait(self) -> int:
        """Wait until the command exited and its output was appended to the capture;
        return its exit status (128+N for a death by signal N). If the provider's own
        timeout ended the wait, raise `capture.timeout_error(...)`: the base session
        then kills the command (never this method) and rebuilds the error after the
        kill, with whatever output the kill collected."""
        ...

    async def kill(self) -> None:
        """Kill the command's whole tree and release what it holds. Idempotent; the base
        session awaits it settled (timeout, cancellation, close), never the backend."""
        ...

    async def release(self) -> None:
        """After `wait()` returned: release what is left (a reader, a socket, a zombie,
        a leftover background child of the command)."""
        ...
