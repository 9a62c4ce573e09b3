"""The OpenAI Agents SDK's own UnixLocal sessions beside ours, under the SDK's own tools.

Both sessions are driven through the same `ExecCommandTool` / `WriteStdinTool` objects
the SDK gives a model, so the figures are what an agent built on the SDK sees: the
latency of an `exec_command` call, of a `write_stdin` round trip to `cat` on a tty (both
windows without an early end, so each waits out the SDK's 250 ms write window), and the
time to close 64 live PTYs. The baseline is the SDK's session (ratio > 1: ours faster).
Skipped (no figures) without the `openai-agents` extra."""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from typing import Any

from .local_cases import Config
from .measure import Figure

PTYS = 64


@asynccontextmanager
async def _sdk_sessions(cfg: Config, ours: bool) -> AsyncIterator[Any]:
    if ours:
        from sandbox.integrations.openai_agents import SandboxClient, SandboxClientOptions

        client: Any = SandboxClient()
        options: Any = SandboxClientOptions(backend="unix_local")
    else:
        from agents.sandbox.sandboxes.unix_local import (
            UnixLocalSandboxClient,
            UnixLocalSandboxClientOptions,
        )

        client = UnixLocalSandboxClient()
        options = UnixLocalSandboxClientOptions()
    session = await client.create(options=options)
    await session.start()
    try:
        yield session
    finally:
        await session.shutdown()
        await client.delete(session)


async def _exec_ms(session: Any, rounds: int) -> float:
    from agents.sandbox.capabilities.tools.shell_tool import ExecCommandArgs, ExecCommandTool

    tool = ExecCommandTool(session=session)
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        out = await tool.run(ExecCommandArgs(cmd="echo hi", yield_time_ms=10_000))
        times.append(time.perf_counter() - t0)
        assert "hi" in out and "code 0" in out, out
    return statistics.median(times) * 1000


async def _write_ms(session: Any, rounds: int) -> float:
    import re

    from agents.sandbox.capabilities.tools.shell_tool import (
        ExecCommandArgs,
        ExecCommandTool,
        WriteStdinArgs,
        WriteStdinTool,
    )

    started = await ExecCommandTool(session=session).run(
        ExecCommandArgs(cmd="cat", tty=True, yield_time_ms=300)
    )
    found = re.search(r"session ID (\d+)", started)
    assert found, started
    write = WriteStdinTool(session=session)
    times = []
    for i in range(rounds):
        t0 = time.perf_counter()
        out = await write.run(WriteStdinArgs(session_id=int(found.group(1)), chars=f"p{i}\n"))
        times.append(time.perf_counter() - t0)
        assert f"p{i}" in out, out
    return statistics.median(times) * 1000


async def _close_ms(session: Any) -> float:
    for _ in range(PTYS):
        update = await session.pty_exec_start("cat", tty=True, yield_time_s=0.25)
        assert update.process_id is not None
    t0 = time.perf_counter()
    await session.pty_terminate_all()
    return (time.perf_counter() - t0) * 1000


async def agents_sdk(cfg: Config) -> list[Figure]:
    """exec_command, write_stdin and closing 64 PTYs: the SDK's UnixLocal against ours."""
    try:
        import agents.sandbox  # noqa: F401
    except ImportError:
        return []
    group = "openai-agents tools"
    exec_fig = Figure(group, "exec_command `echo hi` (SDK UnixLocal = baseline)", "ms", False)
    write_fig = Figure(group, "write_stdin to cat, 250 ms window (SDK = baseline)", "ms", False)
    close_fig = Figure(group, f"pty_terminate_all of {PTYS} PTYs (SDK = baseline)", "ms", False)
    rounds = 5 if cfg.quick else 20
    loop = asyncio.get_running_loop()
    # The SDK reads each PTY with a blocking os.read in the default executor: with the
    # default pool (min(32, cpus + 4) threads) its next PTY start stalls once that many
    # PTYs are live and silent. The baseline gets a pool big enough for 64.
    big_pool = ThreadPoolExecutor(max_workers=2 * PTYS + 8)
    try:
        for _ in range(cfg.rounds):
            for ours, target in ((True, "ours"), (False, "baseline")):
                loop.set_default_executor(ThreadPoolExecutor() if ours else big_pool)
                async with _sdk_sessions(cfg, ours) as session:
                    getattr(exec_fig, target).append(await _exec_ms(session, rounds))
                    writes = max(3, rounds // 4)
                    getattr(write_fig, target).append(await _write_ms(session, writes))
                    getattr(close_fig, target).append(await _close_ms(session))
    finally:
        loop.set_default_executor(ThreadPoolExecutor())
    note = "both through the SDK's own tool objects; openai-agents 0.24"
    for fig in (exec_fig, write_fig):
        fig.note = note
    close_fig.note = (
        note + "; the SDK SIGKILLs each process group and does not wait for it to die, ours "
        "sends SIGHUP/SIGTERM, waits for the tree (the session's cgroup) to empty, and only "
        "then SIGKILLs what is left; the SDK holds one executor thread per live PTY: it ran "
        f"with a {2 * PTYS + 8}-thread pool (with the default pool its 7th live PTY on 2 cores "
        "stalls until another prints)"
    )
    return [exec_fig, write_fig, close_fig]


CASES = [agents_sdk]
