"""The POSIX `sh` snippets a remote backend runs beside a command, generated in one place.

A provider that hands us an exec (or a shell) but no way to kill a process tree gets it
from two scripts, both plain POSIX sh (checked against dash, bash, busybox ash, zsh and
mksh, each run as `sh`):

- the wrapper (`wrapper_argv`) is the exec's first process. It carries a random tag in
  its environment (its children inherit it), survives Ctrl-C itself (`trap : INT QUIT`,
  a caught trap the command does not inherit), runs the command in a subshell that
  execs it, so a death by signal N comes back as 128+N, and exits with that status.
  Its own stderr is /dev/null while it waits: a shell reports a child killed by a
  signal ("Killed", "Terminated") on the stderr in force for that command, so only the
  subshell gets the real stderr (fd 3). When the command exits it kills what is left of
  its session (background children), which would otherwise hold the output open.
- the kill script (`kill_script`, `interrupt_script`) runs as a second, short exec. It
  finds the tree through /proc: every process carrying one of the tags, every process
  in a session led by a tagged process (that catches children that scrubbed their
  environment), and every descendant of those (that catches a scrubbed child that also
  left the session, while its parent lives). An interrupt sends SIGINT to the process
  group of each root (a tagged process whose parent is neither tagged nor init: the
  wrapper). A terminate sends SIGHUP, SIGTERM and SIGCONT, rescans every `KILL_TICK_S`
  for up to the grace ticks, then SIGKILL until nothing is left. Several tags may be
  given, so kills requested together cost one exec. It prints one report line,
  `sandbox-kill:<what>`, read back with `parse_kill_report`.

The wrapper must start as a session leader (Docker makes each exec one; a local test
uses `start_new_session`): sessions are how leftovers are found. A session whose leader
is neither tagged nor gone is never swept, so the provider's own daemon is never hit.

The image needs `sh`, `grep` with `-z` (busybox's has it), `kill` and `sleep`
(fractional sleeps are optional); `stty` when a terminal size is given. Every function
here is pure: it builds argv lists and parses text, it runs nothing.
"""

from __future__ import annotations

import math
import re
import secrets
import shlex
from collections.abc import Iterable, Sequence
from typing import Any

TAG_VARIABLE = "SANDBOX_PROCESS_TAG"
WRAPPER_NAME = "sandbox-exec"
KILL_NAME = "sandbox-kill"
KILL_REPORT_PREFIX = "sandbox-kill:"
# The kill script's rescan period during the grace (its `nap 0.05`).
KILL_TICK_S = 0.05
_TAG_RE = re.compile(r"[A-Za-z0-9]{8,64}")

# `sh -c WRAPPER_SCRIPT sandbox-exec ROWS COLS ARGV...` (ROWS COLS are "-" without a
# terminal). See the module docstring.
WRAPPER_SCRIPT = (
    "trap : INT QUIT; exec 3>&2 2>/dev/null; "
    '[ "$1" = - ] || stty rows "$1" cols "$2"; shift 2; (exec "$@" 2>&3 3>&-); '
    "s=$?; l=; for d in /proc/[0-9]*; do p=${d#/proc/}; [ $p = $$ ] && continue; "
    '{ read -r t <$d/stat; } 2>/dev/null || continue; set -- ${t##*") "}; '
    '[ "$4" = $$ ] && [ "$1" != Z ] && l="$l $p"; done; '
    '[ -n "$l" ] && for g in HUP TERM CONT KILL; do kill -s $g $l 2>/dev/null; done; exit $s'
)

# `sh -c KILL_SCRIPT sandbox-kill MODE TICKS TAG...`, MODE `int` or `term`. /proc/PID/stat
# after the command name ("...) ") holds: $1 state, $2 ppid, $3 pgrp, $4 session.
# `grep -z` reads /proc/PID/environ, NUL-separated as it is. A group is signalled as
# `kill -INT -PGID`: the one spelling dash, mksh, bash, zsh and busybox all take (dash
# and mksh refuse `-s INT -PGID`, busybox refuses `--`).
KILL_SCRIPT = r"""
mode=$1; ticks=$2; shift 2; pats=""; me=$$
for t in "$@"; do pats="$pats -e TAG_VARIABLE=$t"; done
has() { case "$1" in *" $2 "*) return 0 ;; esac; return 1; }
scan() {
  tagged=" "; roots=""; sids=" "; targets=" "; procs=""
  for f in $(grep -l -z -x -F $pats /proc/[0-9]*/environ 2>/dev/null); do
    p=${f#/proc/}; p=${p%/environ}
    [ "$p" = "$me" ] || tagged="$tagged$p "
  done
  for d in /proc/[0-9]*; do
    p=${d#/proc/}
    [ "$p" = "$me" ] && continue
    { read -r st <"$d/stat"; } 2>/dev/null || continue
    set -- ${st##*") "}
    [ "$1" = Z ] && continue
    procs="$procs $p:$2:$4"
    has "$tagged" "$p" || continue
    has "$tagged" "$2" || [ "$2" = 1 ] || roots="$roots $p"
    case "$4" in 0|1|"$me") continue ;; esac
    if has "$tagged" "$4" || [ ! -d "/proc/$4" ]; then
      has "$sids" "$4" || sids="$sids$4 "
    fi
  done
  for x in $procs; do
    p=${x%%:*}; s=${x##*:}
    [ "$p" = 1 ] && continue
    if has "$tagged" "$p" || has "$sids" "$s"; then targets="$targets$p "; fi
  done
  grew=1
  while [ $grew = 1 ]; do
    grew=0
    for x in $procs; do
      p=${x%%:*}; q=${x#*:}; q=${q%%:*}
      has "$targets" "$p" && continue
      has "$targets" "$q" && { targets="$targets$p "; grew=1; }
    done
  done
  targets=${targets# }
}
nap() { sleep "$1" 2>/dev/null || sleep 1; }
scan
if [ "$mode" = int ]; then
  for r in $roots; do kill -INT "-$r" 2>/dev/null || kill -INT "$r" 2>/dev/null; done
  echo "sandbox-kill:${roots:-none}"
  exit 0
fi
if [ -n "$targets" ] && [ "$ticks" -gt 0 ]; then
  for s in HUP TERM CONT; do kill -s $s $targets 2>/dev/null; done
  i=0
  while [ "$i" -lt "$ticks" ]; do
    nap 0.05; scan; [ -z "$targets" ] && break; i=$((i + 1))
  done
fi
n=0
while [ -n "$targets" ] && [ "$n" -lt 100 ]; do
  kill -s KILL $targets 2>/dev/null; nap 0.01; scan; n=$((n + 1))
done
echo "sandbox-kill:${targets:-done}"
""".replace("TAG_VARIABLE", TAG_VARIABLE)


def new_tag() -> str:
    """A fresh random tag for one command (32 hex digits)."""
    return secrets.token_hex(16)


def check_tag(tag: str) -> str:
    """`tag` if it is safe in the scripts (8 to 64 letters or digits), else ValueError:
    the kill script splices tags into a `grep` pattern list unquoted."""
    if not isinstance(tag, str) or not _TAG_RE.fullmatch(tag):
        raise ValueError(f"a process tag is 8 to 64 letters or digits, got {tag!r}")
    return tag


def running_tags(processes: Iterable[Any]) -> list[str]:
    """The toolkit tags of the running processes in a ref's `processes` (each with
    `.running` and `.handle`) that the kill script accepts. A ref is caller data: a tag
    that is missing or not one `check_tag` passes is left out, never pasted into a
    script."""
    tags = []
    for process in processes:
        tag = process.handle.get("tag") if process.running else None
        if isinstance(tag, str) and _TAG_RE.fullmatch(tag):
            tags.append(tag)
    return tags


def tag_environment(tag: str) -> dict[str, str]:
    """The environment entry that tags a process, for providers that set an exec's
    environment themselves (then pass `set_tag=False` to `wrapper_argv`)."""
    return {TAG_VARIABLE: check_tag(tag)}


def wrapper_argv(
    tag: str,
    argv: Sequence[str],
    *,
    rows: int | None = None,
    cols: int | None = None,
    set_tag: bool = True,
) -> list[str]:
    """The argv that runs `argv` under the wrapper (see the module docstring).

    `rows`/`cols` (both or neither) set the initial size of a terminal with `stty`.
    With `set_tag` the argv starts with `env TAG_VARIABLE=tag`, so the wrapper's own
    environment carries the tag; pass `set_tag=False` when the exec's environment gets
    `tag_environment(tag)` from the provider (one program fewer in the image).
    """
    check_tag(tag)
    if not argv:
        raise ValueError("the wrapped command needs at least one argument")
    if (rows is None) != (cols is None):
        raise ValueError("give both rows and cols, or neither")
    size = ["-", "-"] if rows is None else [str(int(rows)), str(int(cols or 0))]
    head = ["env", f"{TAG_VARIABLE}={tag}"] if set_tag else []
    return [*head, "sh", "-c", WRAPPER_SCRIPT, WRAPPER_NAME, *size, *argv]


def grace_ticks(grace_s: float) -> int:
    """How many `KILL_TICK_S` rescans cover a grace of `grace_s` seconds (0: SIGKILL at
    once)."""
    return max(0, math.ceil(grace_s / KILL_TICK_S))


def kill_script(tags: Iterable[str], *, ticks: int) -> list[str]:
    """The argv that terminates every tree tagged with one of `tags`: SIGHUP, SIGTERM,
    SIGCONT, up to `ticks` rescans (see `grace_ticks`) for the tree to go, then SIGKILL
    until nothing is left. Reports `done` (or the pids it could not kill)."""
    return _script("term", tags, ticks)


def interrupt_script(tags: Iterable[str]) -> list[str]:
    """The argv that sends SIGINT to the process group of each tagged tree's root (what
    Ctrl-C does to a command without a terminal). Reports the roots, or `none`."""
    return _script("int", tags, 0)


def _script(mode: str, tags: Iterable[str], ticks: int) -> list[str]:
    checked = [check_tag(tag) for tag in tags]
    if not checked:
        raise ValueError("the kill script needs at least one tag")
    if isinstance(ticks, bool) or not isinstance(ticks, int) or ticks < 0:
        raise ValueError(f"ticks must be an int >= 0, got {ticks!r}")
    return ["sh", "-c", KILL_SCRIPT, KILL_NAME, mode, str(ticks), *checked]


def command_line(argv: Sequence[str]) -> str:
    """One shell-quoted line for `argv`, for providers that take a command string."""
    return shlex.join(argv)


def parse_kill_report(output: str) -> str | None:
    """What the kill script reported (`done`, `none`, or pids), or None when its report
    line is missing (the script did not run to its end)."""
    if KILL_REPORT_PREFIX not in output:
        return None
    return output.rsplit(KILL_REPORT_PREFIX, 1)[1].strip()
