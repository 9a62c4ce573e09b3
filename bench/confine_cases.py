"""Start latency of `true` confined in the bubblewrap jail vs unconfined (make bench)."""

from __future__ import annotations

from typing import Any

from sandbox.backends.unix_local import confine

from .confine_start import _starts
from .measure import Figure


async def confinement(cfg: Any) -> list[Figure]:
    """Figures for one-shot exec and tty start; skipped (no figure) without bubblewrap."""
    ok, reason = confine.availability()
    if not ok:
        return [Figure("confine", f"skipped: {reason}", "-", False)]
    rounds = 20 if cfg.quick else 60
    exec_fig = Figure("confine", "start `true` (exec), confined vs not", "ms", False)
    pty_fig = Figure("confine", "start `true` (tty), confined vs not", "ms", False)
    for _ in range(cfg.rounds):
        plain = await _starts(False, rounds)
        jailed = await _starts(True, rounds)
        exec_fig.ours.append(jailed["exec_ms"])
        exec_fig.baseline.append(plain["exec_ms"])
        pty_fig.ours.append(jailed["pty_ms"])
        pty_fig.baseline.append(plain["pty_ms"])
    exec_fig.note = pty_fig.note = "ours: confined; baseline: the same session unconfined"
    return [exec_fig, pty_fig]


CASES = [confinement]
