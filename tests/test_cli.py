"""The `sandbox` command, driven as a person would: real subprocesses, a real terminal."""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import secrets
import select
import signal
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import describe_pids, eventually, host_pids_with_arg, unique_seconds
from tests.terminal.test_recording import read_cast

SANDBOX = [sys.executable, "-m", "sandbox.cli"]


def run_cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*SANDBOX, *args], capture_output=True, text=True, timeout=timeout)


def gone(arg: str) -> bool:
    """No live process has `arg` in its argv (a SIGKILLed one may take a moment to be
    reaped, so this looks for a while)."""
    return asyncio.run(eventually(lambda: not host_pids_with_arg(arg)))


def test_run_passes_output_and_exit_code(tmp_path: Path) -> None:
    out = run_cli("run", "--workdir", str(tmp_path), "--", "echo out; echo err >&2; exit 7")
    assert out.returncode == 7
    assert out.stdout == "out\n" and out.stderr == "err\n"


def test_run_with_tty(tmp_path: Path) -> None:
    out = run_cli("run", "--tty", "--workdir", str(tmp_path), "--", "tty; exit 4")
    assert out.returncode == 4
    assert "/dev/pts/" in out.stdout


def test_run_timeout_prints_partial_output_then_exits_124(tmp_path: Path) -> None:
    arg = unique_seconds()
    out = run_cli(
        "run",
        "--timeout",
        "1",
        "--workdir",
        str(tmp_path),
        "--",
        f"echo partial-out; echo partial-err >&2; exec sleep {arg}",
    )
    assert out.returncode == 124
    assert out.stdout == "partial-out\n"
    assert out.stderr == ("partial-err\nsandbox: command timed out after 1s and was killed\n"), (
        out.stderr
    )
    assert gone(arg), describe_pids(host_pids_with_arg(arg))


@pytest.mark.parametrize(
    "args",
    [
        ["run"],
        ["run", "--backend", "nope", "--", "true"],
        ["frobnicate"],
        ["run", "--opt", "novalue", "--", "true"],
        ["run", "--opt", "bogus_option=1", "--", "true"],
        ["run", "--timeout", "-1", "--", "true"],
        ["run", "--timeout", "nan", "--", "true"],
        ["run", "--timeout", "soon", "--", "true"],
    ],
)
def test_bad_usage_is_one_line_without_traceback(args: list[str]) -> None:
    out = run_cli(*args)
    assert out.returncode == 2, out.stderr
    assert "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr


@pytest.mark.parametrize("command", ["run", "shell"])
@pytest.mark.parametrize(
    "workspace",
    # A file; a path under a file; a path the kernel refuses (an OSError at start).
    ["/etc/passwd", "/etc/passwd/sub", "/proc/sandbox-cli-no-such-dir"],
)
def test_bad_workspace_is_one_line_without_traceback(command: str, workspace: str) -> None:
    out = subprocess.run(
        [*SANDBOX, command, "--workdir", workspace, "--", "true"],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert out.returncode in (1, 2), out.stderr
    assert out.stdout == ""
    assert "Traceback" not in out.stderr
    assert out.stderr.startswith("sandbox: error: ") and out.stderr.count("\n") == 1, out.stderr
    assert workspace in out.stderr


def test_backends_table_lists_all_without_secrets() -> None:
    secret = "sk-test-should-never-print-1234"
    env = dict(os.environ, E2B_API_KEY=secret, CLOUDFLARE_SANDBOX_API_KEY=secret)
    out = subprocess.run([*SANDBOX, "backends"], capture_output=True, text=True, env=env)
    assert out.returncode == 0
    names = [line.split()[0] for line in out.stdout.splitlines()[1:]]
    assert names == [
        "unix_local",
        "docker",
        "blaxel",
        "cloudflare",
        "daytona",
        "e2b",
        "modal",
        "kubernetes",
    ]
    assert "found (E2B_API_KEY)" in out.stdout
    assert secret not in out.stdout + out.stderr


def test_demo_runs_every_step() -> None:
    out = run_cli("demo", timeout=120)
    assert out.returncode == 0, out.stderr
    for step in ("python3 -q", "pty_interrupt", "exit_code=130", "pty_processes()", "columns=120"):
        assert step in out.stdout
    # The full-screen step: the page of `less` as the model receives it.
    assert "   | line 045\n   | :█\n" in out.stdout, out.stdout
    assert "processes left: 0" in out.stdout


class Terminal:
    """A real terminal for the CLI: we hold the primary side, like a terminal emulator."""

    def __init__(self, args: list[str], rows: int = 24, cols: int = 80) -> None:
        self.primary, secondary = os.openpty()
        self.set_size(rows, cols, fd=secondary)
        self.saved = termios.tcgetattr(secondary)
        self.proc = subprocess.Popen(
            [*SANDBOX, *args],
            stdin=secondary,
            stdout=secondary,
            stderr=secondary,
            start_new_session=True,
            preexec_fn=lambda: fcntl.ioctl(0, termios.TIOCSCTTY, 0),
        )
        self.secondary = secondary
        self.seen = b""

    def set_size(self, rows: int, cols: int, fd: int | None = None) -> None:
        fcntl.ioctl(
            self.primary if fd is None else fd,
            termios.TIOCSWINSZ,
            struct.pack("HHHH", rows, cols, 0, 0),
        )

    def type(self, text: str) -> None:
        os.write(self.primary, text.encode())

    def read_until(self, needle: bytes, timeout: float = 20, start: int = 0) -> bytes:
        deadline = time.monotonic() + timeout
        while needle not in self.seen[start:]:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"{needle!r} not seen; got {self.seen[-500:]!r}")
            ready, _, _ = select.select([self.primary], [], [], left)
            if ready:
                try:
                    self.seen += os.read(self.primary, 65536)
                except OSError:
                    break
        return self.seen

    def close(self) -> int:
        code = self.proc.wait(timeout=30)
        attrs = termios.tcgetattr(self.secondary)
        os.close(self.secondary)
        os.close(self.primary)
        assert attrs == self.saved, "the terminal mode was restored"
        return code


@pytest.mark.parametrize("output_first", [True, False])
def test_run_tty_timeout_covers_the_whole_run(tmp_path: Path, output_first: bool) -> None:
    arg = unique_seconds()
    command = f"echo before-timeout; exec sleep {arg}" if output_first else f"exec sleep {arg}"
    args = ["run", "--tty", "--timeout", "1", "--workdir", str(tmp_path), "--", command]
    term = Terminal(args)
    try:
        if output_first:
            term.read_until(b"before-timeout")
        # Without the timeout, the sleep would outlast this wait by days.
        term.read_until(b"sandbox: command timed out after 1s and was killed\r\n")
    finally:
        code = term.close()
    assert code == 124
    assert b"Traceback" not in term.seen
    assert gone(arg), describe_pids(host_pids_with_arg(arg))


def test_shell_attaches_a_terminal(tmp_path: Path) -> None:
    term = Terminal(["shell", "--workdir", str(tmp_path)], rows=30, cols=90)
    try:
        term.type("stty size; echo $((6*7))\n")
        term.read_until(b"30 90")
        term.read_until(b"42")
        term.set_size(45, 132)
        term.proc.send_signal(signal.SIGWINCH)
        # The resize is a signal, the keys are bytes: under load the line may reach the
        # shell before the resize does, so ask again until the new size is seen.
        for _ in range(20):
            start = len(term.seen)
            term.type("stty size\n")
            term.read_until(b"# ", start=start + 1)  # this line's answer and the prompt
            if b"45 132" in term.seen[start:]:
                break
        assert b"45 132" in term.seen
        # Printed by the foreground job itself, so Ctrl-C cannot reach the shell first.
        term.type("sh -c 'echo sleep-started; exec sleep 30'\n")
        term.read_until(b"sleep-started\r\n")
        term.type("\x03")
        term.read_until(b"^C", timeout=10)
        term.read_until(b"# ", start=term.seen.index(b"^C"))  # the prompt is back
        term.type("echo after-interrupt\n")
        term.read_until(b"after-interrupt\r\n")
        term.type("exit 5\n")
    finally:
        code = term.close()
    assert code == 5


def test_shell_on_a_window_bigger_than_a_terminal_may_be(tmp_path: Path) -> None:
    term = Terminal(["shell", "--workdir", str(tmp_path)], rows=1200, cols=2000)
    try:
        term.type("stty size\n")
        term.read_until(b"1000 1000")  # the largest accepted, not an error
        term.set_size(40, 1500)
        term.proc.send_signal(signal.SIGWINCH)
        term.type("stty size\n")
        term.read_until(b"40 1000")
        term.type("exit 3\n")
    finally:
        code = term.close()
    assert code == 3


def test_shell_with_a_command(tmp_path: Path) -> None:
    term = Terminal(["shell", "--workdir", str(tmp_path), "--", "cat"])
    try:
        term.type("hello cat\n")
        term.read_until(b"hello cat\r\nhello cat")
        term.type("\x04")
    finally:
        code = term.close()
    assert code == 0


def test_run_tty_record_writes_a_valid_asciicast(tmp_path: Path) -> None:
    cast = tmp_path / "run.cast"
    args = ["run", "--tty", "--record", str(cast), "--workdir", str(tmp_path / "ws")]
    out = run_cli(*args, "--", "echo recorded-漢字; stty size; exit 3")
    assert out.returncode == 3, out.stderr
    assert "recorded-漢字" in out.stdout
    header, events = read_cast(cast)
    assert (header["width"], header["height"]) == (80, 24)
    assert header["command"] == "echo recorded-漢字; stty size; exit 3"
    output = "".join(e[2] for e in events if e[1] == "o")
    assert "recorded-漢字\r\n24 80\r\n" in output
    # Only a terminal is recorded.
    out = run_cli("run", "--record", str(cast), "--workdir", str(tmp_path), "--", "true")
    assert out.returncode == 2 and "--record needs --tty" in out.stderr


def test_run_record_never_overwrites_and_resolves_its_folder_first(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)  # the user's own symlink, named before the start
    cast = tmp_path / "link" / "run.cast"
    args = ["run", "--tty", "--record", str(cast), "--workdir", str(tmp_path / "ws")]
    out = run_cli(*args, "--", "echo first")
    assert out.returncode == 0, out.stderr
    before = (real / "run.cast").read_bytes()
    assert b"first" in before
    # A second run to the same FILE is refused before it runs, the recording kept.
    out = run_cli(*args, "--", "echo second > ran")
    assert out.returncode == 2
    assert "cannot record to" in out.stderr and "already exists there" in out.stderr
    assert (real / "run.cast").read_bytes() == before
    assert not (tmp_path / "ws" / "ran").exists()


def test_shell_record_writes_a_valid_asciicast(tmp_path: Path) -> None:
    cast = tmp_path / "shell.cast"
    term = Terminal(["shell", "--record", str(cast), "--workdir", str(tmp_path / "ws")])
    try:
        term.type("echo $((6*7))-in-shell\n")
        term.read_until(b"42-in-shell\r\n")
        term.type("exit 0\n")
    finally:
        code = term.close()
    assert code == 0
    header, events = read_cast(cast)
    assert "exec sh -i" in header["command"]  # the default shell
    assert not [e for e in events if e[1] == "i"]  # keystrokes are not recorded
    assert "42-in-shell\r\n" in "".join(e[2] for e in events if e[1] == "o")


def test_shell_on_docker_works_like_docker_exec_it() -> None:
    from tests.backend_fixtures import docker as docker_fixture
    from tests.conftest import skip_or_fail

    reason = docker_fixture.skip_reason()
    if reason:
        skip_or_fail(f"docker: {reason}")
    import docker

    from sandbox.testing.docker_image import ensure_busybox_image

    image = ensure_busybox_image()
    engine = docker.from_env()
    # A label of this test's own: other tests (other workers) make containers of the same
    # image meanwhile, so a look at all of them would see theirs.
    key, value = "sandbox.test.cli-shell", secrets.token_hex(6)
    mine: dict[str, Any] = {"all": True, "filters": {"label": f"{key}={value}"}}
    labels = f"labels={json.dumps({key: value})}"
    term = Terminal(
        ["shell", "--backend", "docker", "--image", image, "--opt", labels], rows=31, cols=97
    )
    try:
        term.type("stty size; echo in-container-$((40+2))\n")
        term.read_until(b"31 97")
        term.read_until(b"in-container-42")
        assert len(engine.containers.list(**mine)) == 1, "the shell runs in a container of its own"
        term.type("exit 6\n")
    finally:
        code = term.close()
    assert code == 6
    left = engine.containers.list(**mine)
    engine.close()
    assert left == [], "the container the shell created is removed"


# ---- closed standard streams and readers that go away --------------------------------------

# The console script itself, as a user runs it (the module where scripts are not installed).
_SCRIPT = Path(sys.executable).with_name("sandbox")
CONSOLE = [str(_SCRIPT)] if _SCRIPT.exists() else SANDBOX
CLOSED_STDOUT = "sandbox: error: cannot write the output: standard output is not open for writing\n"


def run_closed(redirect: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run the console script with a shell redirection such as `>&-` (the descriptor is
    really closed, not /dev/null) applied to it alone."""
    return subprocess.run(
        ["sh", "-c", f'exec "$@" {redirect}', "sh", *CONSOLE, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


def _printing_commands(workspace: Path) -> list[list[str]]:
    ws = ["--workdir", str(workspace)]
    return [
        ["run", *ws, "--", "echo hi"],
        ["run", "--tty", *ws, "--", "echo hi"],
        ["shell", *ws, "--", "echo hi"],
        ["backends"],
        ["demo"],
    ]


@pytest.mark.parametrize("index", range(5), ids=["run", "run-tty", "shell", "backends", "demo"])
def test_closed_stdout_is_one_error_line(tmp_path: Path, index: int) -> None:
    """`sandbox ... >&-`: one `sandbox: error:` line on stderr and exit 1, whatever the
    subcommand; no traceback, nothing complaining at interpreter exit."""
    out = run_closed(">&-", *_printing_commands(tmp_path)[index])
    assert out.returncode == 1, out.stderr
    assert out.stderr == CLOSED_STDOUT
    assert out.stdout == ""


def test_closed_stdout_without_output_is_not_an_error(tmp_path: Path) -> None:
    """As with any Unix tool, a closed stdout matters only when something is written."""
    out = run_closed(">&-", "run", "--workdir", str(tmp_path), "--", "touch made; exit 3")
    assert out.returncode == 3 and out.stderr == ""
    assert (tmp_path / "made").exists()


def test_mcp_stdio_refuses_a_closed_stdout_before_starting(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    out = run_closed(">&-", "mcp", "--workdir", str(workspace))
    assert out.returncode == 1
    assert out.stderr.startswith("sandbox: error: standard output is not open for writing")
    assert out.stderr.count("\n") == 1
    assert not workspace.exists()  # no session was started


def test_closed_stderr_sends_nothing_to_stdout(tmp_path: Path) -> None:
    """`2>&-`: our own messages never land on stdout (print(file=None) would put them
    there) and there is no traceback; the exit code says what happened."""
    ws = ["--workdir", str(tmp_path)]
    out = run_closed("2>&-", "run", *ws, "--opt", "bogus_option=1", "--", "true")
    assert (out.returncode, out.stdout) == (2, "")
    out = run_closed("2>&-", "run", "--timeout", "0.5", *ws, "--", "echo partial; exec sleep 30")
    assert (out.returncode, out.stdout) == (124, "partial\n")
    # The command's own stderr cannot be written: its output is lost, so that is an error.
    out = run_closed("2>&-", "run", *ws, "--", "echo out; echo err >&2; exit 0")
    assert (out.returncode, out.stdout) == (1, "out\n")
    out = run_closed(">&- 2>&-", "run", *ws, "--", "echo out")
    assert (out.returncode, out.stdout) == (1, "")


@pytest.mark.parametrize("index", range(5), ids=["run", "run-tty", "shell", "backends", "demo"])
def test_reader_gone_ends_quietly(tmp_path: Path, index: int) -> None:
    """A reader that has gone away (the pipe's read end is closed before we write):
    no output on stderr, no "Exception ignored", exit 141 (128 + SIGPIPE)."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        out = subprocess.run(
            [*CONSOLE, *_printing_commands(tmp_path)[index]],
            stdout=write_end,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
            timeout=60,
        )
    finally:
        os.close(write_end)
    assert out.stderr == ""
    assert out.returncode == 141


@pytest.mark.parametrize("tty", [False, True], ids=["exec", "tty"])
def test_pipe_to_head_ends_quietly_and_stops_the_command(tmp_path: Path, tty: bool) -> None:
    """`sandbox run -- seq 1 1000000 | head -1` (the output written at once, which the
    pipe takes in part before the reader leaves) and `sandbox run --tty -- yes MARK |
    head -1` (streamed, endless): the first line, then a quiet end with 141, and the
    endless command torn down."""
    marker = unique_seconds()
    script = '{ "$@" 2>"$ERR"; echo $? >"$RC"; } | head -1'
    env = {**os.environ, "ERR": str(tmp_path / "err"), "RC": str(tmp_path / "rc")}
    ws = ["--workdir", str(tmp_path / "ws")]
    command = ["run", "--tty", *ws, "--", f"yes {marker}"] if tty else ["run", *ws, "--"]
    if not tty:
        command.append(f"seq {marker} 1999999")
    out = subprocess.run(
        ["sh", "-c", script, "sh", *CONSOLE, *command],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        stdin=subprocess.DEVNULL,
    )
    assert out.stdout.replace("\r", "") == f"{marker}\n"
    assert (tmp_path / "err").read_text() == ""
    assert (tmp_path / "rc").read_text() == "141\n"
    assert gone(marker), describe_pids(host_pids_with_arg(marker))


def test_shell_reads_a_file_on_stdin(tmp_path: Path) -> None:
    """stdin from a file (or /dev/null, or closed): epoll refuses such a descriptor, so
    it is read straight and typed into the terminal."""
    script = tmp_path / "input.sh"
    script.write_text("echo from-$((40 + 2))\nexit 3\n")
    with script.open() as stdin:
        out = subprocess.run(
            [*CONSOLE, "shell", "--workdir", str(tmp_path / "ws"), "--", "sh"],
            stdin=stdin,
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert out.returncode == 3, out.stderr
    assert "from-42" in out.stdout and out.stderr == ""
    out = run_closed("<&-", "shell", "--workdir", str(tmp_path / "ws"), "--", "sleep 1; echo hi")
    assert out.returncode == 0, out.stderr
    assert "hi" in out.stdout and out.stderr == ""
