"""Archive throughput (issue 22): `persist_workspace` and `hydrate_workspace`, each
direction on its own, on unix_local (and docker, when an engine is here), beside the raw
baseline of the same tree through `tar` on the host in the same run:

- persist: ours streams the archive to nowhere; raw is `tar -cf - . | cat >/dev/null`
  (through a pipe: GNU tar skips reading the files when it writes to /dev/null itself);
- hydrate: ours extracts an archive file read in 1 MiB chunks; raw is `tar -xf - <` the
  same file into a fresh folder;
- the round trip (persist on one session straight into hydrate on another) beside
  `tar -cf - . | tar -xf -`.

Rounds alternate ours and raw, so a disk busy writing back what the round before wrote
weighs on both. The tree: a few large files (real data, not sparse: both sides read
every byte) and a few thousand small ones, so both the byte rate and the per-member
cost show.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import time
from collections.abc import AsyncIterator
from pathlib import Path

import sandbox

from .local_cases import Config
from .measure import Figure

GROUP = "archive"
CHUNK = 1024 * 1024


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


async def _shell(command: str) -> float:
    t0 = time.perf_counter()
    proc = await asyncio.create_subprocess_shell(command)
    assert await proc.wait() == 0, command
    return time.perf_counter() - t0


async def _raw_persist(tree: Path) -> float:
    return await _shell(f"tar -C '{tree}' -cf - . | cat >/dev/null")


async def _raw_hydrate(archive: Path, dest: Path) -> float:
    dest.mkdir()
    try:
        return await _shell(f"tar -C '{dest}' -xf - < '{archive}'")
    finally:
        shutil.rmtree(dest, ignore_errors=True)


async def _raw_round_trip(tree: Path, dest: Path) -> float:
    dest.mkdir()
    try:
        return await _shell(f"tar -C '{tree}' -cf - . | tar -C '{dest}' -xf -")
    finally:
        shutil.rmtree(dest, ignore_errors=True)


async def _persist(session: sandbox.BaseSandboxSession, path: str) -> float:
    t0 = time.perf_counter()
    async for _ in session.persist_workspace(path):
        pass
    return time.perf_counter() - t0


async def _file_chunks(archive: Path) -> AsyncIterator[bytes]:
    with open(archive, "rb") as handle:
        while chunk := handle.read(CHUNK):
            yield chunk


async def _hydrate(session: sandbox.BaseSandboxSession, archive: Path, path: str) -> float:
    t0 = time.perf_counter()
    await session.hydrate_workspace(_file_chunks(archive), path)
    return time.perf_counter() - t0


async def _save(session: sandbox.BaseSandboxSession, path: str, archive: Path) -> None:
    with open(archive, "wb") as handle:
        async for chunk in session.persist_workspace(path):
            handle.write(chunk)


def _figures(backend: str, label: str) -> tuple[Figure, Figure, Figure]:
    return (
        Figure(GROUP, f"{backend} persist {label}", "MB/s", True),
        Figure(GROUP, f"{backend} hydrate {label}", "MB/s", True),
        Figure(GROUP, f"{backend} persist -> unix_local hydrate {label}", "MB/s", True),
    )


async def archive_round_trip(cfg: Config) -> list[Figure]:
    """MB/s of persist, of hydrate and of both at once on unix_local, beside `tar`."""
    big_mb, small = (16, 500) if cfg.quick else (128, 3000)
    label = f"{big_mb} MB + {small} files"
    persist, hydrate, both = _figures("unix_local", label)
    source = cfg.workdir / "archive-src"
    mb = _make_tree(source / "tree", big_mb, small) / 2**20
    archive = cfg.workdir / "archive.tar"
    async with sandbox.open_session("unix_local", workdir=source) as session:
        await _save(session, "tree", archive)
        for round_ in range(cfg.rounds):
            persist.ours.append(mb / await _persist(session, "tree"))
            persist.baseline.append(mb / await _raw_persist(source / "tree"))
            target = cfg.workdir / f"ours-{round_}"
            async with sandbox.open_session("unix_local", workdir=target) as other:
                hydrate.ours.append(mb / await _hydrate(other, archive, "copy"))
            shutil.rmtree(target, ignore_errors=True)
            hydrate.baseline.append(mb / await _raw_hydrate(archive, cfg.workdir / "raw"))
            async with sandbox.open_session("unix_local", workdir=target) as other:
                t0 = time.perf_counter()
                await other.hydrate_workspace(session.persist_workspace("tree"), "copy")
                both.ours.append(mb / (time.perf_counter() - t0))
            shutil.rmtree(target, ignore_errors=True)
            both.baseline.append(mb / await _raw_round_trip(source / "tree", cfg.workdir / "raw"))
    for figure in (persist, hydrate, both):
        figure.note = "baseline: tar on the host, same tree, same run"
    figures = [persist, hydrate, both]
    figures.extend(await _docker(cfg))
    return figures


async def _docker(cfg: Config) -> list[Figure]:
    from .docker_cases import _available

    # The same tree as unix_local's: docker's hydrate puts a batch of members per
    # engine call (it put one member per call, with a stat per folder on its way).
    big_mb, small = (16, 500) if cfg.quick else (128, 3000)
    persist, hydrate, both = _figures("docker", f"{big_mb} MB + {small} files")
    if (reason := _available()) is not None:
        for figure in (persist, hydrate, both):
            figure.note = f"skipped: {reason}"
        return [persist, hydrate, both]
    from sandbox.testing.docker_image import ensure_busybox_image

    tree = cfg.workdir / "docker-src" / "tree"
    mb = _make_tree(tree, big_mb, small) / 2**20
    archive = cfg.workdir / "docker-archive.tar"
    async with sandbox.open_session("unix_local", workdir=tree.parent) as local:
        await _save(local, "tree", archive)

    async with sandbox.open_session("docker", image=ensure_busybox_image(), network=False) as box:
        await box.hydrate_workspace(_file_chunks(archive), "tree")
        for round_ in range(cfg.rounds):
            persist.ours.append(mb / await _persist(box, "tree"))
            persist.baseline.append(mb / await _raw_persist(tree))
            hydrate.ours.append(mb / await _hydrate(box, archive, f"copy-{round_}"))
            await box.remove(f"copy-{round_}", recursive=True)
            hydrate.baseline.append(mb / await _raw_hydrate(archive, cfg.workdir / "raw"))
            target = cfg.workdir / f"from-docker-{round_}"
            async with sandbox.open_session("unix_local", workdir=target) as other:
                t0 = time.perf_counter()
                await other.hydrate_workspace(box.persist_workspace("tree"), "copy")
                both.ours.append(mb / (time.perf_counter() - t0))
            shutil.rmtree(target, ignore_errors=True)
            both.baseline.append(mb / await _raw_round_trip(tree, cfg.workdir / "raw"))
    for figure in (persist, hydrate, both):
        figure.note = "the engine's archive API; baseline: tar on the host, same tree"
    return [persist, hydrate, both]


CASES = [archive_round_trip]
