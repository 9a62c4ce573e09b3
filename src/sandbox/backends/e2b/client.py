"""`E2BClient`: one session's view of its E2B sandbox through the SDK, with every call
bounded and every failure mapped by the session's `ErrorPolicy`.

It owns the per-process calls a process's handle (`E2BProcess`) is made of: typing into
a terminal or a command's open stdin, waiting for a process's end, killing or
interrupting a tagged tree (the toolkit's kill script, run as a second command, then
E2B's own kill of the process it started), and letting go of an SDK handle.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from e2b import CommandExitException, NotFoundException

from ...errors import ProcessExitedError, SandboxError
from ..toolkit import normalize_exit
from .errors import GONE, ErrorPolicy
from .scripts import interrupt_line, kill_line

T = TypeVar("T")

# Terminal input is sent in pieces of at most this size (one request each).
STDIN_CHUNK = 32 * 1024
# Bound on each call that is not a process's stream (a file transfer, typed input, a
# resize), over the whole call: the SDK's `request_timeout` bounds each wait on the
# socket only, which a peer trickling a byte at a time never trips.
DEFAULT_CALL_TIMEOUT_S = 120.0


class E2BClient:
    """The SDK sandbox of one session (`sandbox`, set once it exists) and the bounds
    every call gets: `request_timeout` (each request), `start_timeout` (a create or a
    process start), `kill_timeout` (each teardown call), `process_timeout` (the lifetime
    E2B gives a process stream; 0: none)."""

    def __init__(
        self,
        errors: ErrorPolicy,
        *,
        request_timeout: float | None,
        start_timeout: float,
        kill_timeout: float,
        process_timeout: float,
        call_timeout: float = DEFAULT_CALL_TIMEOUT_S,
    ) -> None:
        self.errors = errors
        self.call_timeout = call_timeout
        self.sandbox: Any = None
        self.home: str | None = None  # the sandbox user's home: the workspace
        self.request_timeout = request_timeout
        self.start_timeout = start_timeout
        self.kill_timeout = kill_timeout
        self.process_timeout = process_timeout

    def request(self) -> dict[str, Any]:
        """The `request_timeout` keyword for SDK calls (none when not set)."""
        return {} if self.request_timeout is None else {"request_timeout": self.request_timeout}

    @staticmethod
    async def bounded(call: Awaitable[T], seconds: float) -> T:
        """`call`, cancelled after `seconds` (TimeoutError)."""
        async with asyncio.timeout(seconds):
            return await call

    async def timed(self, call: Awaitable[T], action: str) -> T:
        """`call` within `call_timeout` (a retryable `ProviderError` beyond, naming
        `action`); SDK errors pass through for the caller to map."""
        try:
            return await self.bounded(call, self.call_timeout)
        except TimeoutError:
            raise self.errors.no_answer(action, self.call_timeout) from None

    # ---- processes -------------------------------------------------------------------------

    @staticmethod
    async def wait_code(handle: Any) -> int:
        """The exit status of a process (E2B says -1 for a death by a signal it does not
        name: `normalize_exit` reads its error text, else SIGKILL)."""
        try:
            result = await handle.wait()
        except CommandExitException as exc:
            return normalize_exit(exc.exit_code, exc.error)
        return normalize_exit(result.exit_code, result.error)

    async def send(self, pid: int, data: bytes) -> None:
        """Type `data` into the terminal `pid`, in pieces of at most `STDIN_CHUNK`."""
        for at in range(0, len(data), STDIN_CHUNK):
            try:
                await self.timed(
                    self.sandbox.pty.send_stdin(pid, data[at : at + STDIN_CHUNK], **self.request()),
                    "write to the terminal",
                )
            except NotFoundException:
                raise ProcessExitedError(
                    "the process has exited; poll it with empty chars to collect its "
                    "remaining output and exit code"
                ) from None
            except Exception as exc:
                self.errors.fail(exc, "write to the terminal")

    async def send_input(self, pid: int, data: bytes) -> None:
        """Write `data` to the open stdin of the pipe command `pid` (`commands.send_stdin`,
        in pieces of at most `STDIN_CHUNK`)."""
        for at in range(0, len(data), STDIN_CHUNK):
            try:
                await self.timed(
                    self.sandbox.commands.send_stdin(
                        pid, data[at : at + STDIN_CHUNK], **self.request()
                    ),
                    "write to the process's stdin",
                )
            except NotFoundException:
                raise ProcessExitedError(
                    "the process has exited; poll it with empty chars to collect its "
                    "remaining output and exit code"
                ) from None
            except Exception as exc:
                self.errors.fail(exc, "write to the process's stdin")

    async def close_input(self, pid: int) -> None:
        """End the open stdin of the pipe command `pid` (`commands.close_stdin`: envd
        closes the pipe, the command reads end-of-file)."""
        try:
            await self.timed(
                self.sandbox.commands.close_stdin(pid, **self.request()),
                "close the process's stdin",
            )
        except NotFoundException:
            raise ProcessExitedError(
                "the process has exited; poll it with empty chars to collect its "
                "remaining output and exit code"
            ) from None
        except Exception as exc:
            self.errors.fail(exc, "close the process's stdin")

    async def disconnect(self, handle: Any) -> None:
        """Stop the SDK's reader of `handle` (local work in the SDK; bounded anyway)."""
        with contextlib.suppress(Exception):
            await self.bounded(handle.disconnect(), self.kill_timeout)

    async def control(self, script: str) -> None:
        """Run a short control command (a kill, a signal) in the sandbox."""
        await self.bounded(
            self.sandbox.commands.run(
                script,
                timeout=self.kill_timeout,
                request_timeout=self.kill_timeout,
                retain_output=False,
            ),
            self.kill_timeout,
        )

    async def interrupt(self, tag: str) -> None:
        """SIGINT to the process group of the tree tagged `tag`."""
        try:
            await self.control(interrupt_line(tag))
        except TimeoutError:
            raise self.errors.no_answer("interrupt the process", self.kill_timeout) from None
        except Exception as exc:
            self.errors.fail(exc, "interrupt the process")

    async def kill_tree(self, pid: int, tags: Sequence[str], *, tty: bool) -> None:
        """SIGKILL every tree tagged with one of `tags`, then the process `pid` E2B
        started (its own kill reaches that one only). Both are attempted; the first
        failure is raised."""
        if pid <= 1:
            return
        what = "terminal" if tty else "command"
        kill_started = self.sandbox.pty.kill if tty else self.sandbox.commands.kill
        await self._steps(
            [
                (f"kill the {what}'s process tree", lambda: self.control(kill_line(tags))),
                (f"kill the {what}", lambda: kill_started(pid, **self.request())),
            ]
        )

    async def _steps(self, steps: list[tuple[str, Callable[[], Awaitable[object]]]]) -> None:
        """Attempt every step (bounded); a target that is already gone is fine; raise the
        first real failure after all were attempted."""
        errors: list[SandboxError] = []
        for action, step in steps:
            try:
                await self.bounded(step(), self.kill_timeout)
            except GONE:
                pass
            except TimeoutError:
                errors.append(self.errors.no_answer(action, self.kill_timeout))
            except Exception as exc:
                errors.append(self.errors.error(exc, action))
        if errors:
            raise errors[0]
