"""What every remote backend needs beside its provider's API, written once.

- `shell`: the POSIX sh wrapper that tags a command and reports 128+N without the
  shell's "Killed" notice, and the kill/interrupt scripts that find a tagged tree
  through /proc (`wrapper_argv`, `kill_script`, `interrupt_script`, ...).
- `exits`: `normalize_exit`, one rule for the exit status a provider reports.
- `errors`: one HTTP error policy (`RETRYABLE_STATUSES`, `error_for_status`,
  `transport_error`) and one redaction (`redact`, `REDACTED`).
- `ShellTrap`, re-exported from `sandbox.shell_trap` (where it stays for now), for a
  command typed into a provider's interactive shell.

Used by every remote backend (see AGENTS.md for which parts). Nothing here imports a
provider SDK.
"""

from __future__ import annotations

from ...shell_trap import ShellTrap
from .errors import (
    REDACTED,
    RETRYABLE_STATUSES,
    clean_detail,
    error_for_status,
    is_retryable_status,
    redact,
    transport_error,
    transport_reason,
)
from .exits import UNKNOWN_EXIT, UNKNOWN_SIGNAL_EXIT, normalize_exit, signal_from_reason
from .shell import (
    KILL_TICK_S,
    TAG_VARIABLE,
    command_line,
    grace_ticks,
    interrupt_script,
    kill_script,
    new_tag,
    parse_kill_report,
    tag_environment,
    wrapper_argv,
)

__all__ = [
    "KILL_TICK_S",
    "REDACTED",
    "RETRYABLE_STATUSES",
    "TAG_VARIABLE",
    "UNKNOWN_EXIT",
    "UNKNOWN_SIGNAL_EXIT",
    "ShellTrap",
    "clean_detail",
    "command_line",
    "error_for_status",
    "grace_ticks",
    "interrupt_script",
    "is_retryable_status",
    "kill_script",
    "new_tag",
    "normalize_exit",
    "parse_kill_report",
    "redact",
    "signal_from_reason",
    "tag_environment",
    "transport_error",
    "transport_reason",
    "wrapper_argv",
]
