"""Blaxel against a flooding peer (make bench): the client's RSS growth while the
stand-in sends an endless API answer or one huge terminal frame, against the bound
(`sandbox.backends.blaxel.bounds`). The stand-in runs in its own process."""

from __future__ import annotations

import asyncio
import contextlib
import sys
from typing import Any

from .measure import Figure, rss_bytes

MIB = 2**20


class _Peer:
    """The `bench.blaxel_peer` process and its line protocol."""

    def __init__(self, proc: asyncio.subprocess.Process, api_url: str, api_key: str) -> None:
        self.proc = proc
        self.api_url = api_url
        self.api_key = api_key

    async def say(self, line: str) -> None:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(f"{line}\n".encode())
        await self.proc.stdin.drain()
        assert (await self.proc.stdout.readline()).strip() == b"ok"


@contextlib.asynccontextmanager
async def _peer(root: str) -> Any:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bench.blaxel_peer",
        root,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None
        api_url, api_key = (await proc.stdout.readline()).decode().split()
        yield _Peer(proc, api_url, api_key)
    finally:
        if proc.stdin is not None:
            proc.stdin.close()
        try:
            await asyncio.wait_for(proc.wait(), 10)
        except TimeoutError:
            proc.kill()
            await proc.wait()


async def flooding_peer(cfg: Any) -> list[Figure]:
    """RSS growth of the client while the peer floods; the baseline is the bound."""
    try:
        import sandbox
        from sandbox.backends.blaxel import bounds
    except ImportError as exc:
        return [Figure("blaxel", f"skipped: {exc}", "-", False)]
    frame_mb = 100 if cfg.quick else 400
    answer = Figure("blaxel", "RSS growth, endless exec answer", "MiB", False)
    frame = Figure("blaxel", f"RSS growth, one {frame_mb} MB terminal frame", "MiB", False)
    answer.note = f"baseline: the bound ({bounds.MAX_RESPONSE_BYTES // MIB} MiB)"
    frame.note = f"baseline: the bound ({bounds.MAX_TERMINAL_FRAME_BYTES // MIB} MiB)"
    workdir = cfg.workdir / "blaxel"
    workdir.mkdir(exist_ok=True)
    async with _peer(str(cfg.workdir)) as peer:
        options = {
            "api_url": peer.api_url,
            "api_key": peer.api_key,
            "workspace": "local-workspace",
            "region": "local-1",
            "workdir": str(workdir),
        }
        async with sandbox.open_session("blaxel", **options) as session:
            await session.exec("true")  # warm: clients made, SDK paths imported
            for _ in range(cfg.rounds):
                await peer.say("flood exec")
                before = rss_bytes()
                with contextlib.suppress(sandbox.ProviderError):
                    await session.exec("true")
                answer.ours.append(max((rss_bytes() - before) / MIB, 0.01))
                answer.baseline.append(bounds.MAX_RESPONSE_BYTES / MIB)

                update = await session.pty_exec_start("echo ready; exec sleep 60", until="ready")
                assert update.process_id is not None
                before = rss_bytes()
                await peer.say(f"frame {frame_mb * 1000 * 1000}")
                await session.pty_write_stdin(update.process_id, "", yield_time_s=30)
                frame.ours.append(max((rss_bytes() - before) / MIB, 0.01))
                frame.baseline.append(bounds.MAX_TERMINAL_FRAME_BYTES / MIB)
                with contextlib.suppress(sandbox.SandboxError):
                    await session.pty_terminate(update.process_id)
    return [answer, frame]


CASES = [flooding_peer]
