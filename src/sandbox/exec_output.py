"""Bounded capture of a one-shot command's output.

`exec("yes", timeout=3)` must not hold gigabytes. Each stream keeps the same shape the
PTY windows keep (see `sandbox.output_buffer`): the first half of the bound, then a
rolling tail of the other half, and a count of the bytes dropped in between. A backend
appends each chunk as it arrives, so memory stays bounded whatever the command prints
(unless the provider's SDK hands over the whole output at once: then only what is kept
is bounded).
"""

from __future__ import annotations

from .command_check import CHECK_FAILED_EXIT, CommandCheck
from .errors import ExecTimeoutError
from .types import ExecResult

DEFAULT_EXEC_OUTPUT_LIMIT = 16 * 1024 * 1024
# The first bytes of a stream are also kept apart, whatever the bound: the command
# check's failure marker is found there (see `sandbox.command_check`).
START_BYTES = 4096


class BoundedBytes:
    """One stream's bytes: a head of `limit // 2`, a rolling tail of the rest, and the
    number of bytes dropped between them (`omitted`)."""

    __slots__ = ("_head", "_head_limit", "_tail", "_tail_limit", "omitted", "start", "total")

    def __init__(self, limit: int) -> None:
        self._head_limit = limit // 2
        self._tail_limit = limit - self._head_limit
        self._head = bytearray()
        self._tail = bytearray()
        self.omitted = 0
        self.total = 0
        self.start = bytearray()  # the first START_BYTES bytes ever appended

    def append(self, data: bytes | bytearray | memoryview) -> None:
        """Append a chunk; what exceeds the bound is dropped from the middle."""
        size = len(data)
        if not size:
            return
        self.total += size
        view = memoryview(data)
        if len(self.start) < START_BYTES:
            self.start += view[: START_BYTES - len(self.start)]
        room = self._head_limit - len(self._head)
        if room > 0:  # the head fills first: the tail is still empty
            self._head += view[:room]
            view = view[room:]
            if not view:
                return
        if len(view) >= self._tail_limit:
            self.omitted += len(self._tail) + len(view) - self._tail_limit
            self._tail = bytearray(view[len(view) - self._tail_limit :])
            return
        self._tail += view
        excess = len(self._tail) - self._tail_limit
        if excess > 0:
            # CPython deletes from the front of a bytearray in O(1) (it moves ob_start).
            del self._tail[:excess]
            self.omitted += excess

    def value(self) -> bytes:
        """The kept bytes: the head, then the tail."""
        return bytes(self._head) + bytes(self._tail)


class ExecCapture:
    """What a backend's `_exec` collects: stdout and stderr, each bounded to `limit`.

    The backend appends chunks with `add_stdout` / `add_stderr` as they arrive and ends
    with `result(exit_code)` or, at the timeout, raises `timeout_error(...)`. When the
    command ran behind a `CommandCheck` (`check`), `result` raises the check's error
    (`WorkdirError`, `CommandNotFoundError`) instead of returning its exit status.
    """

    def __init__(self, limit: int = DEFAULT_EXEC_OUTPUT_LIMIT) -> None:
        self.limit = limit
        self.stdout = BoundedBytes(limit)
        self.stderr = BoundedBytes(limit)
        self.check: CommandCheck | None = None

    def add_stdout(self, data: bytes | bytearray | memoryview) -> None:
        """Append a stdout chunk."""
        self.stdout.append(data)

    def add_stderr(self, data: bytes | bytearray | memoryview) -> None:
        """Append a stderr chunk."""
        self.stderr.append(data)

    def result(self, exit_code: int) -> ExecResult:
        """The command's `ExecResult`; raises the check's error if the check failed."""
        if self.check is not None and exit_code == CHECK_FAILED_EXIT:
            # On stderr; on stdout for a provider that merges the two (old Blaxel APIs).
            for stream in (self.stderr, self.stdout):
                error = self.check.failure_in(bytes(stream.start))
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
