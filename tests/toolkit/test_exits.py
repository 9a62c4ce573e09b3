"""Exit statuses the providers report, normalised (sandbox.backends.toolkit.exits)."""

from __future__ import annotations

import pytest

from sandbox.backends import toolkit


@pytest.mark.parametrize(
    ("code", "reason", "expected"),
    [
        (0, None, 0),
        (3, "signal: killed", 3),  # a code wins over the text
        (137, None, 137),  # 128+N from a wrapper: as is
        (255, None, 255),
        (-15, None, 143),  # -N: Python's returncode, some runtimes
        (-2, None, 130),
        (-500, None, 255),  # capped
        (-1, None, 137),  # Go's "signalled", no number: SIGKILL
        (-1, "signal: terminated", 143),
        (-1, "SIGINT", 130),
        (-1, "exit status -1: signal 9", 137),
        (-1, "Hangup", 129),
        (None, None, 255),  # nothing reported: unknown
        (None, "signal: killed (core dumped)", 137),
        (True, None, 255),  # not an int
        ("3", None, 255),
        (256 + 9, None, 137),  # ksh93's 256+N
        (1000, None, 255),
    ],
)
def test_normalize_exit(code: object, reason: str | None, expected: int) -> None:
    assert toolkit.normalize_exit(code, reason) == expected


def test_signal_from_reason_knows_nothing_else() -> None:
    assert toolkit.signal_from_reason("exited normally") is None
    assert toolkit.signal_from_reason("signal 0") is None
    assert toolkit.signal_from_reason("SIGNOTREAL") is None
    assert toolkit.signal_from_reason(None) is None
