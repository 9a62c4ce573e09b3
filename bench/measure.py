"""Measurement helpers: repeated rounds, medians, CPU time, event-loop stalls."""

from __future__ import annotations

import asyncio
import os
import resource
import statistics
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field


@dataclass
class Figure:
    """One benchmark figure: ours and the baseline over several rounds."""

    group: str
    name: str
    unit: str
    higher_is_better: bool
    ours: list[float] = field(default_factory=list)
    baseline: list[float] = field(default_factory=list)
    note: str = ""

    @property
    def ratio(self) -> float | None:
        """ours / baseline for "higher is better", else baseline / ours: >1 means ours
        does better, 1.0 means as good as raw."""
        if not self.ours or not self.baseline:
            return None
        o, b = statistics.median(self.ours), statistics.median(self.baseline)
        if o == 0 or b == 0:
            return None
        return o / b if self.higher_is_better else b / o

    def as_dict(self) -> dict[str, object]:
        def summary(values: list[float]) -> dict[str, float] | None:
            if not values:
                return None
            return {
                "median": statistics.median(values),
                "min": min(values),
                "max": max(values),
                "rounds": len(values),
            }

        return {
            "group": self.group,
            "name": self.name,
            "unit": self.unit,
            "higher_is_better": self.higher_is_better,
            "ours": summary(self.ours),
            "baseline": summary(self.baseline),
            "ratio": self.ratio,
            "note": self.note,
        }


def cpu_seconds() -> float:
    """User + system CPU time of this process so far."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def rss_bytes() -> int:
    """Current resident set size of this process."""
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


async def timed(make: Callable[[], Awaitable[object]]) -> float:
    """Seconds one awaited call takes."""
    t0 = time.perf_counter()
    await make()
    return time.perf_counter() - t0


class StallMeter:
    """A ticker task that records the longest gap between its ticks: how long the event
    loop was blocked."""

    def __init__(self, period: float = 0.001) -> None:
        self.period = period
        self.longest = 0.0
        self._task: asyncio.Task[None] | None = None

    async def _tick(self) -> None:
        last = time.perf_counter()
        while True:
            await asyncio.sleep(self.period)
            now = time.perf_counter()
            self.longest = max(self.longest, now - last - self.period)
            last = now

    def __enter__(self) -> StallMeter:
        self._task = asyncio.ensure_future(self._tick())
        return self

    def __exit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
