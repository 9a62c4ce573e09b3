"""`sandbox open` on unix_local through the local runner: the session's processes stay
between CLI calls, like tmux's (each call is a new client in a new process)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import sandbox
from sandbox.runner import unavailable_reason
from tests.helpers import host_pids_with_arg, unique_seconds

pytestmark = pytest.mark.skipif(
    unavailable_reason() is not None, reason=f"no runner: {unavailable_reason()}"
)

DEADLINE_S = 30.0
_RUN = (sys.executable, "-m", "sandbox.cli", "run")


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    return env


def _cli(*words: str, cwd: Path) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "sandbox.cli", *words],
        capture_output=True,
        cwd=cwd,
        env=_env(),
        timeout=DEADLINE_S,
    )


def _read_until(proc: subprocess.Popen[bytes], word: bytes) -> bytes:
    """What `proc` printed up to and including `word` (its stdout, read unbuffered)."""
    assert proc.stdout is not None
    seen = b""
    while word not in seen:
        chunk = os.read(proc.stdout.fileno(), 4096)
        assert chunk, f"the command ended before printing {word!r}: {seen!r}"
        seen += chunk
    return seen


def _wait_for(path: Path) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.02)


async def test_open_keeps_processes_between_run_calls_until_close(tmp_path):
    opened = _cli("open", cwd=tmp_path)
    assert opened.returncode == 0, opened.stderr
    ref = sandbox.SessionRef.from_json(opened.stdout)
    assert ref.keeps_processes and ref.options.get("runner") is True
    workspace = Path(ref.sandbox["workspace"])
    ref_file = tmp_path / "ref.json"
    ref_file.write_bytes(opened.stdout)
    seconds = unique_seconds()
    script = (
        "echo early; while [ ! -e go ]; do sleep 0.02; done; "
        f"echo late; touch printed; sleep {seconds}; echo never"
    )
    try:
        # The first call starts the process and is stopped while it runs: it detaches,
        # and the process stays with the runner.
        first = subprocess.Popen(
            [*_RUN, "--session", str(ref_file), "--tty", "--", "sh", "-c", script],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=tmp_path,
            env=_env(),
        )
        try:
            assert b"early" in _read_until(first, b"early")
            first.send_signal(signal.SIGTERM)
            _, errors = first.communicate(timeout=DEADLINE_S)
        finally:
            if first.poll() is None:
                first.kill()
                first.wait()
        assert first.returncode == 128 + signal.SIGTERM, errors
        [kept] = sandbox.read_ref_file(ref_file).processes
        assert kept.running

        # It goes on (and prints) while no client is connected.
        (workspace / "go").touch()
        _wait_for(workspace / "printed")
        [pid] = host_pids_with_arg(seconds)

        # A second call, a new client: it reattaches the process and keeps it.
        second = _cli("run", "--session", str(ref_file), "--", "true", cwd=tmp_path)
        assert second.returncode == 0, second.stderr
        [still] = sandbox.read_ref_file(ref_file).processes
        assert still.running and still.process_id == kept.process_id
        assert host_pids_with_arg(seconds) == [pid]

        # What it printed while no client was attached is replayed, from where the
        # first client had read (so without "early").
        async with sandbox.resume_session(ref_file, ref_file=ref_file) as resumed:
            update = await resumed.pty_write_stdin(
                kept.process_id, "", until="late", yield_time_s=DEADLINE_S
            )
            assert "late" in update.output and "early" not in update.output
            assert update.exit_code is None
            await resumed.detach()
    finally:
        closed = _cli("close", str(ref_file), cwd=tmp_path)
    assert closed.returncode == 0, closed.stderr
    assert not ref_file.exists() and not workspace.exists()
    assert host_pids_with_arg(seconds) == [] and host_pids_with_arg(script) == []


def test_open_without_the_runner_when_asked(tmp_path):
    opened = _cli("open", "--opt", "runner=false", cwd=tmp_path)
    assert opened.returncode == 0, opened.stderr
    ref = sandbox.SessionRef.from_json(opened.stdout)
    ref_file = tmp_path / "ref.json"
    ref_file.write_bytes(opened.stdout)
    assert not ref.keeps_processes and "runner" not in ref.options
    assert _cli("close", str(ref_file), cwd=tmp_path).returncode == 0


@pytest.mark.parametrize("backend", ["docker", "kubernetes"])
def test_a_one_command_session_skips_the_runner_unless_asked(backend: str) -> None:
    from sandbox.cli.durable import one_off

    # Closed after one command: the runner would cost more than it saves.
    assert one_off(backend, {"container": "c"}) == {"container": "c", "runner": False}
    # What the user asked for stands, either way.
    assert one_off(backend, {"runner": True}) == {"runner": True}
    assert one_off(backend, {"runner": None}) == {"runner": None}


def test_a_one_command_session_elsewhere_is_left_as_given() -> None:
    from sandbox.cli.durable import one_off

    for backend in ("unix_local", "modal", "e2b"):
        assert one_off(backend, {"x": 1}) == {"x": 1}
