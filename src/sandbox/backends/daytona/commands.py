"""Commands without a terminal: one Daytona session per command (pipes and one-shot).

The command is sent with `execute_session_command(run_async=True)` under
`scripts.piped_command` (stdin from /dev/null, its own session and group recorded in a
pid file, 128+N for a death by signal N, leftovers killed at its end); its output is
streamed by `get_session_command_logs_async` and its exit code read with
`get_session_command`, polled: the daemon has it shortly after the output ended, and
the SDK offers nothing to wait on.

`PipeState`, the handle of one command, is a `Process`: the base session's hooks
interrupt and kill it through its methods (no pipe keeps its stdin open: every command
reads /dev/null, so `stdin=True` is refused at start: `refuse_open_stdin`).

With `runner=True` a process (pipes or a terminal) and a one-shot command go through
the runner instead (`spawn_on_runner`, `start_oneshot_on_runner`, beside their
per-session twins): its handle a `RunnerProcess`, its output byte-exact.

Session logs reach us as text: the SDK decodes each stream with an incremental UTF-8
decoder (a character split across chunks is kept whole), but bytes that are not UTF-8
become U+FFFD before we see them. Pipe output is exact for UTF-8 text only.
"""

from __future__ import annotations

import asyncio
import logging
import posixpath
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

from daytona import DaytonaError, SessionExecuteRequest

from ...backend import (
    CommandSpec,
    ExecCapture,
    OneShotProcess,
    OutputSink,
    cancel_and_wait,
    settle,
)
from ...errors import ProviderError, SandboxError, UnsupportedOperationError
from ..toolkit import (
    CommandCheck,
    RunnerProcess,
    ShellTrap,
    normalize_exit,
    spawn_through_runner,
    start_one_shot,
    wait_for_verdict,
)
from .client import DaytonaClient
from .errors import is_not_found
from .handles import DaytonaHandle
from .runner_link import DaytonaRunner
from .scripts import PIDFILE_WAIT_S, interrupt_script, kill_script, piped_command

logger = logging.getLogger("sandbox.daytona")

# After a session command's output ended, how long to wait for its exit code.
EXIT_CODE_WAIT_S = 30.0


@dataclass(eq=False)
class PipeState(DaytonaHandle):
    """A session command (a pipe process's handle, or a one-shot's): its session,
    command id and reader, and how far its start went (what a kill must undo)."""

    session_id: str
    session_attempted: bool = False
    execute_attempted: bool = False
    cmd_id: str | None = None
    finished: bool = False
    pump: asyncio.Task[None] | None = None

    async def interrupt(self) -> None:
        """SIGINT to the command's process group, by a second exec of the interrupt
        script (it waits for the pid file of a command that is just starting)."""
        script = interrupt_script(self.pidfile, wait_s=PIDFILE_WAIT_S * 4)
        await self.client.call("interrupt the process", self.client.process.exec(script))

    async def kill(self, *, sandbox_stopping: bool = False) -> None:
        """Stop the reader, kill the command's tree unless it finished (its wrapper
        then killed what it left), delete the session. Skipped on the provider when
        the sandbox's deletion comes next (it kills everything). The first failure is
        raised after every step ran."""
        client = self.client
        errors: list[BaseException] = []
        pump = self.pump
        if pump is not None:
            await cancel_and_wait([pump])
        if self.sandbox_ends_it(sandbox_stopping):
            return
        if self.execute_attempted and not self.finished:
            try:
                await client.bounded_retry(
                    lambda: signal_group(
                        client,
                        self.pidfile,
                        wait_s=PIDFILE_WAIT_S if self.cmd_id is None else PIDFILE_WAIT_S * 2,
                        grace_s=self.grace_s,
                    )
                )
            except Exception as exc:
                errors.append(exc)
        if self.session_attempted:
            try:
                await client.bounded_retry(lambda: client.process.delete_session(self.session_id))
            except DaytonaError as exc:
                if not is_not_found(exc):
                    errors.append(exc)
            except Exception as exc:
                errors.append(exc)
        if errors:
            raise client.teardown_error(errors[0], "stop the process")

    async def release(self) -> None:
        """Stop the log reader; the daemon keeps the command and its log."""
        pump = self.pump
        if pump is not None and not pump.done():
            pump.cancel()
        if pump is not None:
            await asyncio.wait([pump])

    def ref_handle(self) -> dict[str, Any]:
        """The session and command ids and the pid file."""
        return {"session_id": self.session_id, "cmd_id": self.cmd_id, "pidfile": self.pidfile}


def new_pipe(client: DaytonaClient, kind: str, grace_s: float) -> PipeState:
    """A fresh state (names only: nothing exists on the provider yet)."""
    session_id = client.new_id(kind)
    return PipeState(
        client=client,
        pidfile=posixpath.join(client.state_dir, f"{session_id}.pid"),
        grace_s=grace_s,
        session_id=session_id,
    )


async def start(
    client: DaytonaClient,
    state: PipeState,
    spec: CommandSpec,
    check: CommandCheck | None,
    *,
    announce: bool,
) -> None:
    """Create the session and start the command; behind `check` it starts in the
    working directory and the check enters `cwd`. SDK errors are raised as they are."""
    state.session_attempted = True
    await client.timed("create a session", client.process.create_session(state.session_id))
    if check is None:
        shell_command, cwd = spec.shell_command, client.cwd(spec.cwd)
    else:
        shell_command, cwd = check.shell(spec.argv, announce=announce), client.workdir
    command = piped_command(shell_command, pidfile=state.pidfile, cwd=cwd, env=spec.env or {})
    state.execute_attempted = True
    response = await client.timed(
        "start the command",
        client.process.execute_session_command(
            state.session_id, SessionExecuteRequest(command=command, run_async=True)
        ),
    )
    state.cmd_id = response.cmd_id


async def read_logs(
    client: DaytonaClient,
    state: PipeState,
    on_stdout: Callable[[str], None],
    on_stderr: Callable[[str], None],
) -> None:
    """Stream the command's output until it ends."""
    await client.process.get_session_command_logs_async(
        state.session_id, state.cmd_id, on_stdout, on_stderr
    )


async def exit_code(client: DaytonaClient, state: PipeState) -> int:
    """The command's exit code, once the daemon has it (shortly after its output
    ended): polled with a growing interval, bounded by `EXIT_CODE_WAIT_S`."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + EXIT_CODE_WAIT_S
    delay = 0.01
    while True:
        command = await client.timed(
            "read the command's exit code",
            client.process.get_session_command(state.session_id, state.cmd_id),
        )
        if command.exit_code is not None:
            return normalize_exit(int(command.exit_code))
        if loop.time() >= deadline:
            raise ProviderError(
                "could not read the command's exit code: its output ended but none came "
                f"within {EXIT_CODE_WAIT_S:g}s",
                retryable=True,
            )
        await asyncio.sleep(delay)  # no event to wait on: the SDK only answers a poll
        delay = min(delay * 2, 0.25)


async def exit_code_if_known(client: DaytonaClient, state: PipeState) -> int | None:
    """The exit code if the daemon already has it (one bounded look), else None."""
    try:
        command = await client.bounded(
            client.process.get_session_command(state.session_id, state.cmd_id)
        )
    except Exception:
        return None
    return None if command.exit_code is None else normalize_exit(int(command.exit_code))


async def pump(
    client: DaytonaClient,
    entry: OutputSink[DaytonaHandle],
    state: PipeState,
    trap: ShellTrap | None,
    *,
    skip: int = 0,
) -> None:
    """Stream a pipe process's output into the entry, then report its exit. Stdout goes
    through `trap` when the command runs behind a check (it strips the markers). `skip`:
    the log replays from the command's start, and a reattached entry drops the bytes an
    earlier client already returned (`sandbox.backends.daytona.durable`)."""
    left = [skip]

    def feed(text: str) -> None:
        data = text.encode("utf-8")
        if left[0]:
            cut = min(left[0], len(data))
            left[0] -= cut
            data = data[cut:]
        entry.feed(data)

    def feed_stdout(text: str) -> None:
        assert trap is not None
        shown = trap.feed(text.encode("utf-8"))
        if shown:
            entry.feed(shown)

    try:
        await read_logs(client, state, feed if trap is None else feed_stdout, feed)
    except Exception as exc:  # the log stream died: did the command end?
        code = await exit_code_if_known(client, state)
        if code is None:
            entry.report_lost(f"the daytona log stream failed: {client.describe(exc)}")
            return
        entry.feed(
            b"\n[sandbox: output may be incomplete: the daytona log stream failed: "
            + client.describe(exc).encode()
            + b"]\n"
        )
    else:
        try:
            code = await exit_code(client, state)
        except Exception as exc:
            entry.report_lost(f"no exit code from daytona: {client.describe(exc)}")
            return
    state.finished = True
    entry.report_eof()
    entry.report_exit(code)


async def signal_group(
    client: DaytonaClient, pidfile: str, *, wait_s: float, grace_s: float
) -> bool:
    """Kill the tree recorded in `pidfile` by a second exec; True if there was one."""
    response = await client.process.exec(kill_script(pidfile, wait_s=wait_s, grace_s=grace_s))
    return "done" in (response.result or "")


async def spawn(client: DaytonaClient, entry: OutputSink[DaytonaHandle], grace_s: float) -> None:
    """Start a pipe process: its session command, then the reader pumping its log into
    the entry (behind a check, the verdict is awaited)."""
    state = new_pipe(client, f"p{entry.process_id}", grace_s)
    entry.handle = state
    command = entry.spec.command
    check = CommandCheck.needed(command, cwd=client.cwd(command.cwd))
    trap = None if check is None else ShellTrap(report_exit=False, token=check.token)
    try:
        await start(client, state, command, check, announce=True)
    except DaytonaError as exc:
        raise client.error(exc, "start the process") from None
    state.pump = asyncio.create_task(pump(client, entry, state, trap))
    if check is not None and trap is not None:
        await wait_for_verdict(entry, trap, check)


def refuse_open_stdin(entry: OutputSink[DaytonaHandle]) -> None:
    """Refuse `stdin=True` before anything starts: without the runner no pipe keeps its
    stdin open (a session command's stdin never sees EOF)."""
    if entry.spec.stdin:
        raise UnsupportedOperationError(
            "stdin=True: the daytona backend keeps the stdin of a process on pipes open "
            "only through the runner (runner=True); use tty=True to type into a "
            "process, or write the input to a file and redirect it (`sort < input.txt`)"
        )


async def spawn_on_runner(
    runner: DaytonaRunner, client: DaytonaClient, entry: OutputSink[DaytonaHandle], grace_s: float
) -> None:
    """Start the entry's command (pipes or a terminal) as a process of the runner (its
    handle a `RunnerProcess`, killed with its tree, SIGTERM to SIGKILL in `grace_s`), in
    its folder under the workdir with the runner's environment for it."""
    command = entry.spec.command
    await spawn_through_runner(
        runner.client,
        cast(OutputSink[RunnerProcess], entry),
        env=runner.environment(command.env, tty=entry.spec.tty),
        cwd=client.cwd(command.cwd),
        grace_s=grace_s,
    )


async def start_oneshot_on_runner(
    runner: DaytonaRunner, client: DaytonaClient, spec: CommandSpec, capture: ExecCapture
) -> OneShotProcess:
    """The runner's one-shot of `spec`, stdout and stderr apart and byte-exact, in its
    folder under the workdir with the runner's environment for it."""
    env = runner.environment(spec.env, tty=False)
    return await start_one_shot(runner.client, spec, capture, env=env, cwd=client.cwd(spec.cwd))


async def start_oneshot(
    client: DaytonaClient, spec: CommandSpec, capture: ExecCapture, grace_s: float
) -> OneShotCommand:
    """Start a one-shot command in its own session (see `OneShotCommand`); a start that
    fails or is cancelled deletes what it made."""
    state = new_pipe(client, "exec", grace_s)
    capture.check = CommandCheck.needed(spec, cwd=client.cwd(spec.cwd))
    try:
        await start(client, state, spec, capture.check, announce=False)
    except BaseException as exc:
        # Nobody else knows this command yet: undo it before the error propagates.
        await settle(state.kill())
        if isinstance(exc, DaytonaError):
            raise client.error(exc, "run the command") from None
        raise
    return OneShotCommand(state, capture)


class OneShotCommand:
    """A one-shot command (`sandbox.exec_output.OneShotProcess`): its logs go into the
    capture, its exit code is polled; the base session applies the timeout and kills."""

    def __init__(self, state: PipeState, capture: ExecCapture) -> None:
        self._client = state.client
        self._state = state
        self._capture = capture

    async def wait(self) -> int:
        """Stream the output into the capture, then poll the exit code."""
        capture = self._capture
        try:
            await read_logs(
                self._client,
                self._state,
                lambda text: capture.add_stdout(text.encode("utf-8")),
                lambda text: capture.add_stderr(text.encode("utf-8")),
            )
            code = await exit_code(self._client, self._state)
        except DaytonaError as exc:
            raise self._client.error(exc, "run the command") from None
        self._state.finished = True
        return code

    async def kill(self) -> None:
        """Kill the command's tree and delete its session (the sandbox is untouched)."""
        await self._state.kill()

    async def release(self) -> None:
        """Delete the finished command's session; a failure is only logged (the result
        is in hand, and a leftover session is minor)."""
        try:
            await self._state.kill()
        except SandboxError as exc:  # ours: mapped and redacted
            logger.warning("daytona: deleting a finished command's session failed: %s", exc)
        except Exception as exc:  # an SDK error's text may hold a URL or a token
            logger.warning(
                "daytona: deleting a finished command's session failed: %s", type(exc).__name__
            )
