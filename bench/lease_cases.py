"""What the lease check costs a shared session (docs/durable-sessions.md, the lease).

A session that handed out a ref checks the lease before every call; the check is cached
for the hold and renewed in the background while the session is in use. The figure is
a `pty_write_stdin` round trip (`cat` on a tty, `until` the reply) of a shared session
beside the same round trip of an unshared one in the same run: ratio 1.0 = the check
costs nothing, the target is within 10% (ratio >= 0.9).

The two sides run in alternating blocks, not trip by trip: the shared session's
background reads would otherwise land in the unshared side's trips too. Before each
unshared block the shared session is left idle until its renewer stopped, so the
baseline pays none of it; each shared block starts after such an idle spell, so its
first trip pays the read an idle session makes again.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from pathlib import Path
from typing import Any

import sandbox
from sandbox.durable import lease

from .docker_cases import _available as docker_unavailable
from .docker_cases import container
from .measure import Figure

GROUP = "lease check"
BLOCKS = 4
# Long enough for an idle shared session's renewer to have made its last read and ended.
IDLE_S = 2 * lease.RENEW_AFTER * lease.HOLD_MS / 1000 + 0.3


async def _cat(s: sandbox.BaseSandboxSession) -> int:
    start = await s.pty_exec_start("cat", tty=True, yield_time_s=0.25)
    assert start.process_id is not None
    return start.process_id


async def _trips(s: sandbox.BaseSandboxSession, pid: int, count: int, tag: str) -> list[float]:
    times = []
    for i in range(count):
        want = f"{tag}{i}\r\n{tag}{i}\r\n"
        t0 = time.perf_counter()
        reply = await s.pty_write_stdin(pid, f"{tag}{i}\n", until=want, yield_time_s=5)
        times.append(time.perf_counter() - t0)
        assert want in reply.output
    return times


async def _compare(cfg: Any, label: str, open_one: Any) -> Figure:
    fig = Figure(GROUP, f"pty_write_stdin round trip, shared vs unshared ({label})", "ms", False)
    fig.note = "baseline: an unshared session's round trip, in alternating blocks of the same run"
    block = max(10, cfg.round_trips // BLOCKS)
    for _ in range(cfg.rounds):
        async with open_one() as shared, open_one() as unshared:
            shared_pid, unshared_pid = await _cat(shared), await _cat(unshared)
            shared.ref()
            await _trips(shared, shared_pid, 20, "w")  # warm-up, both sides alike
            await _trips(unshared, unshared_pid, 20, "w")
            ours: list[float] = []
            baseline: list[float] = []
            for _ in range(BLOCKS):
                await asyncio.sleep(IDLE_S)
                ours += await _trips(shared, shared_pid, block, "s")
                await asyncio.sleep(IDLE_S)
                baseline += await _trips(unshared, unshared_pid, block, "u")
            fig.ours.append(statistics.median(ours) * 1000)
            fig.baseline.append(statistics.median(baseline) * 1000)
    return fig


async def lease_check(cfg: Any) -> list[Figure]:
    """A shared session's round trip against an unshared one's: unix_local and docker."""
    workdir: Path = cfg.workdir

    def local() -> sandbox.BaseSandboxSession:
        return sandbox.open_session("unix_local", workdir=workdir / "lease-ws")

    figures = [await _compare(cfg, "unix_local", local)]
    reason = docker_unavailable()
    if reason:
        figures.append(Figure(GROUP, f"docker skipped: {reason}", "-", False))
        return figures
    async with container() as (_api, cid):

        def on_docker() -> sandbox.BaseSandboxSession:
            return sandbox.open_session("docker", container=cid, workdir="/tmp")

        figures.append(await _compare(cfg, "docker", on_docker))
    return figures


CASES = [lease_check]
