"""The openai-agents column: its UnixLocal sandbox session (the design ours descends from
and replaces) on the same figures as ours, each beside raw in the same run, so its
ratios read like ours (`agents_sdk_cases` compares the two sessions under the SDK's
own tools instead).

Needs `openai-agents` (the `openai-agents` extra, pinned in constraints.txt); without it
one row says it was skipped and why. Its `pty_write_stdin` sleeps 0.1 s after a write and
has no `until`, so the round trip is not compared.
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib.metadata
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from .local_cases import Config, payload_file
from .measure import Figure
from .raw import RawChild


@asynccontextmanager
async def _session() -> AsyncIterator[Any]:
    from agents.sandbox.sandboxes.unix_local import UnixLocalSandboxClient

    client = UnixLocalSandboxClient()
    session = await client.create()
    try:
        async with session:
            yield session
    finally:
        await client.delete(session)


async def _raw_starts(count: int, tty: bool) -> float:
    t0 = time.perf_counter()
    for _ in range(count):
        raw = RawChild(["sh", "-c", "true"], tty=tty)
        assert await raw.finish() == 0
        raw.kill()
    return count / (time.perf_counter() - t0)


async def openai_agents(cfg: Config) -> list[Figure]:
    """Start `true` (pty, pipes), start/exit churn, `pty_terminate_all` of 64 and a pty
    drain, through openai-agents' UnixLocal session."""
    try:
        version = importlib.metadata.version("openai-agents")
        import agents.sandbox.sandboxes.unix_local  # noqa: F401
    except (ImportError, importlib.metadata.PackageNotFoundError):
        skipped = Figure("openai-agents", "its UnixLocal session", "-", True)
        skipped.note = "skipped: openai-agents is not installed (the `openai-agents` extra)"
        return [skipped]
    label = f"openai-agents {version}"  # the group: each row names the figure of ours
    # Its warning at 60+ live processes is expected in the terminate-all figure.
    logging.getLogger("openai.agents").setLevel(logging.ERROR)
    figures = []
    for tty in (True, False):
        kind = "pty" if tty else "pipes"
        fig = Figure(label, f"start `true`, {kind}", "calls/s", True)
        for _ in range(cfg.rounds):
            async with _session() as s:
                t0 = time.perf_counter()
                for _ in range(cfg.starts):
                    update = await s.pty_exec_start("true", tty=tty)
                    assert update.process_id is None and update.exit_code == 0
                fig.ours.append(cfg.starts / (time.perf_counter() - t0))
            fig.baseline.append(await _raw_starts(cfg.starts, tty))
        figures.append(fig)
    churn = Figure(label, f"{cfg.churn} start/exit cycles", "cycles/s", True)
    async with _session() as s:
        t0 = time.perf_counter()
        for i in range(cfg.churn):
            update = await s.pty_exec_start("true", tty=i % 2 == 0)
            assert update.process_id is None
        churn.ours.append(cfg.churn / (time.perf_counter() - t0))
    t0 = time.perf_counter()
    for i in range(cfg.churn):
        raw = RawChild(["sh", "-c", "true"], tty=i % 2 == 0)
        await raw.finish()
        raw.kill()
    churn.baseline.append(cfg.churn / (time.perf_counter() - t0))
    figures.append(churn)
    figures.append(await _terminate_all(cfg, label))
    figures.append(await _drain(cfg, label))
    return figures


async def _terminate_all(cfg: Config, label: str) -> Figure:
    fig = Figure(label, "pty_terminate_all, 64 live", "ms", False)
    for _ in range(cfg.rounds):
        async with _session() as s:
            ups = await asyncio.gather(
                *(s.pty_exec_start("echo r; exec cat", tty=True, yield_time_s=5) for _ in range(64))
            )
            assert all(u.process_id is not None for u in ups)
            t0 = time.perf_counter()
            await s.pty_terminate_all()
            fig.ours.append((time.perf_counter() - t0) * 1000)
        raws = [RawChild(["sh", "-c", "echo r; exec cat"], tty=True) for _ in range(64)]
        await asyncio.gather(*(r.read_until(b"r") for r in raws))
        t0 = time.perf_counter()
        for r in raws:
            r.kill()
        fig.baseline.append((time.perf_counter() - t0) * 1000)
    fig.note = "raw: SIGKILL+reap each group"
    return fig


async def _drain(cfg: Config, label: str) -> Figure:
    path, digest, size = payload_file(cfg)
    fig = Figure(label, f"drain {cfg.drain_mb} MB, pty", "MB/s", True)
    for _ in range(cfg.rounds):
        async with _session() as s:
            t0 = time.perf_counter()
            update = await s.pty_exec_start(
                f"cat {path}", tty=True, yield_time_s=0.25, max_output_tokens=size
            )
            parts = [update.output]
            while update.process_id is not None:
                update = await s.pty_write_stdin(
                    session_id=update.process_id,
                    chars="",
                    yield_time_s=0.25,
                    max_output_tokens=size,
                )
                parts.append(update.output)
            elapsed = time.perf_counter() - t0
            got = b"".join(parts)
        fig.ours.append(size / 1e6 / elapsed)
        t0 = time.perf_counter()
        raw = RawChild(["cat", str(path)], tty=True)
        await raw.finish()
        fig.baseline.append(size / 1e6 / (time.perf_counter() - t0))
        raw.kill()
    if hashlib.sha256(got).hexdigest() != digest:
        fig.note = f"its output was not the file's bytes ({len(got)} of {size} bytes)"
    return fig


CASES = [openai_agents]
