"""Running one command through a provider's interactive shell without losing its exit.

Several providers hand a PTY to an interactive shell rather than to our command (see
docs/providers.md). `ShellTrap` builds the line to type into that shell and filters
what comes back:

- everything before a start marker (prompt, banner, the echo of the typed line) is
  dropped, so nothing we typed shows up in the output;
- in `exec` mode the command replaces the shell, so the provider's own exit report is
  the command's exit status;
- in `report` mode (providers that only close the socket) the status is printed in-band
  after the command as an end marker, parsed here and stripped from the output.

The markers are written by `printf` from octal escapes, so the echo of the typed line
never contains them literally. Markers split across chunks are handled.

Whatever the caller passed (env values, `cwd`, argv) is data, and a line editor or a
terminal's line discipline acts even inside quotes (Ctrl-U erases, Ctrl-C interrupts,
Ctrl-V quotes the next key, CR ends the line, and bytes past ASCII become meta keys in
a C locale). So a line holding anything but printable ASCII is never typed as it is:
`keystroke_safe` types `eval "$(printf '...')"` instead, every such byte an octal
escape that the shell's `printf` turns back into the exact bytes.

A command run behind the shared `CommandCheck` (`sandbox.backends.toolkit.check`, in its announce
mode, with this trap's token) prints the start marker itself once its working directory
and program check out (`line(..., announced=True)`), or a failure marker instead: the
trap then records the failure's kind in `failure` and ends. `decided` is set as soon as
either marker was seen. A trap with the same token also serves as the plain filter of a
checked command's stdout on backends that run no interactive shell.
"""

from __future__ import annotations

import asyncio
import re
import secrets
import shlex
from typing import TYPE_CHECKING

from .check import CHECK_FAILED_EXIT, VERDICT_WAIT_S, CommandCheck

if TYPE_CHECKING:
    from ...process_entry import OutputSink

_RS = b"\x1e"
# Typed as they are: printable ASCII. Inside the printf format only these stay literal
# (no quote, `%`, backslash, `!` for bash's history expansion, or `$`); the rest become
# three-digit octal escapes, which every POSIX printf reads the same way.
_PRINTABLE = re.compile(r"[ -~]*")
_LITERAL = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789 ,._+:@/=")


def keystroke_safe(line: str) -> str:
    """`line` (one shell line, optionally ending in the newline that submits it) in a
    form that only printable ASCII keys type: itself when it is already so, else an
    `eval` of the exact bytes rebuilt by `printf` inside the shell."""
    body, end = (line[:-1], "\n") if line.endswith("\n") else (line, "")
    if _PRINTABLE.fullmatch(body):
        return line
    escaped = "".join(
        chr(byte) if byte in _LITERAL else f"\\{byte:03o}" for byte in body.encode("utf-8")
    )
    return f"eval \"$(printf '{escaped}')\"{end}"


_MAX_KIND = 16


class ShellTrap:
    """One command's wrapper line and the filter for its terminal output."""

    def __init__(self, *, report_exit: bool, token: str | None = None) -> None:
        self.report_exit = report_exit
        self.token = token or secrets.token_hex(8)
        self._start = _RS + b"S" + self.token.encode() + _RS
        self._end_prefix = _RS + b"E" + self.token.encode() + b":"
        self._end_re = re.compile(re.escape(self._end_prefix) + rb"(\d{1,3})" + re.escape(_RS))
        fail_prefix = _RS + b"F" + self.token.encode() + b":"
        self._fail_re = re.compile(
            re.escape(fail_prefix) + rb"([a-z]{1,%d})" % _MAX_KIND + re.escape(_RS)
        )
        # Bytes held back before the start: enough for a split start or failure marker.
        self._hold = max(len(self._start), len(fail_prefix) + _MAX_KIND + 1) - 1
        self._pending = b""
        self.started = False
        self.done = False
        self.exit_code: int | None = None
        self.failure: str | None = None
        self.decided = asyncio.Event()

    def line(
        self,
        command: str,
        *,
        tty: bool = True,
        cwd: str | None = None,
        isolate: bool = False,
        announced: bool = False,
        linger: str | None = None,
    ) -> str:
        """The line to type into the shell to run `command` (a POSIX shell string).

        `announced=True`: `command` prints this trap's start marker itself (it runs
        behind a `CommandCheck` in announce mode with this token), so the line does not.

        With `tty=False` terminal echo and output processing are turned off and stdin
        is /dev/null, so the process behaves as if it ran on pipes.

        `isolate=True` (report mode only) hands the rest of the line to a non-interactive
        `sh` that replaces the interactive shell, because an interactive shell abandons
        the rest of a line whose command died of SIGINT: Ctrl-C would lose the end marker
        and leave the shell at its prompt. The wrapper survives Ctrl-C (the command does
        not), discards the shell's own "Killed"/"Terminated" notices, and with
        `tty=False` gives the command real pipes (stdout and stderr merged in arrival
        order, so `isatty()` is false and nothing pages) instead of the terminal.

        `linger` (isolated lines only): a shell step run after the end marker, before
        the wrapper exits (a provider that forgets a session once its shell exits can
        then be read again: see the blaxel backend).
        """
        if cwd:
            # Inside the command, after the start marker: a bad cwd shows its error in
            # the output and ends the process with status 1, instead of a silent exit.
            command = f"cd {shlex.quote(cwd)} || exit 1\n{command}"
            cwd = None
        if isolate and self.report_exit:
            return self._isolated_line(
                command, tty=tty, cwd=cwd, announced=announced, linger=linger
            )
        parts = []
        if not tty:
            parts.append("stty -echo -opost 2>/dev/null")
        if cwd:
            parts.append(f"cd {shlex.quote(cwd)} || exit 1")
        if not announced:
            parts.append(f"printf '\\036S%s\\036' {self.token}")
        body = f"sh -c {shlex.quote(command)}"
        if not tty:
            body += " </dev/null"
        if self.report_exit:
            parts.append(body)
            parts.append(f"printf '\\036E%s:%d\\036' {self.token} $?")
            parts.append("exit")
        else:
            parts.append(f"exec {body}")
        return keystroke_safe("; ".join(parts) + "\n")

    def _isolated_line(
        self, command: str, *, tty: bool, cwd: str | None, announced: bool, linger: str | None
    ) -> str:
        start = ":" if announced else f"printf '\\036S%s\\036' {self.token}"
        end = f"printf '\\036E%s:%d\\036' {self.token} $?"
        # Traps that catch a signal are reset in subshells, so the command (run in its
        # own subshell, which execs it) gets the default Ctrl-C and Ctrl-backslash while
        # the shells printing the markers survive them. Redirections stay inside the
        # parentheses: the status notice of a killed command is printed by the waiting
        # shell, whose stderr is /dev/null (the command gets the real stderr as fd 3).
        run = f"sh -c {shlex.quote(command)}"
        if tty:
            steps = [start, f"(exec {run} 2>&3 3>&-)", end]
        else:
            # The end marker goes through the same pipe as the output, so it can never
            # overtake it; `cat` ignores Ctrl-C so output after an interrupt is kept.
            producer = f"{{ trap : INT QUIT; (exec {run} </dev/null 2>&1 3>&-); {end}; }}"
            steps = [start, f"{producer} | (trap '' INT QUIT; exec cat)"]
        if linger:
            steps.append(linger)
        inner = "; ".join(["trap : INT QUIT", "exec 3>&2 2>/dev/null", *steps])
        parts = []
        if not tty:
            parts.append("stty -echo -opost 2>/dev/null")
        if cwd:
            parts.append(f"cd {shlex.quote(cwd)} || exit 1")
        parts.append(f"exec sh -c {shlex.quote(inner)}")
        return keystroke_safe("; ".join(parts) + "\n")

    def feed(self, data: bytes) -> bytes:
        """Filter a chunk of terminal output; returns the bytes the user should see."""
        if self.done or not data:
            return b""
        data = self._pending + data
        self._pending = b""
        if not self.started:
            at = data.find(self._start)
            failed = self._fail_re.search(data, 0, len(data) if at < 0 else at)
            if failed is not None:
                # The command check failed: the command never ran (see CommandCheck).
                self.failure = failed.group(1).decode("ascii")
                self.done = True
                if self.report_exit:
                    self.exit_code = CHECK_FAILED_EXIT
                self.decided.set()
                return b""
            if at < 0:
                self._pending = data[-self._hold :]
                return b""
            self.started = True
            self.decided.set()
            data = data[at + len(self._start) :]
        if not self.report_exit:
            return data
        match = self._end_re.search(data)
        if match:
            self.exit_code = int(match.group(1))
            self.done = True
            return data[: match.start()]
        hold = self._possible_marker_start(data)
        self._pending = data[hold:]
        return data[:hold]

    def _possible_marker_start(self, data: bytes) -> int:
        """Index from which `data` might be the beginning of an unfinished end marker."""
        at = data.rfind(_RS, max(0, len(data) - len(self._end_prefix) - 5))
        while at >= 0:
            tail = data[at:]
            if self._end_prefix.startswith(tail[: len(self._end_prefix)]) and (
                len(tail) <= len(self._end_prefix) or tail[len(self._end_prefix) :].isdigit()
            ):
                return at
            at = data.rfind(_RS, max(0, len(data) - len(self._end_prefix) - 5), at)
        return len(data)

    def flush(self) -> bytes:
        """At the end of the stream: held-back bytes that turned out not to be a marker."""
        pending, self._pending = self._pending, b""
        return pending if self.started and not self.done else b""


async def wait_for_verdict(
    entry: OutputSink, trap: ShellTrap, check: CommandCheck, *, timeout: float = VERDICT_WAIT_S
) -> None:
    """Wait until `trap` (fed the process's stdout) saw the check's verdict, the process
    ended, or `timeout` passed; raise the check's error if it failed.

    Called at the end of `_spawn_process`, so a failed check fails `pty_exec_start`
    (the base session then tears the process down).
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    decided = asyncio.ensure_future(trap.decided.wait())
    try:
        while not trap.decided.is_set() and not entry.output_done and loop.time() < deadline:
            # The entry wakes this on an exit, EOF or loss (after an exit it waits the
            # short drain grace for the output, where the marker would be).
            changed = asyncio.ensure_future(entry.wait_for_change(deadline, wants_data=False))
            try:
                await asyncio.wait({decided, changed}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                changed.cancel()
    finally:
        decided.cancel()
    if trap.failure is not None:
        raise check.error(trap.failure)
