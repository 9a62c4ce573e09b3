"""unix_local with `confine=True`: what the bubblewrap jail hides, forbids and allows.

Every "cannot" test is paired with the same action succeeding where it should (the
workspace, an unconfined session, `network=True`), so a jail that silently did nothing
would fail here. Needs `bwrap` (skipped without it, failed under SANDBOX_REQUIRE_ALL=1),
except the tests of the missing-bwrap error, which run everywhere.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import secrets
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

import sandbox
from sandbox.backends.unix_local import UnixLocalSession, confine
from tests.conftest import skip_or_fail
from tests.helpers import eventually, host_pids_with_arg, unique_seconds


@pytest.fixture
def need_bwrap() -> None:
    """Skip (fail in CI) when no jail can be created on this machine."""
    ok, reason = confine.availability()
    if not ok:
        skip_or_fail(f"confinement unavailable: {reason}")


def confined(tmp_path: Path, **options: object) -> UnixLocalSession:
    """A confined session (not started) with its workspace at tmp_path/ws."""
    return UnixLocalSession(
        workdir=tmp_path / "ws",
        confine=True,
        terminate_grace_s=0.3,
        **options,  # type: ignore[arg-type]
    )


@pytest.fixture
async def jail(tmp_path: Path, need_bwrap: None) -> AsyncIterator[UnixLocalSession]:
    async with confined(tmp_path) as s:
        yield s


def token() -> str:
    return f"sandbox-confine-test-{secrets.token_hex(6)}"


# ---- the file system ---------------------------------------------------------------------


async def test_cannot_write_outside_the_workspace(jail: UnixLocalSession, tmp_path: Path) -> None:
    name = token()
    home_file = Path.home() / name
    host_tmp_file = Path("/tmp") / name
    sibling_dir = tmp_path / "other-project"
    sibling_dir.mkdir()
    targets = [home_file, host_tmp_file, sibling_dir / name, Path("/usr") / name]
    targets.append(Path("/etc") / name)
    try:
        script = "; ".join(f"echo pwned > {t} 2>/dev/null; echo rc=$?" for t in targets)
        result = await jail.exec(script)
        codes = result.stdout.decode().split()
        # The home, the sibling project, /usr and /etc: not writable (hidden or read-only).
        assert codes[0] != "rc=0" and codes[2] != "rc=0", codes
        assert codes[3] != "rc=0" and codes[4] != "rc=0", codes
        # /tmp is writable, but it is the jail's own: the host's /tmp never sees it.
        assert codes[1] == "rc=0", codes
        for target in targets:
            assert not target.exists(), f"the jail wrote {target} on the host"
        # The jail's /tmp is private and empty when a command starts.
        assert (await jail.exec(f"ls -A /tmp; test -e /tmp/{name}")).exit_code == 1
    finally:
        for target in targets:
            target.unlink(missing_ok=True)


async def test_workspace_is_writable_home_and_same_path(jail: UnixLocalSession) -> None:
    result = await jail.exec('echo inside > made.txt; echo "$HOME|$(pwd)|$TMPDIR"')
    assert result.stdout.decode().strip() == f"{jail.workdir}|{jail.workdir}|/tmp"
    assert await jail.read_file("made.txt") == b"inside\n"
    await jail.write_file("sub/from-host.txt", "outside\n")
    assert (await jail.exec("cat sub/from-host.txt")).stdout == b"outside\n"
    assert (await jail.exec("pwd", cwd="sub")).stdout.decode().strip() == f"{jail.workdir}/sub"


async def test_home_and_other_projects_are_invisible(
    jail: UnixLocalSession, tmp_path: Path
) -> None:
    secret = token()  # the content; the file names differ, as they appear in errors
    planted = Path.home() / f".{token()}"
    planted.write_text(secret)
    other = tmp_path / "other-project"
    other.mkdir()
    (other / "credentials").write_text(secret)
    try:
        probe = f"cat {planted} {other / 'credentials'}; ls -A {Path.home()}; ls /"
        result = await jail.exec(probe)
        assert secret not in result.stdout.decode() + result.stderr.decode()
        assert result.stderr.count(b"No such file") == 3
        async with UnixLocalSession(workdir=tmp_path / "plain") as plain:
            assert secret in (await plain.exec(probe)).stdout.decode()  # the probe works
        listing = set(result.stdout.decode().split())
        assert not listing & {"root", "home", "var", "run", "srv", "mnt", "media", "opt"}
        assert {"usr", "etc", "tmp", "proc", "dev"} <= listing
    finally:
        planted.unlink()


async def test_workspace_that_would_expose_the_home_is_refused(
    tmp_path: Path, need_bwrap: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    for workspace in (home, tmp_path, Path("/")):
        session = UnixLocalSession(workdir=workspace, confine=True)
        with pytest.raises(sandbox.InvalidArgumentError, match="workspace"):
            await session.start()
        await session.aclose()
    assert home.is_dir()  # a given workspace is never removed


async def test_readonly_paths_are_visible_but_not_writable(
    tmp_path: Path, need_bwrap: None
) -> None:
    tools = tmp_path / "toolchain"
    tools.mkdir()
    (tools / "version").write_text("1.2.3\n")
    async with confined(tmp_path, readonly_paths=[tools]) as s:
        result = await s.exec(f"cat {tools}/version; touch {tools}/x")
    assert result.stdout == b"1.2.3\n"
    assert result.exit_code != 0
    assert not (tools / "x").exists()


# ---- what runs, and what it sees -----------------------------------------------------------


async def test_ordinary_tools_work(jail: UnixLocalSession) -> None:
    result = await jail.exec(
        "grep -c '^root:' /etc/passwd; python3 -c 'print(6*7)'; echo abc | cat; sh -c 'exit 4'",
    )
    assert result.stdout == b"1\n42\nabc\n"
    assert result.exit_code == 4
    update = await jail.pty_exec_start("stty size", tty=True, rows=31, cols=97)
    assert update.output.strip() == "31 97"


async def test_cannot_see_processes_outside(jail: UnixLocalSession, tmp_path: Path) -> None:
    marker = unique_seconds()
    outside = subprocess.Popen(["sleep", marker])
    try:
        probe = "cat /proc/[0-9]*/cmdline | tr '\\0' ' '; echo; ls /proc | grep -c '^[0-9]'"
        inside = (await jail.exec(probe)).stdout.decode()
        assert marker not in inside
        assert int(inside.split()[-1]) < 10, "only the jail's own few processes"
        async with UnixLocalSession(workdir=tmp_path / "plain") as plain:
            assert marker in (await plain.exec(probe)).stdout.decode()  # the probe works
    finally:
        outside.kill()
        outside.wait()


async def test_environment_is_not_inherited_unless_asked(
    tmp_path: Path, need_bwrap: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = token()
    monkeypatch.setenv("SANDBOX_TEST_SECRET", secret)
    monkeypatch.setenv("LC_TEST_LOCALE", "kept")
    async with confined(tmp_path, env={"GIVEN": "yes"}) as s:
        env = (await s.exec("env")).stdout.decode()
    assert secret not in env
    assert "GIVEN=yes" in env and "LC_TEST_LOCALE=kept" in env and "PATH=" in env
    async with confined(tmp_path, inherit_env=True) as s:
        assert secret in (await s.exec("env")).stdout.decode()


# ---- network -------------------------------------------------------------------------------


async def _loopback_server() -> tuple[asyncio.Server, int, asyncio.Queue[bytes]]:
    received: asyncio.Queue[bytes] = asyncio.Queue()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        received.put_nowait(await reader.read(100))
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port: int = server.sockets[0].getsockname()[1]
    return server, port, received


CONNECT = (
    'python3 -c \'import socket; s = socket.create_connection(("127.0.0.1", {port}), '
    'timeout=5); s.sendall(b"hello-from-jail"); s.close()\''
)


async def test_network_is_off_by_default(jail: UnixLocalSession) -> None:
    server, port, received = await _loopback_server()
    async with server:
        result = await jail.exec(CONNECT.format(port=port))
        assert result.exit_code != 0
        assert b"Connection refused" in result.stderr or b"unreachable" in result.stderr
        assert received.empty()
        # The jail has its own network namespace with nothing but a loopback.
        interfaces = await jail.exec("tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '")
        assert interfaces.stdout == b"lo\n"


async def test_network_true_reaches_the_loopback_server(tmp_path: Path, need_bwrap: None) -> None:
    server, port, received = await _loopback_server()
    async with server, confined(tmp_path, network=True) as s:
        result = await s.exec(CONNECT.format(port=port))
        assert result.exit_code == 0, result.stderr
        async with asyncio.timeout(10):
            assert await received.get() == b"hello-from-jail"


# ---- lifetime and signals --------------------------------------------------------------------


async def test_nothing_survives_close(tmp_path: Path, need_bwrap: None) -> None:
    escaped, detached, main = unique_seconds(), unique_seconds(), unique_seconds()
    one_shot = unique_seconds()
    async with confined(tmp_path) as s:
        # A one-shot command's leftovers die with it, even out of its process group.
        await s.exec(f"setsid sleep {one_shot} > /dev/null 2>&1 &")
        assert await eventually(lambda: not host_pids_with_arg(one_shot))
        # One leaves the process group and session (which a group kill alone would miss),
        # one double-forks, one is the PTY's own command.
        await s.pty_exec_start(
            f"setsid sleep {escaped} & (sleep {detached} &); echo ready; exec sleep {main}",
            tty=True,
            until="ready",
        )
        assert await eventually(
            lambda: all(host_pids_with_arg(m) for m in (escaped, detached, main))
        )
    assert await eventually(
        lambda: not any(host_pids_with_arg(m) for m in (escaped, detached, main))
    )


async def test_terminate_signals_reach_the_command_first(jail: UnixLocalSession) -> None:
    update = await jail.pty_exec_start(
        "trap 'echo hup >> sig.txt' HUP; trap 'echo term >> sig.txt; exit 0' TERM; "
        "echo ready; while :; do sleep 0.05; done",
        tty=True,
        until="ready",
    )
    assert update.process_id is not None
    await jail.pty_terminate(update.process_id)
    # bwrap itself ignored the polite signals; the command saw both and chose to exit.
    assert (await jail.read_file("sig.txt")).split() == [b"hup", b"term"]


@pytest.mark.parametrize("tty", [True, False], ids=["tty", "pipes"])
async def test_interrupt_is_delivered_to_a_program_that_handles_it(
    jail: UnixLocalSession, tty: bool
) -> None:
    program = (
        # Short sleeps in a loop: a SIGINT landing just before one long sleep() starts
        # would only be seen when it ends (CPython, confined or not).
        "import time\ntry:\n    print('ready', flush=True)\n    while True:\n"
        "        time.sleep(0.01)\n"
        "except KeyboardInterrupt:\n    print('caught', flush=True)\n"
    )
    # shell=False: a `sh -c` in between would itself die of the SIGINT (as unconfined).
    update = await jail.pty_exec_start(
        "python3", "-c", program, tty=tty, shell=False, until="ready"
    )
    assert update.process_id is not None
    await jail.pty_interrupt(update.process_id)
    final = await jail.pty_write_stdin(update.process_id, "", yield_time_s=10)
    assert "caught" in final.output
    assert final.exit_code == 0  # the program survived the Ctrl-C: bwrap did too


async def test_repl_survives_ctrl_c(jail: UnixLocalSession) -> None:
    update = await jail.pty_exec_start("python3 -q", tty=True, until=">>> ")
    pid = update.process_id
    assert pid is not None
    # Interrupt running code (a Ctrl-C while readline waits for input can be missed by
    # CPython itself, confined or not, so it is not what this test is about).
    await jail.pty_write_stdin(
        pid,
        "import itertools, time; print('go'); any(time.sleep(0.01) for _ in itertools.count())\n",
        until=re.compile(r"\ngo\r?\n"),
        yield_time_s=10,  # the Ctrl-C must find the loop running, so wait for `go`
    )
    await jail.pty_interrupt(pid)
    update = await jail.pty_write_stdin(pid, "", until=">>> ", yield_time_s=10)
    assert "KeyboardInterrupt" in update.output
    update = await jail.pty_write_stdin(pid, "print(6*7)\n", until="42\r\n", yield_time_s=10)
    assert "42" in update.output and update.process_id == pid


# ---- TIOCSTI -----------------------------------------------------------------------------------

ATTACKER = r"""
import errno, fcntl, json, os, sys, termios
marker = sys.argv[1]
report = {}
def push(fd):
    try:
        for byte in f"echo {marker}\n".encode():
            fcntl.ioctl(fd, termios.TIOCSTI, bytes([byte]))
        return "ok"
    except OSError as exc:
        return errno.errorcode[exc.errno]
for fd in (0, 1, 2):
    report[f"fd{fd}"] = push(fd)
try:
    tty = os.open("/dev/tty", os.O_RDWR)
    report["dev_tty"] = push(tty)
except OSError as exc:
    report["dev_tty"] = errno.errorcode[exc.errno]
report["pts"] = sorted(os.listdir("/dev/pts"))
print("REPORT" + json.dumps(report), flush=True)
"""

USER_SHELL = r"""
# Plays the user's shell: its controlling terminal is the "user's terminal". It opens a
# confined session whose program pushes keystrokes with TIOCSTI, then checks whether any
# of them reached its own terminal's input queue.
import asyncio, fcntl, json, os, struct, subprocess, sys, termios
import sandbox

marker, control_marker, workspace, attacker, out = sys.argv[1:6]

def pending():
    return struct.unpack("i", fcntl.ioctl(0, termios.FIONREAD, b"\0\0\0\0"))[0]

async def main():
    result = {}
    async with sandbox.open_session("unix_local", workdir=workspace, confine=True) as s:
        update = await s.pty_exec_start("python3", attacker, marker, tty=True, yield_time_s=20)
        result["tty"] = update.output
        pipes = await s.exec("python3", attacker, marker, shell=False)
        result["pipes"] = pipes.stdout.decode() + pipes.stderr.decode()
    result["pending_on_user_terminal"] = pending()
    # Control: the same program run directly on the user's terminal (no jail, terminal
    # inherited) does reach it where the kernel allows TIOCSTI: the check above can fail.
    control = subprocess.run([sys.executable, attacker, control_marker], capture_output=True)
    result["control"] = control.stdout.decode()
    result["pending_after_control"] = pending()
    with open(out, "w") as handle:
        json.dump(result, handle)

asyncio.run(main())
"""


def _legacy_tiocsti() -> bool:
    try:
        return Path("/proc/sys/dev/tty/legacy_tiocsti").read_text().strip() == "1"
    except OSError:
        return True  # kernels before 6.2 have no switch: TIOCSTI always works


def _report(text: str) -> dict[str, object]:
    lines = [line for line in text.splitlines() if line.startswith("REPORT")]
    assert lines, text
    report: dict[str, object] = json.loads(lines[0][len("REPORT") :])
    return report


async def test_tiocsti_cannot_reach_the_users_terminal(tmp_path: Path, need_bwrap: None) -> None:
    marker, control_marker = token(), token()
    # The attacker lives in the workspace: the only host directory the jail shows.
    (tmp_path / "ws").mkdir()
    attacker, user_shell = tmp_path / "ws" / "attacker.py", tmp_path / "user_shell.py"
    attacker.write_text(ATTACKER)
    user_shell.write_text(textwrap.dedent(USER_SHELL))
    out = tmp_path / "result.json"
    master, slave = os.openpty()

    def take_terminal() -> None:  # pragma: no cover - runs in the child
        import fcntl
        import termios

        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    proc = subprocess.Popen(
        [
            sys.executable,
            str(user_shell),
            marker,
            control_marker,
            str(tmp_path / "ws"),
            str(attacker),
            str(out),
        ],
        stdin=slave,
        stdout=slave,
        stderr=slave,
        start_new_session=True,
        preexec_fn=take_terminal,
    )
    os.close(slave)
    echoed = bytearray()
    os.set_blocking(master, False)
    loop = asyncio.get_running_loop()
    hung_up = asyncio.Event()

    def on_readable() -> None:
        try:
            data = os.read(master, 65536)
        except BlockingIOError:
            return
        except OSError:  # EIO: every holder of the user's terminal is gone
            data = b""
        if data:
            echoed.extend(data)
        else:
            loop.remove_reader(master)
            hung_up.set()

    loop.add_reader(master, on_readable)
    try:
        async with asyncio.timeout(60):
            await hung_up.wait()
    finally:
        loop.remove_reader(master)
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        os.close(master)
    assert proc.returncode == 0, echoed.decode(errors="replace")
    result = json.loads(out.read_text())

    # Nothing reached the user's terminal: no queued input, nothing echoed on it.
    assert result["pending_on_user_terminal"] == 0
    assert marker.encode() not in echoed

    tty = _report(result["tty"])
    assert tty["pts"] == ["ptmx"], "a fresh devpts: no other terminal is reachable"
    control = _report(result["control"])
    if _legacy_tiocsti():
        # Allowed by this kernel: the keystrokes went into the jail's OWN terminal (the
        # session's PTY), which echoed them back to the session as output: 4 pushes
        # (fds 0, 1, 2 and /dev/tty are all that one terminal).
        assert tty["fd0"] == "ok" and tty["dev_tty"] == "ok"
        assert result["tty"].count(f"echo {marker}") == 4
        # The control run, on the user's terminal, did reach it.
        assert control["fd0"] == "ok"
        assert result["pending_after_control"] > 0
        assert control_marker.encode() in echoed
    else:
        # Disabled by this kernel (dev.tty.legacy_tiocsti=0): refused everywhere.
        assert tty["fd0"] == "EIO" and tty["dev_tty"] == "EIO"
        assert control["fd0"] == "EIO"
        assert result["pending_after_control"] == 0

    pipes = _report(result["pipes"])
    assert pipes["dev_tty"] == "ENXIO", "a pipe process has no terminal at all"
    assert {pipes["fd0"], pipes["fd1"], pipes["fd2"]} == {"ENOTTY"}


# ---- availability and the clear error ------------------------------------------------------------


async def test_missing_bwrap_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    ok, reason = confine.availability()
    assert not ok and "apt-get install bubblewrap" in reason
    session = UnixLocalSession(confine=True)
    with pytest.raises(sandbox.BackendUnavailableError) as info:
        await session.start()
    assert "apt-get install bubblewrap" in str(info.value)
    assert "not run unconfined" in str(info.value)
    with pytest.raises(sandbox.SessionNotStartedError):
        await session.exec("true")
    await session.aclose()


async def test_bwrap_without_namespaces_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    fake = fake_bin / "bwrap"
    # A bwrap that fails like one on a host without user namespaces.
    fake.write_text(
        "#!/bin/sh\necho 'bwrap: No permissions to creating new namespace' >&2\nexit 1\n"
    )
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake_bin}:/usr/bin:/bin")
    ok, reason = confine.availability()
    assert not ok and "No permissions to creating new namespace" in reason
    session = UnixLocalSession(workdir=tmp_path / "ws", confine=True)
    with pytest.raises(sandbox.BackendUnavailableError, match="bubblewrap"):
        await session.start()
    with pytest.raises(sandbox.SessionNotStartedError):  # nothing runs unconfined instead
        await session.exec("true")
    await session.aclose()


def test_backends_report_shows_confinement(need_bwrap: None) -> None:
    from sandbox.cli.backends_report import backend_rows

    notes = {row[0]: row[3] for row in backend_rows()}
    assert "confinement available" in notes["unix_local"]


async def test_cancelled_start_leaves_nothing(tmp_path: Path, need_bwrap: None) -> None:
    for steps in range(8):
        session = confined(tmp_path)
        task = asyncio.ensure_future(session.start())
        for _ in range(steps):
            await asyncio.sleep(0)
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            assert session.state is sandbox.SessionState.NEW
        else:
            assert (await session.exec("echo ok")).stdout == b"ok\n"
        await session.aclose()
