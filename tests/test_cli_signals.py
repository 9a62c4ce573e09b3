"""SIGTERM, SIGHUP and SIGINT stop every `sandbox` command cleanly: the real CLI in its
own process group, signalled once it is really running (a marker its command wrote, or a
request parked at the loopback Cloudflare stand-in), exits 128+N and leaves no process,
no workspace and no sandbox behind; with `--session` the sandbox stays and its ref file
still holds a valid ref."""

from __future__ import annotations

import asyncio
import json
import os
import pty
import signal
import subprocess
import sys
import termios
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from sandbox.durable.ref_file import read_ref_file
from sandbox.testing.cloudflare_server import CloudflareWorkerServer
from tests.helpers import describe_pids, eventually, host_pids_with_arg, unique_seconds

# The CLI with the stop signals at their defaults, as a terminal starts it: a run under
# `nohup` (SIGHUP ignored) would otherwise hand the CLI an ignored SIGHUP, which it
# keeps ignored on purpose.
SANDBOX = [
    sys.executable,
    "-c",
    "import signal, sys\n"
    "signal.signal(signal.SIGTERM, signal.SIG_DFL)\n"
    "signal.signal(signal.SIGHUP, signal.SIG_DFL)\n"
    "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
    "from sandbox.cli.app import main\n"
    "sys.exit(main(sys.argv[1:]))\n",
]
SIGNALS = [signal.SIGTERM, signal.SIGHUP, signal.SIGINT]
KEY = "signals-test-key"


def _ids(sig: int) -> str:
    return signal.Signals(sig).name


def _environment(tmp: Path) -> dict[str, str]:
    """Our environment with the temporary folder `tmp`: a fresh workspace lands there."""
    tmp.mkdir(exist_ok=True)
    return {**os.environ, "TMPDIR": str(tmp)}


def _marked(marker: Path, arg: str) -> str:
    """A command that writes its working directory to `marker` (whole, by a rename),
    then sleeps `arg` seconds: the event that says the command really runs."""
    return f"pwd > {marker}.part && mv {marker}.part {marker}; exec sleep {arg}"


async def _start(*args: str, env: dict[str, str]) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        *SANDBOX,
        *args,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
        process_group=0,
    )


async def _finish(proc: asyncio.subprocess.Process) -> tuple[int, str, str]:
    async with asyncio.timeout(60):
        out, err = await proc.communicate()
    assert proc.returncode is not None
    return proc.returncode, out.decode(errors="replace"), err.decode(errors="replace")


async def _kill_leftover(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is None:
        proc.kill()
        await proc.wait()


async def _workspace_of(marker: Path) -> Path:
    assert await eventually(marker.exists, timeout=30), "the command never ran"
    return Path(marker.read_text().strip())


async def _nothing_left(arg: str, workspace: Path, tmp: Path) -> None:
    assert await eventually(lambda: not host_pids_with_arg(arg)), describe_pids(
        host_pids_with_arg(arg)
    )
    assert not workspace.exists(), f"the workspace {workspace} was left behind"
    assert list(tmp.iterdir()) == [], "something was left in the temporary folder"


def _status(code: int, err: str, sig: int) -> None:
    assert code == 128 + sig, (code, err)
    assert "Traceback" not in err, err


# ---- unix_local: run, run --tty, run --session ---------------------------------------


@pytest.mark.parametrize("sig", SIGNALS, ids=_ids)
@pytest.mark.parametrize("tty", [False, True], ids=["pipe", "tty"])
async def test_run_is_closed_by_a_signal(tmp_path: Path, sig: int, tty: bool) -> None:
    arg, marker, tmp = unique_seconds(), tmp_path / "marker", tmp_path / "tmp"
    flags = ["--tty"] if tty else []
    proc = await _start("run", *flags, "--", _marked(marker, arg), env=_environment(tmp))
    try:
        workspace = await _workspace_of(marker)
        assert workspace.parent == tmp  # a fresh workspace, the session's to remove
        proc.send_signal(sig)
        code, _, err = await _finish(proc)
    finally:
        await _kill_leftover(proc)
    _status(code, err, sig)
    await _nothing_left(arg, workspace, tmp)


async def _open_local(tmp_path: Path) -> tuple[Path, Path]:
    """`sandbox open` on unix_local: (the ref file, the sandbox's workspace)."""
    workspace = tmp_path / "kept"
    proc = await _start("open", "--workdir", str(workspace), env=_environment(tmp_path / "t"))
    code, out, err = await _finish(proc)
    assert code == 0, err
    ref_file = tmp_path / "ref.json"
    ref_file.write_text(out)
    return ref_file, workspace


@pytest.mark.parametrize("sig", SIGNALS, ids=_ids)
async def test_run_session_detaches_on_a_signal(tmp_path: Path, sig: int) -> None:
    """With `--session` a signal detaches, as an error does: the command is gone, the
    sandbox (its workspace) stays, and the ref file holds a ref that resumes."""
    ref_file, workspace = await _open_local(tmp_path)
    before = ref_file.read_text()
    arg, marker, env = unique_seconds(), tmp_path / "marker", _environment(tmp_path / "t")
    proc = await _start("run", "--session", str(ref_file), "--", _marked(marker, arg), env=env)
    try:
        assert await _workspace_of(marker) == workspace.resolve()
        proc.send_signal(sig)
        code, _, err = await _finish(proc)
    finally:
        await _kill_leftover(proc)
    _status(code, err, sig)
    assert await eventually(lambda: not host_pids_with_arg(arg)), describe_pids(
        host_pids_with_arg(arg)
    )
    assert workspace.is_dir()
    assert ref_file.read_text() != before  # rewritten by the detach
    read_ref_file(str(ref_file))  # raises unless it is a whole, valid ref
    # ...and it still resumes: the close deletes the sandbox and the file.
    closer = await _start("run", "--session", str(ref_file), "--", "echo resumed", env=env)
    code, out, err = await _finish(closer)
    assert (code, out) == (0, "resumed\n"), err
    code, _, err = await _finish(await _start("close", str(ref_file), env=env))
    assert code == 0, err


# ---- unix_local: shell, on a real terminal ---------------------------------------------


@pytest.mark.parametrize("sig", SIGNALS, ids=_ids)
async def test_shell_is_closed_by_a_signal(tmp_path: Path, sig: int) -> None:
    """The terminal's modes are put back (raw while attached); SIGHUP is the terminal
    itself going away (its primary side closed), the others a `kill`."""
    arg, marker, tmp = unique_seconds(), tmp_path / "marker", tmp_path / "tmp"
    primary, secondary = pty.openpty()
    saved = termios.tcgetattr(secondary)
    proc = subprocess.Popen(
        [*SANDBOX, "shell", "--", _marked(marker, arg)],
        stdin=secondary,
        stdout=secondary,
        stderr=secondary,
        env=_environment(tmp),
        start_new_session=True,
        preexec_fn=lambda: __import__("fcntl").ioctl(0, termios.TIOCSCTTY, 0),
    )
    hung_up = False
    try:
        workspace = await _workspace_of(marker)
        assert termios.tcgetattr(secondary) != saved  # attached: raw
        if sig == signal.SIGHUP:
            os.close(primary)  # the terminal closes: the kernel hangs up on the CLI
            hung_up = True
        else:
            proc.send_signal(sig)
        code = await asyncio.to_thread(proc.wait, 60)
        if not hung_up:
            assert termios.tcgetattr(secondary) == saved, "the terminal's modes were restored"
            seen = os.read(primary, 65536) if _readable(primary) else b""
            assert b"Traceback" not in seen, seen
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(secondary)
        if not hung_up:
            os.close(primary)
    assert code == 128 + sig
    await _nothing_left(arg, workspace, tmp)


def _readable(fd: int) -> bool:
    import select

    return bool(select.select([fd], [], [], 0)[0])


# ---- cp, open, close: parked at the Cloudflare stand-in ---------------------------------


@pytest.fixture
async def worker() -> AsyncIterator[CloudflareWorkerServer]:
    async with CloudflareWorkerServer(api_key=KEY) as server:
        yield server


def _cloudflare(server: CloudflareWorkerServer) -> list[str]:
    return ["--backend", "cloudflare", *_opts(server)]


def _opts(server: CloudflareWorkerServer) -> list[str]:
    return ["--opt", f"worker_url={server.url}", "--opt", f"api_key={KEY}"]


async def _signal_when_parked(
    proc: asyncio.subprocess.Process, server: CloudflareWorkerServer, point: str, sig: int
) -> tuple[int, str, str]:
    stall = server.stall(point)
    try:
        async with asyncio.timeout(30):
            await stall.reached.wait()
        proc.send_signal(sig)
        # Released only now: a close that the signal had abandoned would never get here.
        stall.release()
        return await _finish(proc)
    finally:
        stall.release()
        await _kill_leftover(proc)


async def _no_sandbox_left(server: CloudflareWorkerServer) -> None:
    assert await eventually(lambda: not server.sandboxes), server.sandboxes
    assert server.live_processes() == 0


@pytest.mark.parametrize("sig", SIGNALS, ids=_ids)
async def test_cp_mid_copy_is_closed_by_a_signal(
    tmp_path: Path, worker: CloudflareWorkerServer, sig: int
) -> None:
    """The copy's first call (the stat of what is copied out) is parked at the provider
    when the signal comes: the fresh sandbox is deleted all the same. (A copy into a
    fresh sandbox is refused before any session is made: tests/test_cli_guidance.py.)"""
    out = str(tmp_path / "out")
    proc = await _start("cp", *_cloudflare(worker), ":big", out, env=dict(os.environ))
    code, _, err = await _signal_when_parked(proc, worker, "exec", sig)
    _status(code, err, sig)
    assert len(worker.deleted) == 1
    await _no_sandbox_left(worker)


@pytest.mark.parametrize("sig", SIGNALS, ids=_ids)
async def test_open_is_closed_by_a_signal(
    tmp_path: Path, worker: CloudflareWorkerServer, sig: int
) -> None:
    """Signalled while its sandbox is being made: deleted, no ref printed."""
    proc = await _start("open", *_cloudflare(worker), env=dict(os.environ))
    code, out, err = await _signal_when_parked(proc, worker, "session_create", sig)
    _status(code, err, sig)
    assert out == ""
    assert len(worker.deleted) == 1
    await _no_sandbox_left(worker)


@pytest.mark.parametrize("sig", SIGNALS, ids=_ids)
async def test_close_goes_on_to_its_end_on_a_signal(
    tmp_path: Path, worker: CloudflareWorkerServer, sig: int
) -> None:
    """Signalled while the provider deletes the sandbox: the close is the cleanup, so it
    goes on to its end (the sandbox deleted, the ref file removed), then 128+N."""
    opened = await _start("open", *_cloudflare(worker), env=dict(os.environ))
    code, out, err = await _finish(opened)
    assert code == 0, err
    ref_file = tmp_path / "ref.json"
    ref_file.write_text(out)
    sandbox_id = json.loads(out)["sandbox"]["sandbox_id"]
    proc = await _start("close", str(ref_file), *_opts(worker), env=dict(os.environ))
    code, _, err = await _signal_when_parked(proc, worker, "delete", sig)
    _status(code, err, sig)
    assert worker.deleted == [sandbox_id]
    await _no_sandbox_left(worker)
    assert not ref_file.exists()


# ---- mcp: stops on the same signals ----------------------------------------------------


@pytest.mark.parametrize("sig", SIGNALS, ids=_ids)
async def test_mcp_stops_on_a_signal(tmp_path: Path, sig: int) -> None:
    """`sandbox mcp` shares the mechanism and exits 128+N like every command."""
    arg, marker, tmp = unique_seconds(), tmp_path / "marker", tmp_path / "tmp"
    proc = await asyncio.create_subprocess_exec(
        *SANDBOX,
        "mcp",
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=_environment(tmp),
        process_group=0,
    )
    assert proc.stdin is not None and proc.stdout is not None
    try:
        requests = [
            {
                "jsonrpc": "2.0",
                "id": 1,
                "method": "initialize",
                "params": {
                    "protocolVersion": "2025-03-26",
                    "capabilities": {},
                    "clientInfo": {"name": "signals-test", "version": "1"},
                },
            },
            {"jsonrpc": "2.0", "method": "notifications/initialized"},
            {
                "jsonrpc": "2.0",
                "id": 2,
                "method": "tools/call",
                "params": {
                    "name": "exec_command",
                    "arguments": {"cmd": _marked(marker, arg), "yield_time_ms": 250},
                },
            },
        ]
        for request in requests:
            proc.stdin.write((json.dumps(request) + "\n").encode())
        await proc.stdin.drain()
        workspace = await _workspace_of(marker)
        proc.send_signal(sig)
        async with asyncio.timeout(60):
            code = await proc.wait()
        err = (await proc.stderr.read()).decode() if proc.stderr else ""
    finally:
        await _kill_leftover(proc)
    assert code == 128 + sig, err
    await _nothing_left(arg, workspace, tmp)


@pytest.mark.parametrize("second", [signal.SIGINT, signal.SIGTERM], ids=_ids)
async def test_a_second_signal_does_not_cut_the_close_short(
    tmp_path: Path, worker: CloudflareWorkerServer, second: int
) -> None:
    """Ctrl-C, then another signal while the close waits on the provider: said once on
    stderr, and the close still runs to its end before `sandbox` exits 130 (the first
    signal's status)."""
    first_call, delete = worker.stall("exec"), worker.stall("delete")
    out = str(tmp_path / "out")
    proc = await _start("cp", *_cloudflare(worker), ":big", out, env=dict(os.environ))
    assert proc.stderr is not None
    try:
        async with asyncio.timeout(30):
            await first_call.reached.wait()
            proc.send_signal(signal.SIGINT)
            await delete.reached.wait()  # the close has begun
            proc.send_signal(second)
            line = (await proc.stderr.readline()).decode()
        assert line == (
            f"sandbox: {signal.Signals(second).name}: still closing the session, please wait\n"
        )
        delete.release()
        code, _, err = await _finish(proc)
    finally:
        first_call.release()
        delete.release()
        await _kill_leftover(proc)
    _status(code, err, signal.SIGINT)
    assert "still closing" not in err  # once
    assert len(worker.deleted) == 1
    await _no_sandbox_left(worker)
