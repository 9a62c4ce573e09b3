"""unix_local with `runner=True`: the link to this user's local runner daemon
(`connect`), and a process started through it (`spawn`). The runner contains every
process tree itself (a subreaper, a cgroup leaf per process where it can make one): the
session makes no cgroup of its own then.
"""

from __future__ import annotations

from typing import cast

from ...backend import CommandSpec, OutputSink, Process
from ...errors import BackendUnavailableError
from ...runner import RunnerClient, RunnerError, connect_local
from ..toolkit import CommandCheck, RunnerProcess, ShellTrap, spawn_through_runner, wait_for_verdict


async def connect() -> RunnerClient:
    """The connection to the runner (started on first use); `BackendUnavailableError`
    when there is none to be had."""
    try:
        return await connect_local()
    except RunnerError as exc:
        raise BackendUnavailableError(f"runner=True but {exc}") from None


async def spawn(
    runner: RunnerClient,
    entry: OutputSink[Process],
    started: CommandSpec,
    trap: ShellTrap | None,
    check: CommandCheck | None,
    *,
    env: dict[str, str],
    cwd: str,
    grace_s: float,
) -> None:
    """Start the entry's command (`started`: checked, in the jail when confined) through
    the runner in `cwd` on the host, then wait for the check's verdict if it has one."""
    await spawn_through_runner(
        runner,
        cast(OutputSink[RunnerProcess], entry),
        env=env,
        cwd=cwd,
        argv=started.argv,
        shown=None if trap is None else trap.feed,
        grace_s=grace_s,
    )
    if trap is not None and check is not None:
        await wait_for_verdict(entry, trap, check)
