"""The check a provider's shell runs before a command: its working directory and program.

A remote provider (and Docker, and the bubblewrap jail) reports a missing `cwd` or a
missing program in its own way: an exit status of 1, 126 or 127 with some text in the
output, an API error, or nothing at all. The backends that run commands through a shell
put `CHECK_SCRIPT` in front of the command instead, so every backend raises the same
errors (`WorkdirError`, `CommandNotFoundError`) before the command runs:

    sh -c CHECK_SCRIPT sandbox-check TOKEN MODE CWD PROGRAM ARGV...

It changes to CWD (when not empty) and, for `shell=False`, looks PROGRAM up the way
`execvp` does (a name with a slash is a path, else each PATH entry), then execs ARGV.
When a check fails it prints a marker `\\x1eF<TOKEN>:<kind>\\x1e` and exits with
`CHECK_FAILED_EXIT`; MODE says where the marker goes:

- `2` (one-shot `exec`): on stderr, where `ExecCapture.result` looks for it (only when
  the exit status is `CHECK_FAILED_EXIT`), so a command that passes costs nothing;
- `1` (processes): on stdout, and a passed check prints the start marker
  `\\x1eS<TOKEN>\\x1e` there before the exec. The backend filters stdout through a
  `ShellTrap` with the same token (which strips both markers) and `_spawn_process`
  waits for the verdict (`trap.wait_for_verdict`), so `pty_exec_start` raises the error.

The script is added only where it is needed (a `cwd` was given, or `shell=False`): the
default `shell=True` command runs exactly as before. It is written for any POSIX `sh`
(dash, bash, busybox) without single quotes, so it can be typed into a terminal inside
a quoted shell word. Markers are printed from octal escapes: the echo of a typed line
never contains them.

The check and the exec are not atomic: a directory removed between the two gives the
provider's own failure, as before.
"""

from __future__ import annotations

import secrets
import shlex
from collections.abc import Sequence

from ...errors import CommandNotFoundError, SandboxError, WorkdirError
from ...process_entry import CommandSpec

# An exit status no shell gives for its own reasons (126/127) and rarely used by tools.
CHECK_FAILED_EXIT = 213
# How long a process start waits for the check's verdict before giving up on it (the
# process then starts as usual: its first window shows whatever happens).
VERDICT_WAIT_S = 30.0

CHECK_SCRIPT = (
    "t=$1 o=$2 d=$3 p=$4; shift 4; "
    'x() { printf "\\036F%s:%s\\036" "$t" "$1" >&"$o"; exit ' + str(CHECK_FAILED_EXIT) + "; }; "
    'if [ -n "$d" ]; then [ -e "$d" ] || x nocwd; [ -d "$d" ] || x notdir; '
    'CDPATH= cd -- "$d" >/dev/null 2>&1 || x noaccess; fi; '
    'case $p in "") ;; '
    '*/*) [ -e "$p" ] || x noprog; { [ -f "$p" ] && [ -x "$p" ]; } || x noexec ;; '
    "*) r=; IFS=:; set -f; for y in ${PATH-/bin:/usr/bin}; do "
    '[ -f "${y:-.}/$p" ] && [ -x "${y:-.}/$p" ] && { r=1; break; }; done; '
    'unset IFS; set +f; [ -n "$r" ] || x noprog ;; esac; '
    '[ "$o" = 1 ] && printf "\\036S%s\\036" "$t"; '
    'exec "$@"'
)


class CommandCheck:
    """The check for one command: how to wrap it, and the error a failure means.

    `cwd` is the directory as the backend resolves it (absolute, or relative to where
    the provider starts commands), None for no directory check; the errors name the
    `cwd` and program the caller gave.
    """

    def __init__(self, spec: CommandSpec, *, cwd: str | None, token: str | None = None) -> None:
        self.spec = spec
        self.cwd = cwd if spec.cwd is not None else None
        # The directory named in errors: the caller's, else the default one that failed.
        self._shown_cwd = spec.cwd if spec.cwd is not None else (cwd or "")
        self.program = None if spec.shell else spec.argv[0]
        self.token = token or secrets.token_hex(8)
        # How a failure marker begins (a streamed exec holds back what may be one).
        self.failure_prefix = b"\x1eF" + self.token.encode() + b":"

    @classmethod
    def needed(
        cls, spec: CommandSpec, *, cwd: str | None, token: str | None = None
    ) -> CommandCheck | None:
        """A check when `spec` needs one (it has a `cwd`, or runs without a shell)."""
        if spec.cwd is None and spec.shell:
            return None
        return cls(spec, cwd=cwd, token=token)

    def argv(self, argv: Sequence[str], *, announce: bool) -> list[str]:
        """`argv` behind the check: `announce` for a process (markers on stdout, start
        marker on success), else for a one-shot `exec` (failure marker on stderr)."""
        mode = "1" if announce else "2"
        return [
            "sh", "-c", CHECK_SCRIPT, "sandbox-check", self.token, mode,
            self.cwd or "", self.program or "", *argv,
        ]  # fmt: skip

    def shell(self, argv: Sequence[str], *, announce: bool) -> str:
        """The same as one shell command line (it execs, so it adds no process)."""
        return "exec " + shlex.join(self.argv(argv, announce=announce))

    def failure_in(self, start: bytes) -> SandboxError | None:
        """The error for a failure marker in the first bytes of a one-shot's stream.

        Searched, not only matched at the start: a provider's login shell may print
        something first. The token makes a command's own output unable to fake it.
        """
        at = start.find(self.failure_prefix)
        if at < 0:
            return None
        begin = at + len(self.failure_prefix)
        end = start.find(b"\x1e", begin)
        if end < 0:
            return None
        return self.error(start[begin:end].decode("ascii", "replace"))

    def error(self, kind: str) -> SandboxError:
        """The error for a failure of `kind` (as the script reports it)."""
        return start_error(kind, self._shown_cwd, self.program or "")


def start_error(kind: str, cwd: str, program: str) -> SandboxError:
    """The error for a start that failed before the command ran, the same words on every
    backend: `kind` is "nocwd", "notdir", "noaccess" (the working directory `cwd`),
    "noexec" or "noprog" (the program `program`)."""
    if kind == "nocwd":
        return WorkdirError(f"the working directory (cwd) {cwd!r} does not exist", cwd=cwd)
    if kind == "notdir":
        return WorkdirError(f"the working directory (cwd) {cwd!r} is not a directory", cwd=cwd)
    if kind == "noaccess":
        return WorkdirError(
            f"the working directory (cwd) {cwd!r} cannot be entered (permission denied)",
            cwd=cwd,
        )
    if kind == "noexec":
        return CommandNotFoundError(
            f"the program {program!r} is not an executable file", program=program
        )
    if kind == "noprog":
        where = "does not exist" if "/" in program else "was not found in PATH"
        return CommandNotFoundError(f"the program {program!r} {where}", program=program)
    return SandboxError(f"the command could not be started (check failed: {kind})")
