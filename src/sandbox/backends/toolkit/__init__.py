"""What every remote backend needs beside its provider's API, written once.

- `shell`: the POSIX sh wrapper that tags a command (in `TAG_VARIABLE`) and reports
  128+N without the shell's "Killed" notice, and the kill/interrupt scripts that find a
  tagged tree through /proc, polling every `KILL_TICK_S` (`wrapper_argv`, `kill_script`,
  `interrupt_script`, `check_tag`, ...).
- `exits`: `normalize_exit`, one rule for the exit status a provider reports
  (`UNKNOWN_EXIT` when it reports none, `UNKNOWN_SIGNAL_EXIT` for a signal it cannot
  name).
- `errors`: one HTTP error policy (`RETRYABLE_STATUSES`, `error_for_status`,
  `transport_error`) and one redaction (`redact`, `REDACTED`).
- `trap`: `ShellTrap`, for a command typed into a provider's interactive shell, and
  `wait_for_verdict`, the wait for a `CommandCheck`'s verdict seen through a trap.
- `check`: `CommandCheck` and `CHECK_SCRIPT`, the sh check of `cwd` and program in front
  of a command (`WorkdirError`, `CommandNotFoundError` on every backend alike).
- `credentials`: `Secret` (never in a message, log or repr) and `require_credential`.
- `limits`: the three limit options (`MEMORY`, `PROCESSES`, `CPU`) checked once into
  `ResourceLimits`; `paths`: `within_workspace`.
- `lease`: the lease of a durable session kept as a file in a remote sandbox, swapped
  by one `sh` script (`lease_path`, `lease_read_argv`, `lease_swap_argv`, `lease_line`,
  `parse_lease`; see docs/durable-sessions.md).
- `durable_common`: what the durability of a remote sandbox repeats: `ScriptLease`, the
  `LeaseStore` over that script (a backend writes only how a command runs), and
  `attach_options`, a resume's options from a ref that names its sandbox;
  `attach_or_gone`, its attach, a missing sandbox `SessionGoneError`.
- `ref_trust`: what even a sealed ref may not decide (`taken_from_ref`,
  `refuse_other_endpoint`, `check_mark` with `SESSION_MARK`).
- `options`: the one name of each option concept, an earlier name refused by
  `refuse_renamed` (`RENAMED`), and the backend flags the cli and the MCP server share
  (those not exported here).
- `runner_processes`: processes through the runner (`RunnerProcess`, `spawn`, the
  one-shot, `RunnerDurability`); `runner_delivery`: putting the runner into a sandbox
  whatever the provider (the content-named path, the prepare and install scripts, the
  build for the sandbox's machine); `runner_terminal`: the runner's text link over a
  terminal process of the backend's own (`TerminalLink`, `LinkSink`); `runner_session`:
  the session's end of a runner over a text link (`LinkedRunner`); `runner_choice`:
  the `runner` option's policy (`RunnerChoice`) and its two public properties
  (`RunnerReport`).

Used by every remote backend (see AGENTS.md for which parts). Nothing here imports a
provider SDK.
"""

from __future__ import annotations

from .check import CommandCheck
from .credentials import Secret, require_credential
from .durable_common import ScriptLease, attach_options, attach_or_gone
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
from .lease import lease_line, lease_path, lease_read_argv, lease_swap_argv, parse_lease
from .limits import (
    CPU,
    MEMORY,
    PROCESSES,
    ResourceLimits,
    check_limits,
    refuse_unsupported,
    whole_multiple,
)
from .options import RENAMED, refuse_renamed
from .paths import within_workspace
from .ref_trust import SESSION_MARK, check_mark, refuse_other_endpoint, taken_from_ref
from .runner_choice import RunnerChoice, RunnerReport
from .runner_delivery import (
    RUNNER_INSTALL_SCRIPT,
    RUNNER_PREPARE_SCRIPT,
    PlacedRunner,
    SandboxPlace,
    StderrTail,
    check_runner_installed,
    choose_binary,
    no_runner_built,
    packaged_bytes,
    packaged_runners,
    parse_prepare,
    place_runner,
    read_packaged,
    runner_paths,
    write_then_install,
)
from .runner_place import (
    FALLBACK_ERRORS,
    HELLO_TIMEOUT_S,
    MAX_RUNNER_BYTES,
    MAX_SOCKET_PATH,
    MAX_STDERR_BYTES,
    RUNNER_OFF,
    checked_digest,
    checked_folder,
    fallen_back,
    hello_through,
    runner_name,
    sandbox_environment,
)
from .runner_processes import (
    RunnerDurability,
    RunnerOneShot,
    RunnerProcess,
    process_environment,
    reattach_ref,
    runner_id_in,
    start_one_shot,
)
from .runner_processes import reattach as reattach_through_runner
from .runner_processes import ref_process as runner_ref_process
from .runner_processes import spawn as spawn_through_runner
from .runner_session import LinkedRunner, RunnerTextLink, close_then_release
from .runner_terminal import LinkSink, TerminalLink, link_argv
from .shell import (
    KILL_TICK_S,
    TAG_VARIABLE,
    check_tag,
    command_line,
    grace_ticks,
    interrupt_script,
    kill_script,
    new_tag,
    parse_kill_report,
    running_tags,
    tag_environment,
    wrapper_argv,
)
from .trap import ShellTrap, wait_for_verdict

__all__ = [
    "CPU",
    "FALLBACK_ERRORS",
    "HELLO_TIMEOUT_S",
    "KILL_TICK_S",
    "MAX_RUNNER_BYTES",
    "MAX_SOCKET_PATH",
    "MAX_STDERR_BYTES",
    "MEMORY",
    "PROCESSES",
    "REDACTED",
    "RENAMED",
    "RETRYABLE_STATUSES",
    "RUNNER_INSTALL_SCRIPT",
    "RUNNER_OFF",
    "RUNNER_PREPARE_SCRIPT",
    "SESSION_MARK",
    "TAG_VARIABLE",
    "UNKNOWN_EXIT",
    "UNKNOWN_SIGNAL_EXIT",
    "CommandCheck",
    "LinkSink",
    "LinkedRunner",
    "PlacedRunner",
    "ResourceLimits",
    "RunnerChoice",
    "RunnerDurability",
    "RunnerOneShot",
    "RunnerProcess",
    "RunnerReport",
    "RunnerTextLink",
    "SandboxPlace",
    "ScriptLease",
    "Secret",
    "ShellTrap",
    "StderrTail",
    "TerminalLink",
    "attach_options",
    "attach_or_gone",
    "check_limits",
    "check_mark",
    "check_runner_installed",
    "check_tag",
    "checked_digest",
    "checked_folder",
    "choose_binary",
    "clean_detail",
    "close_then_release",
    "command_line",
    "error_for_status",
    "fallen_back",
    "grace_ticks",
    "hello_through",
    "interrupt_script",
    "is_retryable_status",
    "kill_script",
    "lease_line",
    "lease_path",
    "lease_read_argv",
    "lease_swap_argv",
    "link_argv",
    "new_tag",
    "no_runner_built",
    "normalize_exit",
    "packaged_bytes",
    "packaged_runners",
    "parse_kill_report",
    "parse_lease",
    "parse_prepare",
    "place_runner",
    "process_environment",
    "read_packaged",
    "reattach_ref",
    "reattach_through_runner",
    "redact",
    "refuse_other_endpoint",
    "refuse_renamed",
    "refuse_unsupported",
    "require_credential",
    "runner_id_in",
    "runner_name",
    "runner_paths",
    "runner_ref_process",
    "running_tags",
    "sandbox_environment",
    "signal_from_reason",
    "spawn_through_runner",
    "start_one_shot",
    "tag_environment",
    "taken_from_ref",
    "transport_error",
    "transport_reason",
    "wait_for_verdict",
    "whole_multiple",
    "within_workspace",
    "wrapper_argv",
    "write_then_install",
]
