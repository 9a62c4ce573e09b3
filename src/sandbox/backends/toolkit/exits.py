"""One rule for the exit status a provider reports: the contract's 0-255, 128+N for a
death by signal N.

Providers say "killed by a signal" in several ways, and this is how each reads:

- a code from 0 to 255 is the status itself (a shell or a wrapper already turned a
  signal death into 128+N);
- -N (N >= 2) is a death by signal N (Python's `returncode`, some runtimes): 128+N;
- -1 is Go's "killed by a signal" without its number (envd, the Daytona daemon): the
  signal named in `reason` when there is one, else SIGKILL, 137 (a wrapper that traps
  the catchable signals can only die of that one);
- None (or anything that is not an int) means the provider reported no status: the
  signal named in `reason`, else 255, "unknown", as ssh reports a lost remote status;
- 256+N (ksh93's way, 257-383) is 128+N; any other code above 255 is 255.

`reason` is the provider's text: "signal: killed", "SIGTERM", "signal 9", "Terminated".
"""

from __future__ import annotations

import re
import signal

UNKNOWN_EXIT = 255
UNKNOWN_SIGNAL_EXIT = 128 + signal.SIGKILL
_MAX_SIGNAL = 127

# Go's (and strsignal's) descriptions of signals, as a daemon may report a death.
_DESCRIPTIONS = {
    "hangup": 1,
    "interrupt": 2,
    "quit": 3,
    "illegal instruction": 4,
    "trace/breakpoint trap": 5,
    "aborted": 6,
    "bus error": 7,
    "floating point exception": 8,
    "killed": 9,
    "user defined signal 1": 10,
    "segmentation fault": 11,
    "user defined signal 2": 12,
    "broken pipe": 13,
    "alarm clock": 14,
    "terminated": 15,
}
_NUMBER_RE = re.compile(r"signal[:\s]+(\d{1,3})\b")
_NAME_RE = re.compile(r"\bsig([a-z]+[0-9]*)\b")


def signal_from_reason(reason: str | None) -> int | None:
    """The signal number a provider's text names ("signal: killed", "SIGKILL",
    "signal 9", "Terminated"), or None."""
    text = (reason or "").strip().lower()
    if not text:
        return None
    match = _NUMBER_RE.search(text)
    if match and 0 < int(match.group(1)) <= _MAX_SIGNAL:
        return int(match.group(1))
    match = _NAME_RE.search(text)
    if match:
        try:
            return int(signal.Signals["SIG" + match.group(1).upper()])
        except KeyError:
            pass
    description = text.split(":", 1)[1].strip() if text.startswith("signal:") else text
    return _DESCRIPTIONS.get(description.split(" (core dumped)")[0].strip())


def normalize_exit(code: object, reason: str | None = None) -> int:
    """The contract's exit status for what a provider reported (see the module
    docstring for the rules)."""
    if isinstance(code, bool) or not isinstance(code, int):
        number = signal_from_reason(reason)
        return UNKNOWN_EXIT if number is None else 128 + number
    if 0 <= code <= 255:
        return code
    if code == -1:
        number = signal_from_reason(reason)
        return UNKNOWN_SIGNAL_EXIT if number is None else 128 + number
    if code < 0:
        return 128 + min(-code, _MAX_SIGNAL)
    if 256 < code <= 256 + _MAX_SIGNAL:
        return code - 128
    return UNKNOWN_EXIT
