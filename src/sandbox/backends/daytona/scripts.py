"""The `sh` scripts that run beside a Daytona command, and why they are not the toolkit's.

The toolkit's wrapper and kill script (`sandbox.backends.toolkit.shell`) find a tree by
a tag in the environment. Daytona's process model defeats that in two ways, so this
backend keeps its pid files:

- a session command is started by the daemon's session shell (`execute_session_command`
  answers once it is queued there) and a terminal command is typed into an interactive
  shell: the tag would reach /proc only after a few execs, and `SessionExecuteRequest`
  has no environment to put it in earlier. A terminate right after the start (a
  cancelled start, the close) would find nothing and leave the command running. The
  pid file closes that window: the kill script waits for it (`PIDFILE_WAIT_S`);
- neither shell is a session leader of its own, which the toolkit's wrapper needs for
  its sweep: the command runs under `setsid` (pipes) or is exec'd by the terminal's
  shell (which leads the terminal's session), and records "<pid> <start time>" before
  it execs; interrupt and terminate signal that group, session and descendants from a
  second, short `process.exec`, and the start time keeps a reused pid from being hit.

Exit statuses still go through the toolkit's `normalize_exit`, errors through its HTTP
policy. `duplicates --min-lines 6` finds no run of these lines in another backend.
Every function here builds text; nothing runs.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping

# How long a kill/interrupt script waits for a just-started command's pid file.
PIDFILE_WAIT_S = 0.5


def _q(text: str) -> str:
    return shlex.quote(text)


# The pid files hold "<pid> <start time>": the pid of the process that leads the
# command's session and process group, and its start time (field 22 of /proc/<pid>/stat)
# so that a pid reused by an unrelated process is never signalled.
_RECORD_SELF = (
    "s=; l=; read -r l </proc/$$/stat 2>/dev/null && { r=${l##*) }; set -- $r; s=${20}; }; "
)

# Shell functions for the kill and interrupt scripts (POSIX sh: dash, bash, busybox).
# `st PID` prints a live process's start time; `desc PID` prints PID and every live
# descendant (found through the parent pids in /proc, so children that left the group
# or session with setsid are found while their parent lives).
_FUNCTIONS = (
    "st() { _l=; read -r _l </proc/$1/stat 2>/dev/null || return 0; "
    '_r=${_l##*) }; set -- $_r; echo "${20}"; }; '
    "desc() { _root=$1; _pairs=; for _s in /proc/[0-9]*/stat; do "
    'read -r _l <"$_s" 2>/dev/null || continue; _r=${_l##*) }; set -- $_r; '
    '_q=${_s#/proc/}; _pairs="$_pairs ${_q%/stat}:$2"; done; '
    '_t=" $_root "; _c=1; while [ $_c = 1 ]; do _c=0; for _x in $_pairs; do '
    'case $_t in *" ${_x#*:} "*) case $_t in *" ${_x%:*} "*) ;; '
    '*) _t="$_t${_x%:*} "; _c=1;; esac;; esac; done; done; echo $_t; }; '
)


def _read_pidfile_script() -> str:
    """Read "$f" into $p (pid) and $s (start time), or stop: never signal group 0 or 1
    (that would be every process we may signal), nor a pid now used by another process.
    Sets $mine=1 when $p is alive and is ours, 0 when it has exited (its group and
    session may live on: their ids cannot be reused while they have members)."""
    return (
        'p=; s=; read -r p s <"$f" 2>/dev/null; '
        "case $p in ''|*[!0-9]*) echo none; exit 0;; esac; "
        '[ "$p" -gt 1 ] || { echo none; exit 0; }; '
        "now=$(st $p); mine=0; "
        'if [ -n "$now" ]; then '
        'if [ -n "$s" ] && [ "$now" != "$s" ]; then rm -f "$f"; echo none; exit 0; fi; '
        "mine=1; fi; "
    )


def _wait_pidfile_script(wait_s: float) -> str:
    steps = max(0, round(wait_s / 0.05))
    if not steps:
        return ""
    return f'i=0; while [ ! -s "$f" ] && [ $i -lt {steps} ]; do sleep 0.05; i=$((i+1)); done; '


def interrupt_script(pidfile: str, *, wait_s: float) -> str:
    """`sh -c` text: SIGINT to the process group recorded in `pidfile` (waiting up to
    `wait_s` for a just-started command to write it). Prints `done` or `none`."""
    body = (
        f"f={_q(pidfile)}; "
        + _FUNCTIONS
        + _wait_pidfile_script(wait_s)
        + _read_pidfile_script()
        + '[ "$mine" = 1 ] || { echo none; exit 0; }; '
        + "kill -INT -$p 2>/dev/null || kill -INT $p 2>/dev/null; echo done"
    )
    return f"sh -c {_q(body)}"


def kill_script(pidfile: str, *, wait_s: float, grace_s: float) -> str:
    """`sh -c` text: stop the process tree recorded in `pidfile`: its process group, its
    session and its descendants get SIGHUP/SIGTERM/SIGCONT, up to `grace_s` to go, then
    SIGKILL; the file is removed. Prints `done`, or `none` when there was nothing of
    ours to signal."""
    steps = max(0, round(grace_s / 0.05))
    polite = (
        "if alive; then sig HUP; sig TERM; sig CONT; "
        '[ -n "$d" ] && kill -TERM $d 2>/dev/null; i=0; '
        f"while alive && [ $i -lt {steps} ]; do sleep 0.05; i=$((i+1)); done; fi; "
    )
    body = (
        f"f={_q(pidfile)}; "
        + _FUNCTIONS
        + _wait_pidfile_script(wait_s)
        + _read_pidfile_script()
        + 'sig() { kill -$1 -$p 2>/dev/null; [ "$mine" = 1 ] && kill -$1 $p 2>/dev/null; '
        + "return 0; }; "
        + 'alive() { kill -0 -$p 2>/dev/null || { [ "$mine" = 1 ] && kill -0 $p 2>/dev/null; }; }; '
        + 'd=; [ "$mine" = 1 ] && d=$(desc $p); '
        + (polite if steps else "")
        + '[ "$mine" = 1 ] && d="$d $(desc $p)"; '
        + 'sig KILL; [ -n "$d" ] && kill -KILL $d 2>/dev/null; '
        + "if command -v pkill >/dev/null 2>&1; then pkill -KILL -s $p 2>/dev/null; fi; "
        + 'rm -f "$f"; echo done'
    )
    return f"sh -c {_q(body)}"


def piped_command(command: str, *, pidfile: str, cwd: str, env: Mapping[str, str]) -> str:
    """The session command for a pipe process: `command` with stdin from /dev/null, in
    its own session and process group whose id goes to `pidfile`; when it ends, what is
    left of its group is killed (as the local backend does) and its exit status (128+N
    for a signal) is the session command's."""
    leader = "f=$1; c=$2; " + _RECORD_SELF + 'printf "%s %s" "$$" "$s" >"$f"; exec sh -c "$c"'
    env_prefix = ""
    if env:
        env_prefix = "env " + " ".join(_q(f"{k}={v}") for k, v in env.items()) + " "
    launch = f'{env_prefix}sh -c {_q(leader)} sh "$f" {_q(command)} </dev/null 2>&3 3>&-'
    body = (
        # The waiting shell reports a child killed by a signal ("Killed") on its stderr,
        # which is /dev/null here; the command keeps the real stderr (fd 3). Its
        # redirections live inside a subshell that execs it, so the report cannot use
        # them.
        "exec 3>&2 2>/dev/null; "
        f"cd {_q(cwd)} 2>&3 || exit 1; f={_q(pidfile)}; "
        "if command -v setsid >/dev/null 2>&1; "
        f"then (exec setsid {launch}); else (exec {launch}); fi; "
        # The leader was reaped above: while members of its group live, the group id
        # cannot be reused, so this kills only what the command left behind.
        's=$?; p=; read -r p x <"$f" 2>/dev/null; '
        "case $p in ''|*[!0-9]*) ;; *) [ \"$p\" -gt 1 ] && kill -KILL -$p 2>/dev/null;; esac; "
        'rm -f "$f"; exit $s'
    )
    return f"sh -c {_q(body)}"


def pty_inner_command(command: str, *, pidfile: str, cwd: str, script: str | None = None) -> str:
    """What the PTY's shell execs (through `ShellTrap`): record its pid (the terminal's
    session and process group id) and start time, change directory, exec the command."""
    parts = []
    if script is not None:
        parts.append(f"rm -f {_q(script)}")
    parts.append(_RECORD_SELF + f'printf "%s %s" "$$" "$s" >{_q(pidfile)} 2>/dev/null')
    parts.append(f"cd {_q(cwd)} || exit 1")
    parts.append(f"exec sh -c {_q(command)}")
    return "; ".join(parts)
