"""Commands without a terminal: one Daytona session per command (pipes and one-shot).

The command is sent with `execute_session_command(run_async=True)` under
`scripts.piped_command` (stdin from /dev/null, its own session and group recorded in a
pid file, 128+N for a death by signal N, leftovers killed at its end); its output is
streamed by `get_session_command_logs_async` and its exit code read with
`get_session_command`, polled: the daemon has it shortly after the output ended, and
the SDK offers nothing to wait on.

Session logs reach us as text: the SDK decodes each stream with an incremental UTF-8
decoder (a character split across chunks is kept whole), but bytes that are not UTF-8
become U+FFFD before we see them. Pipe output is exact for UTF-8 text only.
"""

from __future__ import annotations

import asyncio
import logging
import posixpath
from collections.abc import Callable

from daytona import DaytonaError, SessionExecuteRequest

from ...backend import CommandSpec, ExecCapture, OutputSink, cancel_and_wait
from ...errors import ProviderError, SandboxError
from ..toolkit import CommandCheck, ShellTrap, normalize_exit
from .client import DaytonaClient
from .errors import is_not_found
from .handles import DaytonaHandle, PipeState
from .scripts import PIDFILE_WAIT_S, kill_script, piped_command

logger = logging.getLogger("sandbox.daytona")

# After a session command's output ended, how long to wait for its exit code.
EXIT_CODE_WAIT_S = 30.0


def new_pipe(client: DaytonaClient, kind: str) -> PipeState:
    """A fresh state (names only: nothing exists on the provider yet)."""
    session_id = client.new_id(kind)
    return PipeState(session_id, posixpath.join(client.state_dir, f"{session_id}.pid"))


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


async def teardown(
    client: DaytonaClient, state: PipeState, *, grace_s: float, sandbox_stopping: bool
) -> None:
    """Stop the reader, kill the command's tree unless it finished (its wrapper then
    killed what it left), delete the session. Skipped on the provider when the sandbox
    goes next (its deletion kills everything). The first failure is raised after every
    step ran."""
    errors: list[BaseException] = []
    pump = state.pump
    if pump is not None:
        await cancel_and_wait([pump])
    if sandbox_stopping:
        return
    if state.execute_attempted and not state.finished:
        try:
            await client.bounded_retry(
                lambda: signal_group(
                    client,
                    state.pidfile,
                    wait_s=PIDFILE_WAIT_S if state.cmd_id is None else PIDFILE_WAIT_S * 2,
                    grace_s=grace_s,
                )
            )
        except Exception as exc:
            errors.append(exc)
    if state.session_attempted:
        try:
            await client.bounded_retry(lambda: client.process.delete_session(state.session_id))
        except DaytonaError as exc:
            if not is_not_found(exc):
                errors.append(exc)
        except Exception as exc:
            errors.append(exc)
    if errors:
        raise client.teardown_error(errors[0], "stop the process")


class OneShotCommand:
    """A one-shot command (`sandbox.exec_output.OneShotProcess`): its logs go into the
    capture, its exit code is polled; the base session applies the timeout and kills."""

    def __init__(
        self, client: DaytonaClient, state: PipeState, capture: ExecCapture, grace_s: float
    ) -> None:
        self._client = client
        self._state = state
        self._capture = capture
        self._grace_s = grace_s

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
        await teardown(self._client, self._state, grace_s=self._grace_s, sandbox_stopping=False)

    async def release(self) -> None:
        """Delete the finished command's session; a failure is only logged (the result
        is in hand, and a leftover session is minor)."""
        try:
            await teardown(self._client, self._state, grace_s=self._grace_s, sandbox_stopping=False)
        except SandboxError as exc:  # ours: mapped and redacted
            logger.warning("daytona: deleting a finished command's session failed: %s", exc)
        except Exception as exc:  # an SDK error's text may hold a URL or a token
            logger.warning(
                "daytona: deleting a finished command's session failed: %s", type(exc).__name__
            )
