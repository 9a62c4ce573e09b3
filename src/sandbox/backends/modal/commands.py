"""Starting and signalling commands in a Modal sandbox, and reading their streams.

Every process is a `sandbox.exec.aio(...)` (`pty=True` for a terminal) whose argv comes
from `scripts` and whose environment carries the toolkit's tag. Signals go through a
second exec of the toolkit's kill or interrupt script (`Commands.control`).
"""

from __future__ import annotations

import asyncio
import logging
import posixpath
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ...backend import CommandSpec
from ...errors import ProviderError, SandboxError
from ..toolkit import KILL_TICK_S, CommandCheck, new_tag, parse_kill_report, tag_environment
from . import scripts
from .errors import SANDBOX_GONE, SDK_ERRORS, ModalErrors

logger = logging.getLogger("sandbox.modal")

CONTROL_TIMEOUT_S = 30.0  # a control exec (signal, kill) beyond the terminate grace


@dataclass(eq=False)
class Command:
    """The backend's handle on one command (a `OutputSink.handle`, or a one-shot's)."""

    tty: bool
    tag: str = field(default_factory=new_tag)
    process: Any = None  # the SDK's ContainerProcess, once the exec answered
    readers: list[asyncio.Task[None]] = field(default_factory=list)
    watcher: asyncio.Task[None] | None = None
    exited: bool = False
    write_lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    def tasks(self) -> list[asyncio.Task[None]]:
        """Every task reading or watching this command."""
        return [*self.readers, *([self.watcher] if self.watcher is not None else [])]


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
        session's `_close_stdin` ends it later). Behind a `check` the exec starts in
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
