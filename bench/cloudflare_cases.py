"""A flooding Worker (make bench): how much the `cloudflare` client's RSS grows while
the loopback stand-in sends an endless exec event, a 400 MB terminal frame or a 400 MB
answer to a create, against the bound that applies (`backends/cloudflare/bounds.py`).

Client and stand-in share this process; the stand-in sends from one 64 KiB chunk and
waits for the socket to drain, so the growth is the client's.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

import sandbox
from sandbox.backends.cloudflare import bounds
from sandbox.testing.cloudflare_server import CloudflareWorkerServer

from .measure import Figure, rss_bytes

KEY = "bench-key"
FLOOD_BYTES = 400 * 1000 * 1000
MIB = 1024 * 1024


async def _peak_growth(action: Callable[[], Awaitable[object]]) -> float:
    """MiB the RSS grew at most while `action` ran (sampled every millisecond)."""
    start = peak = rss_bytes()
    done = asyncio.Event()

    async def sample() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, rss_bytes())
            await asyncio.sleep(0.001)

    sampler = asyncio.ensure_future(sample())
    try:
        with contextlib.suppress(sandbox.SandboxError):
            await action()
    finally:
        done.set()
        await sampler
    return max(0, max(peak, rss_bytes()) - start) / MIB


async def _flood(kind: str, cfg: Any) -> float:
    root = cfg.workdir / f"cf-{kind}"
    async with CloudflareWorkerServer(api_key=KEY, root=root) as server:
        server.flood_bytes = FLOOD_BYTES
        session = sandbox.open_session("cloudflare", worker_url=server.url, api_key=KEY)
        if kind == "create":
            server.oversize("create", FLOOD_BYTES)
            growth = await _peak_growth(session.start)
            await session.aclose()
            return growth
        async with session:
            await session.exec("true")  # warm: the connection pool, the first sandbox
            if kind == "sse":
                server.exec_flood = "event"
                return await _peak_growth(lambda: session.exec("echo go; exec sleep 60"))
            server.pty_flood = "frame"
            return await _peak_growth(
                lambda: session.pty_exec_start("exec cat", tty=True, yield_time_s=30)
            )


async def flooding_peer(cfg: Any) -> list[Figure]:
    """RSS growth per flood, the bound as its baseline (ratio >= 1: within the bound)."""
    cases = [
        ("sse", "endless exec event (400 MB)", bounds.MAX_SSE_EVENT),
        ("frame", "400 MB terminal frame", bounds.MAX_WS_MESSAGE),
        ("create", "400 MB answer to a create", bounds.MAX_JSON_BODY),
    ]
    figures = []
    for kind, name, bound in cases:
        figure = Figure("cloudflare flood", f"RSS growth: {name}", "MiB", False)
        for _ in range(cfg.rounds):
            figure.ours.append(await _flood(kind, cfg))
            figure.baseline.append(bound / MIB)
        figure.note = "baseline: the bound on one message/body; ours: peak client RSS growth"
        figures.append(figure)
    return figures


CASES = [flooding_peer]
