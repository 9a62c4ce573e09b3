"""Archive throughput (issue 22): `persist_workspace` and `hydrate_workspace` on
unix_local (and docker, when an engine is here) beside the raw baseline of the same
tree piped through `tar` locally (`tar -cf - . | tar -xf -` in a shell, no library).

The tree: a few large files (real data, not sparse: both sides read every byte) and a
few thousand small ones, so both the byte rate and the per-member cost show.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import time
from pathlib import Path

import sandbox

from .local_cases import Config
from .measure import Figure

GROUP = "archive"


def _make_tree(root: Path, big_mb: int, small: int) -> int:
    """The benchmark tree; its size in bytes."""
    total = 0
    block = os.urandom(1024 * 1024)
    for k in range(4):
        path = root / "big" / f"part{k}.bin"
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "wb") as handle:
            for _ in range(big_mb // 4):
                handle.write(block)
        total += (big_mb // 4) * len(block)
    for k in range(small):
        path = root / "small" / f"d{k % 50}" / f"f{k}.txt"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"x" * 512)
        total += 512
    return total


async def _raw_tar(source: Path, dest: Path) -> float:
    dest.mkdir()
    t0 = time.perf_counter()
    proc = await asyncio.create_subprocess_shell(
        f"tar -C '{source}' -cf - . | tar -C '{dest}' -xf -"
    )
    assert await proc.wait() == 0
    return time.perf_counter() - t0


async def _ours(session: sandbox.BaseSandboxSession, target: sandbox.BaseSandboxSession) -> float:
    t0 = time.perf_counter()
    await target.hydrate_workspace(session.persist_workspace("tree"), "copy")
    return time.perf_counter() - t0


async def archive_round_trip(cfg: Config) -> list[Figure]:
    """MB/s of persist + hydrate between two unix_local sessions, and of `tar | tar`."""
    big_mb, small = (16, 500) if cfg.quick else (128, 3000)
    fig = Figure(GROUP, f"unix_local persist+hydrate {big_mb} MB + {small} files", "MB/s", True)
    source = cfg.workdir / "archive-src"
    total = _make_tree(source / "tree", big_mb, small)
    mb = total / 2**20
    for round_ in range(cfg.rounds):
        fig.baseline.append(mb / await _raw_tar(source / "tree", cfg.workdir / f"raw-{round_}"))
        target = cfg.workdir / f"ours-{round_}"
        async with (
            sandbox.open_session("unix_local", workspace=source) as session,
            sandbox.open_session("unix_local", workspace=target) as other,
        ):
            fig.ours.append(mb / await _ours(session, other))
        shutil.rmtree(target, ignore_errors=True)
        shutil.rmtree(cfg.workdir / f"raw-{round_}", ignore_errors=True)
    figures = [fig]
    figures.extend(await _docker(cfg, source / "tree", mb))
    return figures


async def _docker(cfg: Config, tree: Path, mb: float) -> list[Figure]:
    from .docker_cases import _available

    fig = Figure(GROUP, "docker persist (engine archive) to unix_local", "MB/s", True)
    if (reason := _available()) is not None:
        fig.note = f"skipped: {reason}"
        return [fig]
    from sandbox.testing.docker_image import ensure_busybox_image

    async with sandbox.open_session("docker", image=ensure_busybox_image(), network=False) as box:
        async with sandbox.open_session("unix_local", workspace=tree.parent) as local:
            await box.hydrate_workspace(local.persist_workspace("tree"), "tree")
        for round_ in range(cfg.rounds):
            target = cfg.workdir / f"from-docker-{round_}"
            async with sandbox.open_session("unix_local", workspace=target) as other:
                fig.ours.append(mb / await _ours(box, other))
            shutil.rmtree(target, ignore_errors=True)
            fig.baseline.append(mb / await _raw_tar(tree, cfg.workdir / f"raw-d-{round_}"))
            shutil.rmtree(cfg.workdir / f"raw-d-{round_}", ignore_errors=True)
    fig.note = "baseline: tar | tar of the same tree on the host"
    return [fig]


CASES = [archive_round_trip]
