"""Lifecycle, argument validation, the backend registry and registry bookkeeping."""

from __future__ import annotations

import asyncio
import logging
import math
import subprocess
import sys
from pathlib import Path

import pytest

import sandbox
from sandbox.backends.unix_local import UnixLocalSession
from tests.helpers import DeadlineCount, eventually


async def test_calls_before_start_and_after_close(tmp_path: Path) -> None:
    session = sandbox.open_session("unix_local", workdir=tmp_path)
    with pytest.raises(sandbox.SessionNotStartedError, match="async with"):
        await session.exec("true")
    await session.start()
    await session.start()  # idempotent
    assert (await session.exec("echo ok")).stdout == b"ok\n"
    await session.aclose()
    await session.aclose()
    for call in (session.exec("true"), session.pty_exec_start("true"), session.start()):
        with pytest.raises(sandbox.SessionClosedError):
            await call
    with pytest.raises(sandbox.SessionClosedError):
        session.pty_processes() or await session.pty_write_stdin(1000, "")


async def test_close_without_start_and_concurrent_close(tmp_path: Path) -> None:
    await UnixLocalSession(workdir=tmp_path).aclose()
    s = UnixLocalSession(workdir=tmp_path)
    await s.start()
    await s.pty_exec_start("echo r; exec sleep 30", until="r")
    await asyncio.gather(s.aclose(), s.aclose(), s.aclose())
    assert s.state is sandbox.SessionState.CLOSED


async def test_failed_start_cleans_up_and_can_retry(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    s = UnixLocalSession(workdir=blocker / "ws")  # fine when opened...
    blocker.write_text("not a directory")  # ...then a file takes the parent's place
    with pytest.raises(sandbox.InvalidArgumentError, match="workspace"):
        await s.start()
    assert s.state is sandbox.SessionState.NEW
    blocker.unlink()
    await s.start()  # the failed start left nothing in the way
    assert (await s.exec("echo again")).stdout == b"again\n"
    await s.aclose()
    assert s.state is sandbox.SessionState.CLOSED


async def test_temporary_workspace_is_removed(tmp_path: Path) -> None:
    async with UnixLocalSession() as s:
        ws = Path(s.workdir)
        assert ws.is_dir()
        assert (await s.exec("pwd; echo $HOME")).stdout.decode().split() == [str(ws)] * 2
    assert not ws.exists()
    async with UnixLocalSession(workdir=tmp_path / "kept") as s:
        await s.write_file("f.txt", "x")
    assert (tmp_path / "kept" / "f.txt").read_text() == "x"


@pytest.mark.parametrize(
    "kwargs",
    [
        {"yield_time_s": -1},
        {"yield_time_s": math.nan},
        {"yield_time_s": "5"},
        {"max_output_tokens": 0},
        {"max_output_tokens": 2.5},
        {"rows": 0},
        {"cols": 100_000},
        {"until": ""},
    ],
)
async def test_bad_arguments_are_rejected_before_starting(tmp_path: Path, kwargs: dict) -> None:  # type: ignore[type-arg]
    async with UnixLocalSession(workdir=tmp_path) as s:
        with pytest.raises(sandbox.InvalidArgumentError):
            await s.pty_exec_start("echo should-not-run > ran", **kwargs)
        assert s.pty_processes() == []
        assert not (tmp_path / "ran").exists()


async def test_bad_commands_and_timeouts(tmp_path: Path) -> None:
    async with UnixLocalSession(workdir=tmp_path) as s:
        for bad in ((), ("",), ("a\x00b",)):
            with pytest.raises(sandbox.InvalidArgumentError):
                await s.exec(*bad)
        for timeout in (0, -1, math.inf, math.nan):
            with pytest.raises(sandbox.InvalidArgumentError):
                await s.exec("true", timeout=timeout)
        with pytest.raises(sandbox.InvalidArgumentError):
            await s.pty_write_stdin("1000", "")  # type: ignore[arg-type]


async def test_absurd_yield_times_are_clamped(tmp_path: Path) -> None:
    async with UnixLocalSession(workdir=tmp_path) as s:
        update = await s.pty_exec_start("echo r; exec sleep 30", until="r", yield_time_s=1e9)
        assert update.process_id is not None
        loop = asyncio.get_running_loop()
        deadlines = DeadlineCount(s)
        t0 = loop.time()
        await s.pty_write_stdin(update.process_id, "", yield_time_s=0)  # floor: 5 s for polls
        # It ran to its deadline, and that deadline was the floor (a lower bound holds
        # on a loaded machine too).
        assert deadlines.count == 1 and loop.time() - t0 >= 4.9
        u2 = await s.pty_exec_start("echo r; exec cat", tty=True, until="r")
        assert u2.process_id is not None
        t0 = loop.time()
        await s.pty_write_stdin(u2.process_id, "x", yield_time_s=0)  # floor: 0.25 s
        assert deadlines.count == 2 and loop.time() - t0 >= 0.24
        deadlines.close()


async def test_write_to_exited_process_loses_nothing(tmp_path: Path) -> None:
    async with UnixLocalSession(workdir=tmp_path) as s:
        update = await s.pty_exec_start("echo r; read x; echo last words", tty=True, until="r")
        pid = update.process_id
        assert pid is not None
        await s.pty_write_stdin(pid, "\n", until="words")
        update = await s.pty_exec_start("echo r; exec cat", tty=True, until="r")
        assert update.process_id is not None
        await s.pty_interrupt(update.process_id)
        info = next(i for i in s.pty_processes() if i.process_id == update.process_id)
        while info.running:
            await asyncio.sleep(0.01)
            info = next(i for i in s.pty_processes() if i.process_id == update.process_id)
        with pytest.raises(sandbox.ProcessExitedError, match="poll it"):
            await s.pty_write_stdin(update.process_id, "more\n")
        final = await s.pty_write_stdin(update.process_id, "")
        assert final.process_id is None and final.exit_code == 130


async def test_registry_warns_near_the_limit(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with UnixLocalSession(workdir=tmp_path, terminate_grace_s=0.1) as s:
        with caplog.at_level(logging.WARNING, logger="sandbox"):
            for _ in range(59):
                await s.pty_exec_start("echo r; exec sleep 30", until="r")
            assert not caplog.records
            await s.pty_exec_start("echo r; exec sleep 30", until="r")
        assert len(caplog.records) == 1
        assert "60 of 64" in caplog.records[0].getMessage()


async def test_ids_are_random_and_unique(tmp_path: Path) -> None:
    async with UnixLocalSession(workdir=tmp_path) as s:
        ids = set()
        for _ in range(30):
            update = await s.pty_exec_start("echo r; exec sleep 30", until="r")
            assert update.process_id is not None
            ids.add(update.process_id)
        assert len(ids) == 30 and all(1000 <= i < 100_000 for i in ids)
        assert sorted(ids) != list(range(min(ids), min(ids) + 30))


async def test_a_write_preempts_a_long_poll(tmp_path: Path) -> None:
    async with UnixLocalSession(workdir=tmp_path) as s:
        update = await s.pty_exec_start("echo r; exec cat", tty=True, until="r")
        pid = update.process_id
        assert pid is not None
        deadlines = DeadlineCount(s)
        poll = asyncio.ensure_future(s.pty_write_stdin(pid, "", yield_time_s=30))
        assert await eventually(lambda: s._core.processes.lookup(pid).call_lock.locked())
        write = await s.pty_write_stdin(pid, "hi\n", until="hi\r\nhi", yield_time_s=20)
        assert (await poll).process_id == pid
        assert deadlines.count == 0, "the write must end the poll, and until the write"
        deadlines.close()
        assert "hi" in write.output


def test_unknown_backend_lists_known_names() -> None:
    with pytest.raises(sandbox.UnknownBackendError) as info:
        sandbox.open_session("nope")
    assert isinstance(info.value, LookupError)
    for name in ("unix_local", "docker", "blaxel", "cloudflare", "daytona", "e2b", "modal"):
        assert name in str(info.value)


def test_missing_extra_names_the_pip_install(tmp_path: Path) -> None:
    # A Python that sees only our source (no site-packages): the SDKs are "not installed".
    src = Path(sandbox.__file__).parent.parent
    code = (
        "import sandbox\n"
        "try:\n    sandbox.open_session('e2b')\n"
        "except sandbox.BackendUnavailableError as e:\n    print(e)\n"
        "import sys; print('e2b' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-S", "-c", code],
        env={"PYTHONPATH": str(src)},
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "pip install 'agent-sandbox-pty[e2b]'" in out
    assert out.strip().endswith("False")


def test_importing_sandbox_imports_no_sdk() -> None:
    sdks = "('docker', 'e2b', 'modal', 'daytona', 'blaxel', 'aiohttp')"
    code = f"import sandbox, sys; print(sorted(m for m in {sdks} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
