"""ShellTrap (sandbox.backends.toolkit.trap) against real shells: markers stripped, exit
codes kept, cwd errors shown, the command check's verdict found; keystroke-safe lines."""

from __future__ import annotations

import os
import re
import select
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from sandbox.arguments import build_command
from sandbox.backends import toolkit
from sandbox.backends.toolkit.check import CHECK_FAILED_EXIT, CommandCheck
from sandbox.backends.toolkit.trap import ShellTrap, keystroke_safe
from sandbox.errors import CommandNotFoundError, WorkdirError


def run_line(trap: ShellTrap, line: str, shell: str = "sh") -> tuple[bytes, int]:
    proc = subprocess.run(
        [shell], input=line.encode(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=30
    )
    raw = proc.stdout  # merged in arrival order, as on a terminal
    shown = b"".join(trap.feed(raw[i : i + 3]) for i in range(0, len(raw), 3)) + trap.flush()
    return shown, proc.returncode


@pytest.mark.parametrize("report", [True, False])
@pytest.mark.parametrize(("command", "code"), [("true", 0), ("echo out; exit 3", 3)])
def test_exit_codes_and_output(report: bool, command: str, code: int) -> None:
    trap = ShellTrap(report_exit=report)
    shown, returncode = run_line(trap, trap.line(command, tty=False))
    assert trap.started
    assert (trap.exit_code if report else returncode) == code
    assert shown == (b"out\n" if "echo" in command else b"")


@pytest.mark.parametrize("report", [True, False])
def test_bad_cwd_is_visible(report: bool, tmp_path) -> None:  # type: ignore[no-untyped-def]
    trap = ShellTrap(report_exit=report)
    shown, returncode = run_line(trap, trap.line("pwd", tty=False, cwd=str(tmp_path / "nope")))
    assert (trap.exit_code if report else returncode) == 1
    assert b"nope" in shown
    trap = ShellTrap(report_exit=report)
    shown, _ = run_line(trap, trap.line("pwd", tty=False, cwd=str(tmp_path)))
    assert shown.strip() == str(tmp_path).encode()


def test_markers_split_anywhere_never_leak() -> None:
    trap = ShellTrap(report_exit=True, token="abc")
    stream = b"prompt$ echo\r\n\x1eSabc\x1ehello\x1e\x1eEabc:7\x1etrailing"
    for size in range(1, 8):
        t = ShellTrap(report_exit=True, token="abc")
        out = b"".join(t.feed(stream[i : i + size]) for i in range(0, len(stream), size))
        assert out == b"hello\x1e" and t.exit_code == 7
    assert trap.line("x").count("abc") >= 1


def checked_line(trap: ShellTrap, check: CommandCheck, argv: tuple[str, ...]) -> str:
    """A trap line whose command runs behind `check` (which prints the start marker)."""
    return trap.line(check.shell(argv, announce=True), tty=False, announced=True)


@pytest.mark.parametrize("report", [True, False])
@pytest.mark.parametrize("shell", ["sh", "bash"])
def test_failed_check_is_decided_and_shows_nothing(
    report: bool, shell: str, tmp_path: Path
) -> None:
    (tmp_path / "a-file").touch()
    for cwd, argv, kind in (
        (str(tmp_path / "nope"), ("pwd",), "nocwd"),
        (str(tmp_path / "a-file"), ("pwd",), "notdir"),
        (str(tmp_path), ("no-such-program-5f2a",), "noprog"),
    ):
        spec = build_command(argv, shell=False, env=None, cwd=cwd)
        check = CommandCheck(spec, cwd=cwd)
        trap = ShellTrap(report_exit=report, token=check.token)
        shown, returncode = run_line(trap, checked_line(trap, check, argv), shell)
        assert (trap.failure, trap.decided.is_set(), trap.started) == (kind, True, False)
        assert shown == b""
        assert (trap.exit_code if report else returncode) == CHECK_FAILED_EXIT
        assert isinstance(check.error(kind), WorkdirError | CommandNotFoundError)


@pytest.mark.parametrize("report", [True, False])
def test_passed_check_starts_the_command(report: bool, tmp_path: Path) -> None:
    spec = build_command(("sh", "-c", "pwd; exit 5"), shell=False, env=None, cwd=str(tmp_path))
    check = CommandCheck(spec, cwd=str(tmp_path))
    trap = ShellTrap(report_exit=report, token=check.token)
    shown, returncode = run_line(trap, checked_line(trap, check, spec.argv))
    assert trap.started and trap.decided.is_set() and trap.failure is None
    assert shown.strip() == str(tmp_path).encode()
    assert (trap.exit_code if report else returncode) == 5


def test_failure_marker_split_anywhere_is_found() -> None:
    stream = b"prompt$ echo\r\n\x1eFabc:nocwd\x1eafter"
    for size in range(1, 8):
        trap = ShellTrap(report_exit=False, token="abc")
        out = b"".join(trap.feed(stream[i : i + size]) for i in range(0, len(stream), size))
        assert out == b"" and trap.failure == "nocwd" and trap.done


# Typed into a real interactive shell on a real terminal: the line editor (or the tty's
# canonical mode) acts on Ctrl-U, Ctrl-W, Ctrl-C, Ctrl-V, CR and DEL even inside quotes.
INTERACTIVE_SHELLS = (
    ["bash", "--norc", "--noprofile", "-i"],
    ["dash", "-i"],
    ["zsh", "-f", "-i"],
    ["mksh", "-i"],
    ["busybox", "sh", "-i"],
)
HOSTILE_TEXT = (
    "".join(chr(code) for code in range(1, 32))
    + "\x7f \x15touch pwned-u # \rtouch pwned-r # \x03touch pwned-c # \x17;touch pwned-w;"
    + " !! $HOME `id` \"'\\% \u00e9\u20ac"
)


def _type_into_interactive_shell(argv: list[str], line: str, cwd: Path) -> None:
    parent, child = os.openpty()
    proc = subprocess.Popen(
        argv,
        stdin=child,
        stdout=child,
        stderr=child,
        cwd=cwd,
        start_new_session=True,
        env={"PATH": os.environ["PATH"], "TERM": "dumb", "HOME": str(cwd), "PS1": "$ "},
    )
    os.close(child)
    try:
        os.write(parent, line.encode())
        # The shell reads until it exits; drain the terminal so it never blocks.
        while True:
            ready, _, _ = select.select([parent], [], [], 30)
            assert ready, f"{argv[0]} did not finish the typed line"
            try:
                if not os.read(parent, 65536):
                    break
            except OSError:  # EIO: the last holder of the terminal's other end is gone
                break
        assert proc.wait(timeout=30) == 0
    finally:
        os.close(parent)
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize("argv", INTERACTIVE_SHELLS, ids=lambda argv: argv[0])
def test_keystroke_safe_lines_type_exact_bytes(argv: list[str], tmp_path: Path) -> None:
    if shutil.which(argv[0]) is None:
        pytest.skip(f"{argv[0]} is not installed")
    typed = keystroke_safe(f"printf %s {shlex.quote(HOSTILE_TEXT)} > out; exit 0\n")
    assert re.fullmatch(r"[ -~]*\n", typed), "only printable ASCII keys are typed"
    _type_into_interactive_shell(argv, typed, tmp_path)
    assert (tmp_path / "out").read_bytes() == HOSTILE_TEXT.encode()
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("pwned")) == []


def test_keystroke_safe_keeps_printable_lines() -> None:
    assert keystroke_safe("echo 'a b' | cat\n") == "echo 'a b' | cat\n"
    assert keystroke_safe("x\x15y").startswith('eval "$(printf ')
    assert not keystroke_safe("x\x15y").endswith("\n")


def test_the_toolkit_re_exports_the_shell_trap() -> None:
    assert toolkit.ShellTrap is ShellTrap
