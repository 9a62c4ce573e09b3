"""What runs beside a command in a Modal sandbox: the toolkit's scripts, plus a preamble.

Modal has no per-process kill, signal or resize call, so every command carries the
toolkit's tag in its exec environment (`tag_environment`) and is signalled by a second
exec of the toolkit's kill or interrupt script, which finds the tree through /proc.
Processes (`pty_exec_start`) run under the toolkit's wrapper (`wrapper_argv`: 128+N,
Ctrl-C survived, the session's leftovers swept at the command's exit, `stty` for the
terminal size, since the SDK sends the *client's* window size).

One-shot commands run without the wrapper, on purpose: its sweep would kill a daemon
the command left behind with its output redirected, and a one-shot `exec` leaves such a
daemon running (as `docker exec` does); one that still holds the output pipes is killed
by the kill script after a grace. Their exit status needs no wrapper: the SDK reports a
signal death as 128+N itself.

Before either, a preamble (`preamble_argv`) does what the toolkit cannot know about:

- the race with a start cancelled while its exec was in flight: the teardown of a
  command whose exec never answered first leaves a marker file (`mark_then`); the
  preamble checks (and removes) it, so a process that starts after its teardown exits
  at once (143). Nothing is written for other commands.
- a pipe command must lead its process group (the interrupt script signals the root's
  group) and, for the wrapper's sweep, its session. Whether a Modal exec starts as
  either is not documented, so the preamble runs `setsid` when it does not lead its
  group. (`setsid` would fork, and lose the exit status, in a process that already
  leads its group: then it is left as it is, a group leader whose session the sweep
  cannot find, but the kill script still finds the tree by its tag and descendants.)
  A terminal command is never moved: it would lose its controlling terminal.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..toolkit import grace_ticks, interrupt_script, kill_script, wrapper_argv

PREAMBLE_NAME = "sandbox-modal"
MARK_NAME = "sandbox-kill-mark"

# `sh -c PREAMBLE sandbox-modal MARKER LEAD ARGV...`: /proc/PID/stat after the command
# name ("...) ") holds state, ppid, pgrp: the third field is the process group.
PREAMBLE = r"""m=$1 lead=$2
shift 2
if [ -e "$m" ]; then rm -f "$m"; exit 143; fi
if [ "$lead" = 1 ] && [ -r /proc/$$/stat ] && command -v setsid >/dev/null 2>&1; then
  read -r s </proc/$$/stat
  s=${s##*") "}; s=${s#* }; s=${s#* }; g=${s%% *}
  [ "$g" = $$ ] || exec setsid "$@"
fi
exec "$@"
"""

# `sh -c MARK sandbox-kill-mark DIR FILE ARGV...`: leave the marker, then run ARGV.
MARK = r"""[ -d "$1" ] || mkdir -p "$1" 2>/dev/null
: 2>/dev/null >"$2"
shift 2
exec "$@"
"""


def marker_path(state_dir: str, tag: str) -> str:
    """Where the teardown of the command tagged `tag` leaves its marker."""
    return f"{state_dir}/{tag}.kill"


def command_argv(
    state_dir: str,
    tag: str,
    argv: Sequence[str],
    *,
    tty: bool,
    wrap: bool,
    rows: int | None = None,
    cols: int | None = None,
) -> list[str]:
    """The exec's argv for `argv`: the preamble, then (`wrap`) the toolkit's wrapper,
    with the terminal size for a terminal. The tag itself goes in the exec's env."""
    if wrap:
        size = {"rows": rows, "cols": cols} if tty else {}
        argv = wrapper_argv(tag, argv, set_tag=False, **size)
    lead = "0" if tty else "1"
    return ["sh", "-c", PREAMBLE, PREAMBLE_NAME, marker_path(state_dir, tag), lead, *argv]


def control_argv(state_dir: str, tag: str, mode: str, grace_s: float, *, mark: bool) -> list[str]:
    """The toolkit's script for `mode`: `int` (SIGINT to the tree's group), `term`
    (polite signals, `grace_s`, then SIGKILL) or `kill` (SIGKILL at once). With `mark`,
    the marker is left first (the command's exec never answered: it may start later)."""
    if mode == "int":
        argv = interrupt_script([tag])
    else:
        argv = kill_script([tag], ticks=grace_ticks(grace_s) if mode == "term" else 0)
    if not mark:
        return argv
    return ["sh", "-c", MARK, MARK_NAME, state_dir, marker_path(state_dir, tag), *argv]
