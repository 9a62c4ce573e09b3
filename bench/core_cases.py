"""Figures of the core's pure parts that used to be timed inside unit tests: truncation
stays linear, and a pathological `until` neither stalls the loop nor stretches a window.
Each figure is a ratio against a raw baseline in the same run."""

from __future__ import annotations

import re
import sys
import time

from sandbox.output.truncation import truncate_to_tokens

from .local_cases import Config, session
from .measure import Figure, StallMeter

GROUP = "core"
# `.*` then an anchored end: each search costs the square of its string.
PATHOLOGICAL = re.compile(r".*\$ $")


async def truncation(cfg: Config) -> list[Figure]:
    """`truncate_to_tokens` throughput on a text and on a 10x larger one, each beside the
    raw cost of encoding the same text to UTF-8 (which it must do). Linear means the
    ratio to raw does not fall at 10x the input (the unit test used to assert that 10x
    the input costs less than 40x the time)."""
    figures = []
    for lines in (100_000, 1_000_000):
        text = "ab\n" * lines
        size_mb = len(text) / 1e6
        fig = Figure(GROUP, f"truncate {size_mb:.1f} MB to 100 tokens", "MB/s", True)
        for _ in range(cfg.rounds):
            t0 = time.perf_counter()
            truncate_to_tokens(text, 100)
            fig.ours.append(size_mb / (time.perf_counter() - t0))
            t0 = time.perf_counter()
            text.encode("utf-8", "surrogatepass")
            fig.baseline.append(size_mb / (time.perf_counter() - t0))
        fig.note = "baseline: str.encode of the same text; linear: same ratio at both sizes"
        figures.append(fig)
    return figures


CHILD = (
    "import sys\n"
    "sys.stdin.readline()\n"
    "for _ in range(100):\n"
    "    sys.stdout.write('x' * 4096); sys.stdout.flush()\n"
    "sys.stdin.readline()\n"
)


async def pathological_until(cfg: Config) -> list[Figure]:
    """A 400 KB line against `until=.*\\$ $` in a 1 s window: the longest event-loop
    stall and the window's length, each beside the same flood without `until`."""
    window = 1.0
    stall = Figure(GROUP, "loop stall, 400 KB line vs a pathological until", "ms", False)
    length = Figure(GROUP, "a 1 s window's length with a pathological until", "s", False)
    for _ in range(cfg.rounds):
        for until in (None, PATHOLOGICAL):
            async with session(cfg) as s:
                started = await s.pty_exec_start(
                    sys.executable, "-c", CHILD, shell=False, tty=True, yield_time_s=0.25
                )
                assert started.process_id is not None
                with StallMeter() as meter:
                    t0 = time.perf_counter()
                    update = await s.pty_write_stdin(
                        started.process_id, "go\n", until=until, yield_time_s=window
                    )
                    elapsed = time.perf_counter() - t0
                assert update.process_id is not None, "the window ended, not the process"
            (stall.ours if until else stall.baseline).append(meter.longest * 1000)
            (length.ours if until else length.baseline).append(elapsed)
    stall.note = "ticker every 1 ms; baseline: the same flood without until (was: < 1 s)"
    length.note = "baseline: the same window without until (was asserted < 3 s)"
    return [stall, length]


CASES = [truncation, pathological_until]
