"""The `sandbox` command's benchmarks: `sandbox run` output to a pipe, through the real CLI
in a subprocess, beside the same bytes through a raw pipe (`head -c N /dev/zero | cat`)
and, when an engine is reachable, beside `docker exec` of the same command into a running
container (and `sandbox run --backend docker --container` into that same container), all
in the same run.

A run's time includes the session's start and close, which a raw pipe does not have: the
median time of `sandbox run -- true` (same backend, same run) is subtracted, so the
figure is the streaming itself; the note gives that fixed cost.
"""

from __future__ import annotations

import asyncio
import shlex
import statistics
import subprocess
import sys
import time
from typing import Any

from .measure import Figure

GROUP = "cli"
SANDBOX = [sys.executable, "-m", "sandbox.cli"]


def _seconds(argv: list[str]) -> float:
    """Wall time of one shell pipeline `argv | cat > /dev/null` (it must succeed)."""
    line = f"{shlex.join(argv)} | cat > /dev/null"
    started = time.perf_counter()
    subprocess.run(["sh", "-c", line], check=True, stdin=subprocess.DEVNULL)
    return time.perf_counter() - started


async def _rate(argv: list[str], size: int, fixed: float = 0.0) -> float:
    seconds = await asyncio.to_thread(_seconds, argv)
    return size / 1e6 / max(seconds - fixed, 1e-6)


async def _fixed_cost(argv: list[str], rounds: int) -> float:
    times = [await asyncio.to_thread(_seconds, [*argv, "true"]) for _ in range(rounds)]
    return statistics.median(times)


async def cli_run_throughput(cfg: Any) -> list[Figure]:
    """`sandbox run -- head -c N /dev/zero | cat` in MB/s, beside raw and docker exec."""
    size = (50 if cfg.quick else 200) * 1_000_000
    command = f"head -c {size} /dev/zero"
    local = [*SANDBOX, "run", "--workdir", str(cfg.workdir / "cli-ws"), "--"]
    fixed = await _fixed_cost(local, cfg.rounds)
    fig = Figure(GROUP, f"sandbox run -> pipe, {size // 1_000_000} MB (unix_local)", "MB/s", True)
    fig.note = f"raw: head | cat; the run's fixed cost ({fixed:.2f} s, start + close) is subtracted"
    for _ in range(cfg.rounds):
        fig.ours.append(await _rate([*local, command], size, fixed))
        fig.baseline.append(await _rate(["head", "-c", str(size), "/dev/zero"], size))
    figures = [fig]
    figures.extend(await _docker_figures(cfg, size, command))
    return figures


async def _docker_figures(cfg: Any, size: int, command: str) -> list[Figure]:
    from .docker_cases import _available, container

    reason = _available()
    if reason is not None:
        return [Figure(GROUP, f"sandbox run --backend docker: skipped: {reason}", "-", False)]
    async with container() as (_, container_id):
        ours = [*SANDBOX, "run", "--backend", "docker", "--container", container_id, "--"]
        fixed = await _fixed_cost(ours, cfg.rounds)
        fig = Figure(
            GROUP, f"sandbox run --backend docker -> pipe, {size // 1_000_000} MB", "MB/s", True
        )
        fig.note = (
            f"baseline: docker exec (the docker CLI) of the same command into the same "
            f"container; the run's fixed cost ({fixed:.2f} s) is subtracted"
        )
        raw = ["docker", "exec", container_id, "sh", "-c", command]
        for _ in range(cfg.rounds):
            fig.ours.append(await _rate([*ours, command], size, fixed))
            fig.baseline.append(await _rate(raw, size))
    return [fig]


CASES = [cli_run_throughput]
