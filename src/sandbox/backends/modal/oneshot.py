"""A one-shot command in a Modal sandbox: the `OneShotProcess` the base session drives.

Output and exit status travel on different RPC streams: `wait()` waits for the exit
while both readers append to the capture, gives the readers `exit_output_grace_s` to
finish, and leaves a tree still holding the pipes (a background child) to `release()`,
which kills it. The exec also gets a server-side timeout, a backstop only (1 s
granularity, a little after the base session's own deadline, which is what really ends
the command): if it fires first, Modal reports -1 and `wait()` raises the timeout error.
`start_oneshot` starts one (the session's `_start_exec`); with the runner,
`start_on_runner` starts the runner's one-shot instead (the toolkit's `start_one_shot`).
"""

from __future__ import annotations

import asyncio
from typing import Any

from ...backend import (
    CommandSpec,
    ExecCapture,
    OneShotProcess,
    cancel_and_wait,
    first_failure,
    settle,
)
from ...errors import ProviderError
from ..toolkit import CommandCheck, normalize_exit, start_one_shot
from .commands import Command, Commands, read_stream
from .runner_link import SandboxRunner

SERVER_TIMEOUT_CODE = -1  # what `ContainerProcess.wait()` returns when that backstop fired
SERVER_TIMEOUT_MARGIN_S = 2


class ModalOneShot:
    """A started one-shot command (see the module docstring)."""

    def __init__(
        self,
        commands: Commands,
        command: Command,
        capture: ExecCapture,
        *,
        display: str,
        timeout: float | None,
        exit_output_grace_s: float,
    ) -> None:
        self._commands = commands
        self._command = command
        self._capture = capture
        self._display = display
        self._timeout = timeout
        self._grace_s = exit_output_grace_s
        self._killed = False
        process = command.process
        command.readers = [
            asyncio.create_task(self._collect(process.stdout, capture.add_stdout)),
            asyncio.create_task(self._collect(process.stderr, capture.add_stderr)),
        ]

    async def _collect(self, stream: Any, sink: Any) -> None:
        try:
            await read_stream(stream, sink)
        except Exception as exc:
            raise self._commands.errors.map("read the command's output", exc) from None

    async def wait(self) -> int:
        """The exit status once known, with the output read (or the readers given the
        grace); the first reader or wait that fails stops the others and raises."""
        readers = self._command.readers
        waiter = asyncio.ensure_future(
            self._commands.errors.timed_call(
                "wait for the command", None, self._command.process.wait.aio
            )
        )
        await first_failure(readers, waiter)
        code = waiter.result()
        if code == SERVER_TIMEOUT_CODE:
            if self._timeout is not None:
                raise self._capture.timeout_error(self._display, self._timeout)
            raise ProviderError("the command ended without an exit status (Modal said -1)")
        # The exit status may overtake the last output: wait a little for the streams.
        # `release()` kills whatever still holds them open.
        grace = asyncio.ensure_future(asyncio.wait(readers, timeout=self._grace_s))
        await first_failure(readers, grace)
        return normalize_exit(code)

    async def kill(self) -> None:
        """Kill the tree by its tag, then stop the readers (idempotent)."""
        try:
            if not self._killed:
                self._killed = True
                await self._commands.control(self._command, "kill")
        finally:
            await cancel_and_wait(self._command.readers)

    async def release(self) -> None:
        """A tree still holding the output (a background child) is killed; the readers
        are stopped."""
        if all(reader.done() for reader in self._command.readers):
            self._killed = True
            await cancel_and_wait(self._command.readers)
            return
        await self.kill()


def server_timeout(timeout: float | None) -> int | None:
    """The exec's own timeout for a command the base session ends at `timeout`."""
    if timeout is None:
        return None
    return int(-(-timeout // 1)) + SERVER_TIMEOUT_MARGIN_S


async def start_oneshot(
    commands: Commands,
    spec: CommandSpec,
    capture: ExecCapture,
    *,
    keep: bool,
    exit_output_grace_s: float,
) -> ModalOneShot:
    """One exec (without the wrapper: see `scripts`), stdin closed, both streams read
    chunk by chunk into the bounded capture. If this is cancelled while the exec is in
    flight, the tree is killed by its tag (a marker stops it should the exec still
    start)."""
    timeout = capture.timeout  # for the server-side backstop just after it
    command = Command(commands, tty=False, keep=keep)
    check = capture.check = CommandCheck.needed(spec, cwd=commands.cwd(spec.cwd))
    try:
        await commands.start(
            spec, command, wrap=False, server_timeout=server_timeout(timeout), check=check
        )
    except BaseException:
        # Nobody else knows this command yet: its kill must outlive a second
        # cancellation (the close cancels this task too).
        await settle(commands.control(command, "kill"))
        raise
    return ModalOneShot(
        commands,
        command,
        capture,
        display=spec.display,
        timeout=timeout,
        exit_output_grace_s=exit_output_grace_s,
    )


async def start_on_runner(
    runner: SandboxRunner, commands: Commands, spec: CommandSpec, capture: ExecCapture
) -> OneShotProcess:
    """The runner's one-shot of `spec`, stdout and stderr apart, in its folder under the
    workdir (`commands.cwd`) with the runner's environment for it."""
    env = runner.environment(spec.env, tty=False)
    return await start_one_shot(runner.client, spec, capture, env=env, cwd=commands.cwd(spec.cwd))
