"""Starting and signalling commands in a Modal sandbox, and reading their streams.

Every process is a `sandbox.exec.aio(...)` (`pty=True` for a terminal) whose argv comes
from `scripts` and whose environment carries the toolkit's tag. Signals go through a
second exec of the toolkit's kill or interrupt script (`Commands.control`). `Command`,
the handle of one command, is a `Process`: the base session's hooks write to it,
interrupt it, end its input and kill it through its methods.

With `pty=True` the SDK describes the terminal from the *client* process
(`modal._output.pty.get_pty_info`, called by `Sandbox.exec` through
`modal.sandbox._common.default_pty_info`): `TERM`, `COLORTERM` and `TERM_PROGRAM` from
`os.environ`, the window size from `sys.stdin`'s terminal. A server process has no TERM
and no terminal, so every terminal command gets `TERM` explicitly in its environment
(option `term`, default `xterm-256color`; a `TERM` in `env` or the command's own env
wins) and the toolkit's wrapper applies the requested size with `stty`.
"""

from __future__ import annotations

import asyncio
import logging
import posixpath
from collections.abc import Callable, Mapping
from typing import Any

from ...backend import CommandSpec, Process, cancel_and_wait
from ...errors import ProviderError, SandboxError
from ..toolkit import KILL_TICK_S, CommandCheck, new_tag, parse_kill_report, tag_environment
from . import scripts
from .errors import SANDBOX_GONE, SDK_ERRORS, ModalErrors

logger = logging.getLogger("sandbox.modal")

CONTROL_TIMEOUT_S = 30.0  # a control exec (signal, kill) beyond the terminate grace


# The largest piece of one write handed to the SDK's stdin writer at a time.
WRITE_CHUNK = 1024 * 1024


class Command(Process):
    """The backend's handle on one command (an `OutputSink.handle`, or a one-shot's):
    its tag, the SDK's `ContainerProcess` once the exec answered, and the tasks reading
    and watching it. As a `Process` it keeps what its controls need: `commands` (which
    signals its tree, and whose `errors` translate the SDK's exceptions) and `keep`
    (the session keeps the sandbox at close: its deletion does not end this command)."""

    def __init__(
        self,
        commands: Commands,
        *,
        tty: bool,
        keep: bool,
        tag: str | None = None,
        process: Any = None,
    ) -> None:
        self.commands = commands
        self.tty = tty
        self.keep = keep
        self.tag = tag if tag is not None else new_tag()
        self.process: Any = process  # the SDK's ContainerProcess, once the exec answered
        self.readers: list[asyncio.Task[None]] = []
        self.watcher: asyncio.Task[None] | None = None
        self.exited = False
        # One writer at a time: the SDK's writer keeps one buffer and one stream offset,
        # and an interrupt (`\x03`) may arrive while a write is draining.
        self.write_lock = asyncio.Lock()

    def __repr__(self) -> str:
        return f"Command(tag={self.tag}, tty={self.tty}, exited={self.exited})"

    def tasks(self) -> list[asyncio.Task[None]]:
        """Every task reading or watching this command."""
        return [*self.readers, *([self.watcher] if self.watcher is not None else [])]

    async def write(self, data: bytes) -> None:
        """Write to the terminal (or a pipe process's open stdin) through the SDK's
        stdin writer, in bounded chunks."""
        call = self.commands.errors.call
        async with self.write_lock:
            for start in range(0, len(data), WRITE_CHUNK):
                chunk = data[start : start + WRITE_CHUNK]
                await call("write to the process", _send, self.process, chunk)

    async def close_stdin(self) -> None:
        """The SDK's `write_eof()`, flushed by `drain()`: the EOF travels after every
        byte written before (one writer at a time, as for writes)."""
        async with self.write_lock:
            await self.commands.errors.call("close the command's stdin", _send_eof, self.process)

    async def interrupt(self) -> None:
        """SIGINT to a pipe process's group by the toolkit's interrupt script."""
        await self.commands.control(self, "int")

    async def kill(self, *, sandbox_stopping: bool = False) -> None:
        """Kill the process tree by tag (polite signals, grace, SIGKILL), then stop and
        await the reader and watcher tasks, whatever happened before."""
        try:
            if sandbox_stopping and not self.keep:
                # Terminating the sandbox next ends every process: one call, not one per
                # process (stopping our tasks is all that is left to do here).
                return
            # Also after the leader's exit: its background children may still be there.
            await self.commands.control(self, "kill" if self.exited else "term")
        finally:
            await cancel_and_wait(self.tasks())


async def _send(process: Any, chunk: bytes) -> None:
    process.stdin.write(chunk)
    await process.stdin.drain.aio()


async def _send_eof(process: Any) -> None:
    process.stdin.write_eof()
    await process.stdin.drain.aio()


class Commands:
    """Starts and signals the commands of one session's sandbox (`sandbox`, set by the
    session once it has one)."""

    def __init__(
        self,
        errors: ModalErrors,
        *,
        workdir: str,
        env: Mapping[str, str],
        term: str,
        state_dir: str,
        terminate_grace_s: float,
    ) -> None:
        self.errors = errors
        self.workdir = workdir
        self.sandbox: Any = None
        self.marked = False  # whether a marker may have been left in `state_dir`
        self.state_dir = state_dir
        self._env = dict(env)
        self._term = term
        self._grace_s = terminate_grace_s

    def require_sandbox(self) -> Any:
        """The sandbox, or `SandboxError` when there is none (not started, stopped)."""
        if self.sandbox is None:
            raise SandboxError("the modal sandbox is not available")
        return self.sandbox

    def cwd(self, cwd: str | None) -> str:
        """`cwd` as an absolute path (relative ones are in `workdir`)."""
        if cwd is None:
            return self.workdir
        return cwd if cwd.startswith("/") else posixpath.join(self.workdir, cwd)

    async def start(
        self,
        spec: CommandSpec,
        command: Command,
        *,
        wrap: bool,
        rows: int = 24,
        cols: int = 80,
        server_timeout: int | None = None,
        check: CommandCheck | None = None,
        announce: bool = False,
        keep_stdin: bool = False,
    ) -> Any:
        """Exec `spec` (`command.process` is set as soon as the exec answers); a pipe
        command then gets its stdin closed, unless `keep_stdin` (`stdin=True`: the
        handle's `close_stdin` ends it later). Behind a `check` the exec starts in
        `workdir` and the check enters `cwd`."""
        sandbox = self.require_sandbox()
        tty = command.tty
        argv = spec.argv if check is None else check.argv(spec.argv, announce=announce)
        full = scripts.command_argv(
            self.state_dir, command.tag, argv, tty=tty, wrap=wrap, rows=rows, cols=cols
        )
        # The SDK sends the client's own TERM (or none) with a terminal: ours is explicit.
        term = {"TERM": self._term} if tty else {}
        env = {**term, **self._env, **(spec.env or {}), **tag_environment(command.tag)}
        command.process = process = await self.errors.call(
            "start a command",
            sandbox.exec.aio,
            *full,
            pty=tty,
            text=False,
            timeout=server_timeout,
            workdir=self.cwd(spec.cwd) if check is None else self.workdir,
            env=env,
        )
        if not tty and not keep_stdin:
            process.stdin.write_eof()
            await self.errors.call("close the command's stdin", process.stdin.drain.aio)
        return process

    async def control(self, command: Command, mode: str) -> None:
        """Signal a command's tree with a second exec of the toolkit's script (`mode`
        `int`, `term` or `kill`, see `scripts.control_argv`). A command whose exec never
        answered gets the marker first: it may still start."""
        sandbox = self.sandbox
        if sandbox is None:
            return
        mark = command.process is None
        self.marked = self.marked or mark
        argv = scripts.control_argv(self.state_dir, command.tag, mode, self._grace_s, mark=mark)
        what = "interrupt the process" if mode == "int" else "kill the process"
        output = bytearray()
        try:
            async with asyncio.timeout(self._grace_s + KILL_TICK_S + CONTROL_TIMEOUT_S):
                process = await sandbox.exec.aio(*argv, text=False)
                await read_stream(process.stdout, output.extend)
                code = await process.wait.aio()
        except SANDBOX_GONE:
            return  # the sandbox finished: its processes are gone with it
        except TimeoutError:
            raise ProviderError(
                f"could not {what}: the control command did not finish in time", retryable=True
            ) from None
        except SDK_ERRORS as exc:
            raise self.errors.map(what, exc) from None
        text = output.decode("utf-8", "replace").strip()
        if code != 0 or parse_kill_report(text) is None:
            raise ProviderError(
                f"could not {what} (exit {code}): {text[-300:] or 'no output'}; "
                "the image needs sh, grep and kill",
                retryable=False,
            )


async def read_stream(stream: Any, sink: Callable[[bytes], object]) -> None:
    """Iterate an SDK output stream to its end, closing the iterator however it ends."""
    iterator = stream.__aiter__()
    try:
        async for chunk in iterator:
            sink(chunk.encode() if isinstance(chunk, str) else bytes(chunk))
    finally:
        aclose = getattr(iterator, "aclose", None)
        if aclose is not None:
            try:
                await aclose()
            except Exception as exc:  # closing a broken stream: the first error is what counts
                logger.debug("closing a Modal output stream failed: %s", type(exc).__name__)
