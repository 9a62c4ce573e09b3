"""The runner (docs/runner.md) started as a local daemon: what a process start costs
through it, beside a raw fork+exec of the same program in the same run.

"Start `true`" is SPAWN, then its EXIT (output drained, reaped), then FORGET, over one
connection; raw is the same program on a raw PTY or pipe read by the event loop, waited
for (bench/raw.py). Both run `true` itself, not through a shell.

"Reattach a process holding 1 MiB" is what a resume asks of the runner once its link is
open: a process printed 1 MiB while its client was gone (that connection closed), and a
new connection ATTACHes from offset 0 and takes the whole MiB from the ring; against a
new connection's PING (what reaching the runner costs without any output).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from sandbox.runner import binary
from sandbox.runner.client import RunnerClient
from sandbox.runner.frames import Stream
from sandbox.runner.local import connect_local
from sandbox.testing import procfs

from .measure import Figure
from .raw import RawChild

GROUP = "runner"
BLOCKS = 4  # ours and raw alternate in this many blocks per round
ENV = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}


class _Collect:
    """A sink that counts what it was fed, and says when `want` bytes came."""

    def __init__(self, want: int) -> None:
        self.want = want
        self.got = 0
        self.done = asyncio.Event()

    def feed(self, data: bytes, stream: Stream) -> None:
        self.got += len(data)
        if self.got >= self.want:
            self.done.set()

    def gap(self, start: int, end: int, stream: Stream) -> None:
        pass

    def exited(self, code: int) -> None:
        self.done.set()

    def lost(self, reason: str) -> None:
        self.done.set()


class _Exit:
    """A sink that only waits for the end."""

    def __init__(self) -> None:
        self.done = asyncio.Event()
        self.code: int | None = None

    def feed(self, data: bytes, stream: Stream) -> None:
        pass

    def gap(self, start: int, end: int, stream: Stream) -> None:
        pass

    def exited(self, code: int) -> None:
        self.code = code
        self.done.set()

    def lost(self, reason: str) -> None:
        self.done.set()


@contextlib.asynccontextmanager
async def _runner() -> AsyncIterator[RunnerClient]:
    """A fresh local runner in a private folder, stopped (SIGTERM) afterwards."""
    async with _runner_at() as (client, _):
        yield client


@contextlib.asynccontextmanager
async def _runner_at() -> AsyncIterator[tuple[RunnerClient, Path]]:
    """`_runner`, with the socket's path (for more connections)."""
    folder = tempfile.mkdtemp(prefix="sbrun-bench-", dir="/tmp")
    sock = Path(folder) / "runner.sock"
    client = await connect_local(sock, orphan_timeout=60)
    assert client.hello is not None
    try:
        yield client, sock
    finally:
        await client.aclose()
        with contextlib.suppress(ProcessLookupError):
            os.kill(client.hello.pid, signal.SIGTERM)
        deadline = time.monotonic() + 5
        while procfs.alive(client.hello.pid) and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        shutil.rmtree(folder, ignore_errors=True)


async def _start_true(client: RunnerClient, process_id: int, tty: bool) -> None:
    sink = _Exit()
    await client.spawn(process_id, ["true"], env=ENV, sink=sink, tty=tty)
    await sink.done.wait()
    assert sink.code == 0, sink.code
    await client.forget(process_id)


async def runner_start(cfg: Any) -> list[Figure]:
    """Start `true` through the local runner against a raw fork+exec of `true`."""
    if binary.runner_binary() is None:
        skipped = Figure(GROUP, "start `true`", "-", True)
        skipped.note = f"skipped: {binary.unavailable_reason()}"
        return [skipped]
    block = max(1, cfg.starts // BLOCKS)
    figures = []
    for tty in (True, False):
        label = "pty" if tty else "pipes"
        fig = Figure(GROUP, f"start `true` through the local runner, {label}", "calls/s", True)
        fig.note = f"baseline: a raw fork+exec of `true`; alternating blocks of {block}"
        for _ in range(cfg.rounds):
            async with _runner() as client:
                process_id = 1
                for _ in range(10):  # warm-up
                    await _start_true(client, process_id, tty)
                ours_s = raw_s = 0.0
                for _ in range(BLOCKS):
                    t0 = time.perf_counter()
                    for _ in range(block):
                        await _start_true(client, process_id, tty)
                    t1 = time.perf_counter()
                    for _ in range(block):
                        raw = RawChild(["true"], tty=tty)
                        assert await raw.finish() == 0
                        raw.kill()
                    ours_s += t1 - t0
                    raw_s += time.perf_counter() - t1
            fig.ours.append(block * BLOCKS / ours_s)
            fig.baseline.append(block * BLOCKS / raw_s)
        figures.append(fig)
    return figures


REPLAY_BYTES = 1 << 20


async def runner_reattach(cfg: Any) -> list[Figure]:
    """A new connection's ATTACH of a process whose 1 MiB was printed while no client
    was attached, to the last byte; against a new connection's PING."""
    fig = Figure(GROUP, "reattach a process holding 1 MiB (connect + attach + replay)", "ms", False)
    if binary.runner_binary() is None:
        fig.note = f"skipped: {binary.unavailable_reason()}"
        return [fig]
    fig.note = "target: <= 50 ms; baseline: a new connection and one PING"
    async with _runner_at() as (first, sock):
        printed = _Collect(REPLAY_BYTES)
        argv = ["sh", "-c", f"head -c {REPLAY_BYTES} /dev/zero; exec sleep 600"]
        await first.spawn(1, argv, env=ENV, sink=printed, ring_bytes=2 * REPLAY_BYTES)
        await printed.done.wait()
        await first.detach(1)
        for _ in range(cfg.rounds * 3):
            t0 = time.perf_counter()
            client = await connect_local(sock, start=False)
            try:
                replay = _Collect(REPLAY_BYTES)
                await client.attach(1, replay)
                await replay.done.wait()
                fig.ours.append((time.perf_counter() - t0) * 1000)
                assert replay.got == REPLAY_BYTES, replay.got
                await client.detach(1)
            finally:
                await client.aclose()
            t0 = time.perf_counter()
            client = await connect_local(sock, start=False)
            try:
                await client.ping()
                fig.baseline.append((time.perf_counter() - t0) * 1000)
            finally:
                await client.aclose()
    return [fig]


CASES = [runner_start, runner_reattach]
