"""The `sh` snippets the `kubernetes` backend runs in a container beside the toolkit's.

pods/exec takes only an argv: no environment, no working directory (kubelet
`pkg/kubelet/cri/streaming/remotecommand`; the CRI `ExecRequest` has `cmd`, `tty`,
`stdin`, `stdout`, `stderr` only). So every exec starts with `PRELUDE`, which needs only
a shell: it changes to a directory when one is given, exports the variables, then
`exec`s the rest. The files' scripts need a shell and `cat` (and `mkdir` for a missing
folder, `head` for a write over a v4 stream, which cannot close stdin).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

PRELUDE_NAME = "sandbox-env"
# `sh -c PRELUDE sandbox-env DIR NAME=VALUE... -- ARGV...`; DIR is "-" for none.
PRELUDE = (
    '[ "$1" = - ] || cd "$1" || exit 126; shift; '
    'while [ "$#" -gt 0 ] && [ "$1" != -- ]; do export "$1"; shift; done; shift; exec "$@"'
)

# The pod's only container stays up on a shell alone: `stdin: true` in its spec gives
# it a pipe nobody writes to, so `read` blocks; SIGTERM (the deletion) ends it at once
# instead of after the whole grace period. If stdin ever ends, `read` fails and the
# loop would spin: it falls back to a sleep.
KEEPALIVE = [
    "sh",
    "-c",
    "trap 'exit 0' TERM INT; while :; do read -r _ || exec sleep 2147483647; done",
]

# Exit codes of the file scripts (what the path is), beside 0 and the shell's own.
NOT_FOUND = 20
IS_DIRECTORY = 21
NOT_REGULAR = 22
UNDER_A_FILE = 23
NO_FOLDER = 24

# `sh -c READ_SCRIPT sandbox-read PATH`: refuse what is not a regular file without
# opening it (a FIFO would block), then stream it.
READ_SCRIPT = (
    'f=$1; if [ -d "$f" ]; then exit 21; fi; '
    'if [ ! -e "$f" ]; then exit 20; fi; '
    'if [ ! -f "$f" ]; then exit 22; fi; '
    'exec cat -- "$f"'
)

# `sh -c WRITE_SCRIPT sandbox-write PATH SIZE`: SIZE is "-" to copy stdin to its end
# (v5 can close stdin), else the byte count `head -c` copies (v4 cannot).
WRITE_SCRIPT = (
    "f=$1; n=$2; case $f in */*) d=${f%/*} ;; *) d=. ;; esac; "
    'if [ -d "$f" ]; then exit 21; fi; '
    'if [ -e "$f" ] && [ ! -f "$f" ]; then exit 22; fi; '
    'if [ ! -d "$d" ]; then p=; o=$IFS; IFS=/; for c in $d; do IFS=$o; '
    'p=${p:+$p/}$c; [ -n "$c" ] || continue; '
    'if [ -e "$p" ] && [ ! -d "$p" ]; then exit 23; fi; done; IFS=$o; '
    'mkdir -p -- "$d" 2>/dev/null || exit 24; fi; '
    'if [ "$n" = - ]; then exec cat > "$f"; fi; exec head -c "$n" > "$f"'
)


def prelude_argv(
    argv: Sequence[str], *, env: Mapping[str, str] | None = None, cwd: str | None = None
) -> list[str]:
    """`argv` run after changing to `cwd` (when given) with `env` exported."""
    assigns = [f"{name}={value}" for name, value in (env or {}).items()]
    return ["sh", "-c", PRELUDE, PRELUDE_NAME, cwd or "-", *assigns, "--", *argv]


def read_argv(relative: str) -> list[str]:
    """The exec that streams the regular file `relative` (to the working directory)."""
    return ["sh", "-c", READ_SCRIPT, "sandbox-read", "./" + relative]


def write_argv(relative: str, size: int | None) -> list[str]:
    """The exec that writes stdin to `relative`: to its end (`size` None), or `size`
    bytes of it."""
    return [
        "sh",
        "-c",
        WRITE_SCRIPT,
        "sandbox-write",
        "./" + relative,
        str(size) if size is not None else "-",
    ]
