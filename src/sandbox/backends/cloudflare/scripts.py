"""The `sh` snippets the `cloudflare` backend runs in the sandbox beside the toolkit's.

One-shot commands use the toolkit's wrapper and kill script (see `execs`). A terminal
cannot: its shell is the bridge's (pty.ts starts it; we choose neither its argv nor its
environment), so no tagged process leads the terminal's session and the toolkit's scan
would find only the typed command's tagged children, not what scrubbed its environment
in the shell's session. The shell prints its pid first instead (`PID_MARKER`), and a
terminate kills the session that pid leads (`KILL_SESSION`).
"""

from __future__ import annotations

# What prints the PTY shell's pid before the trap's line (`%s` is the trap's token),
# and the pattern that finds it in the output.
PID_PRINTF = "printf '\\036P%s:%d\\036' {token} $$; "
PID_MARKER = b"\x1eP%s:(\\d{1,10})\x1e"
MAX_PID_SCAN = 64 * 1024

# Kills the session (and process group) led by pid $1: the PTY shell and whatever it
# started, even in a group of its own. /proc/PID/stat after "...) " holds the state,
# ppid, pgrp and session: with "$1" in front, the session is $5.
KILL_SESSION = (
    "exec 2>/dev/null; "
    'kill -KILL -- "-$1" 2>/dev/null; for d in /proc/[0-9]*; do '
    'st=$(cat "$d/stat" 2>/dev/null) || continue; st=${st##*) }; set -- "$1" $st; '
    '[ "$5" = "$1" ] && kill -KILL "${d#/proc/}" 2>/dev/null; done; true'
)

# What a path names, relative to the exec's cwd (/workspace): "<%F>|<size>".
STAT = (
    'if [ -e "$1" ]; then stat -L -c "%F|%s" -- "$1"; '
    'elif [ -L "$1" ]; then echo "symlink|"; else echo "none|"; fi'
)


def kill_session_argv(shell_pid: int) -> list[str]:
    """The control exec that SIGKILLs the session led by `shell_pid`."""
    return ["sh", "-c", KILL_SESSION, "sh", str(int(shell_pid))]


def stat_argv(relative: str) -> list[str]:
    """The control exec that says what `relative` (to /workspace) names."""
    return ["sh", "-c", STAT, "sh", "./" + relative]


# Writes (or, as "append", adds to) the file $1 from the strings after it, private to
# the user: a typed line too long for a terminal goes there (`terminal.typed_line`).
WRITE_SCRIPT = 'f=$1; shift; umask 077; printf %s "$@" > "$f"'
APPEND_SCRIPT = 'f=$1; shift; printf %s "$@" >> "$f"'


def script_path(token: str) -> str:
    """Where the line of the trap with `token` is written when it is too long to type."""
    return f"/tmp/.sandbox-pty-{token}"


def write_script_argv(path: str, parts: list[str], *, append: bool) -> list[str]:
    """The control exec that writes `parts` (joined) to `path`, or appends them."""
    return ["sh", "-c", APPEND_SCRIPT if append else WRITE_SCRIPT, "sh", path, *parts]
