"""What confinement costs at start: `true` run confined (bubblewrap jail) vs unconfined.

`await measure(rounds)` returns median milliseconds per start for a one-shot `exec` and a
tty `pty_exec_start`, in both modes, and the difference; standalone:
`python -m bench.confine_start [rounds]`.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import tempfile
import time

import sandbox
from sandbox.backends.unix_local import confine


async def _starts(confined: bool, rounds: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="bench-confine-") as workspace:
        async with sandbox.open_session(
            "unix_local", workdir=workspace, confine=confined
        ) as session:
            await session.exec("true", shell=False)  # warm-up (and the cached bwrap probe)
            exec_s, pty_s = [], []
            for _ in range(rounds):
                t0 = time.perf_counter()
                result = await session.exec("true", shell=False)
                exec_s.append(time.perf_counter() - t0)
                assert result.exit_code == 0
                t0 = time.perf_counter()
                update = await session.pty_exec_start("true", tty=True, shell=False)
                pty_s.append(time.perf_counter() - t0)
                assert update.exit_code == 0
    return {
        "exec_ms": statistics.median(exec_s) * 1000,
        "pty_ms": statistics.median(pty_s) * 1000,
    }


async def measure(rounds: int = 30) -> dict[str, float | int | str]:
    """Median start latency (ms) of `true`, unconfined vs confined, and the overhead.

    Raises `BackendUnavailableError` when no jail can be created here.
    """
    confine.require_bwrap()
    plain = await _starts(False, rounds)
    jailed = await _starts(True, rounds)
    return {
        "rounds": rounds,
        "exec_unconfined_ms": plain["exec_ms"],
        "exec_confined_ms": jailed["exec_ms"],
        "exec_overhead_ms": jailed["exec_ms"] - plain["exec_ms"],
        "pty_unconfined_ms": plain["pty_ms"],
        "pty_confined_ms": jailed["pty_ms"],
        "pty_overhead_ms": jailed["pty_ms"] - plain["pty_ms"],
        "bwrap": confine.availability()[1],
    }


def main() -> None:
    """Print the figures of `measure` (rounds from argv, default 30)."""
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 30
    for key, value in asyncio.run(measure(rounds)).items():
        print(f"{key:20} {value:.2f}" if isinstance(value, float) else f"{key:20} {value}")


if __name__ == "__main__":
    main()
