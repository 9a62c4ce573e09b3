"""ShellTrap against real shells: markers stripped, exit codes kept, cwd errors shown."""

from __future__ import annotations

import subprocess

import pytest

from sandbox.shell_trap import ShellTrap


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
