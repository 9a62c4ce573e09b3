"""Exactly one owner: the lifecycle faults found by hand, each as a test on real processes.

The cross-backend races (a close against a start, a spawn, an exec, a poll) are in
test_conformance_ownership.py; these are the ones about terminals, process trees and the
registry's answers, on unix_local (unconfined: job control gives background jobs process
groups of their own there).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import re
import shutil
import warnings
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

import sandbox
from sandbox.backends.unix_local import UnixLocalSession
from sandbox.testing import procfs
from tests.helpers import DeadlineCount, eventually, host_pids_with_arg, unique_seconds

TEN_MB = "x" * (10 * 1024 * 1024)


@pytest.fixture(params=["auto", "tag"])
async def session(
    tmp_path: Path, request: pytest.FixtureRequest
) -> AsyncIterator[UnixLocalSession]:
    # "auto" is a cgroup wherever the host lets us make one; "tag" is the fallback.
    async with UnixLocalSession(
        workdir=tmp_path, terminate_grace_s=0.3, containment=request.param
    ) as s:
        yield s


async def _blocked_write(session: UnixLocalSession, pid: int) -> asyncio.Future[sandbox.PtyUpdate]:
    """A 10 MB write to `pid`, waiting (as a task) for room the terminal never makes."""
    writing = asyncio.ensure_future(session.pty_write_stdin(pid, TEN_MB, yield_time_s=30))
    assert await _write_is_pending(session, pid)
    return writing


async def _write_is_pending(session: UnixLocalSession, pid: int) -> bool:
    entry = session._core.processes.lookup(pid)
    return await eventually(lambda: entry.write_task is not None and not entry.write_task.done())


# ---- a write blocked on a full terminal ---------------------------------------------


async def _sleeping_on_a_tty(session: UnixLocalSession) -> tuple[int, str]:
    """A `sleep` on a terminal it never reads: (its process id, its unique argument)."""
    marker = unique_seconds()
    update = await session.pty_exec_start(
        f"echo ready; exec sleep {marker}", tty=True, until="ready"
    )
    assert update.process_id is not None
    return update.process_id, marker


async def test_write_to_a_full_terminal_ends_at_its_window(session: UnixLocalSession) -> None:
    pid, marker = await _sleeping_on_a_tty(session)
    # The process never reads: a write that outlived its window would never return
    # (pytest's timeout), and one cut short says what it did not write.
    update = await session.pty_write_stdin(pid, TEN_MB, yield_time_s=1)
    assert update.process_id == pid
    # The terminal took what fits in its queue, the rest was dropped and said so.
    assert 0 < update.unwritten_bytes < len(TEN_MB)
    # The process is still usable: polls work, the call lock was released.
    again = await session.pty_write_stdin(pid, "", yield_time_s=0.25)
    assert again.process_id == pid
    assert len(host_pids_with_arg(marker)) == 1, "the dropped input did not kill the process"


async def test_terminate_wakes_a_blocked_write_and_frees_its_fd(session: UnixLocalSession) -> None:
    pid, marker = await _sleeping_on_a_tty(session)
    writing = await _blocked_write(session, pid)
    deadlines = DeadlineCount(session)
    await session.pty_terminate(pid)
    result = await writing
    # A terminate that waited for the write would have let it run to its 30 s deadline.
    assert deadlines.count == 0, "terminate waited for the blocked write"
    deadlines.close()
    assert result.process_id is None
    assert host_pids_with_arg(marker) == []
    # The next process may get the same fd number: no stale writer may be left on it.
    nxt = await session.pty_exec_start("echo ok; exec cat", tty=True, until="ok")
    assert nxt.process_id is not None
    echoed = await session.pty_write_stdin(nxt.process_id, "hi\n", until=re.compile("hi.*hi", re.S))
    assert echoed.output.count("hi") == 2


async def test_interrupt_is_not_queued_behind_a_blocked_write(session: UnixLocalSession) -> None:
    pid, marker = await _sleeping_on_a_tty(session)
    writing = await _blocked_write(session, pid)
    await asyncio.wait_for(session.pty_interrupt(pid), 5)
    written = await asyncio.wait_for(writing, 10)
    assert written.unwritten_bytes > 0
    # Ctrl-C reached `sleep` although its terminal was full: it died of SIGINT.
    final = written
    if final.process_id is not None:
        final = await session.pty_write_stdin(pid, "", yield_time_s=10)
    assert final.process_id is None
    assert final.exit_code == 130
    assert host_pids_with_arg(marker) == []


# ---- what an interactive shell started ------------------------------------------------


@pytest.mark.parametrize(
    "shell,job",
    [
        ("sh -i", "sleep {m} &"),
        ("bash --norc -i", "sleep {m} &"),
        ("bash --norc -i", "nohup sleep {m} >/dev/null 2>&1 &"),
        ("bash --norc -i", "(sleep {m} &) ; sleep 0"),  # double fork: orphaned, same session
    ],
)
@pytest.mark.parametrize("how", ["terminate", "close"])
async def test_background_jobs_of_a_shell_die_with_it(
    tmp_path: Path, shell: str, job: str, how: str
) -> None:
    if shutil.which(shell.split()[0]) is None:
        pytest.skip(f"{shell} is not installed")
    marker = unique_seconds()
    async with UnixLocalSession(workdir=tmp_path, terminate_grace_s=0.3) as s:
        update = await s.pty_exec_start(shell, tty=True, yield_time_s=2)
        pid = update.process_id
        assert pid is not None
        await s.pty_write_stdin(pid, job.format(m=marker) + "\n", yield_time_s=1)
        assert await eventually(lambda: len(host_pids_with_arg(marker)) == 1)
        if how == "terminate":
            await s.pty_terminate(pid)
            assert host_pids_with_arg(marker) == []
    assert host_pids_with_arg(marker) == []


# A child that leaves the session with setsid and loses its parent at once: no session
# and no parent link lead back to the tree; the environment tag does. The command waits
# until the child is in its own session: a one-shot command's group is killed when it
# ends, which would otherwise race the child's setsid.
ESCAPE = (
    "(setsid sh -c 'echo > {m}.up; exec sleep {m}' </dev/null >/dev/null 2>&1 &); "
    "until [ -e {m}.up ]; do sleep 0.01; done"
)


def _escaped(marker: str) -> bool:
    """The marked process runs, and neither its session nor its parent is ours."""
    pids = host_pids_with_arg(marker)
    if len(pids) != 1:
        return False
    info = procfs.stat(pids[0])
    if info is None:
        return False
    return (
        info.session == pids[0] and procfs.stat(info.ppid) is not None and info.ppid != os.getpid()
    )


async def test_a_setsid_orphan_of_a_terminal_process_dies_with_it(
    session: UnixLocalSession,
) -> None:
    marker = unique_seconds()
    update = await session.pty_exec_start(
        f"{ESCAPE.format(m=marker)}; echo ready; exec sleep {marker}0", tty=True, until="ready"
    )
    assert update.process_id is not None
    assert await eventually(lambda: _escaped(marker))
    await session.pty_terminate(update.process_id)
    assert host_pids_with_arg(marker) == []


async def test_a_daemon_left_by_a_one_shot_command_dies_with_the_session(tmp_path: Path) -> None:
    marker = unique_seconds()
    async with UnixLocalSession(workdir=tmp_path) as s:
        result = await s.exec(ESCAPE.format(m=marker))
        assert result.exit_code == 0
        assert await eventually(lambda: _escaped(marker))
        assert (await s.exec("true")).ok
        assert len(host_pids_with_arg(marker)) == 1, "it lives as long as the session"
    assert host_pids_with_arg(marker) == []


async def test_an_escaped_process_of_another_session_is_left_alone(tmp_path: Path) -> None:
    marker = unique_seconds()
    async with UnixLocalSession(workdir=tmp_path / "a") as other:
        await other.exec(ESCAPE.format(m=marker))
        assert await eventually(lambda: _escaped(marker))
        async with UnixLocalSession(workdir=tmp_path / "b") as s:
            update = await s.pty_exec_start(ESCAPE.format(m=f"{marker}1") + "; sleep 60")
            assert update.process_id is not None
            assert await eventually(lambda: _escaped(f"{marker}1"))
            await s.pty_terminate(update.process_id)
        assert host_pids_with_arg(f"{marker}1") == []
        assert len(host_pids_with_arg(marker)) == 1, "another session's process was killed"
    assert host_pids_with_arg(marker) == []


async def test_background_job_of_an_exited_command_is_killed_at_collection(
    session: UnixLocalSession,
) -> None:
    marker = unique_seconds()
    # `set -m`: the job gets a process group of its own, as in an interactive shell.
    update = await session.pty_exec_start(f"set -m; sleep {marker} & echo started", tty=True)
    assert update.process_id is None, "the shell itself exits at once"
    assert host_pids_with_arg(marker) == []


# ---- honest answers during teardown -------------------------------------------------------


async def test_slots_free_at_once_while_stubborn_processes_are_torn_down(tmp_path: Path) -> None:
    marker = unique_seconds()
    async with UnixLocalSession(workdir=tmp_path, terminate_grace_s=3, max_processes=9) as s:
        for _ in range(9):
            await s.pty_exec_start(
                f"trap '' HUP TERM; echo ready; sleep {marker}; sleep {marker}", until="ready"
            )
        terminating = asyncio.ensure_future(s.pty_terminate_all())
        await asyncio.sleep(0)  # the batch has taken the entries and sent the polite signals
        assert s.pty_processes() == []
        fresh = await s.pty_exec_start("echo fresh", yield_time_s=10)
        assert fresh.output.strip() == "fresh"
        assert not terminating.done(), "the start waited for the teardowns' grace period"
        await terminating
        assert host_pids_with_arg(marker) == []


async def test_a_pruned_process_says_so(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    marker = unique_seconds()
    async with UnixLocalSession(workdir=tmp_path, terminate_grace_s=0.3, max_processes=9) as s:
        first = asyncio.ensure_future(
            s.pty_exec_start(f"echo first; exec sleep {marker}", yield_time_s=30, until="never")
        )
        assert await eventually(lambda: len(s.pty_processes()) == 1)
        oldest = s.pty_processes()[0].process_id
        for _ in range(8):
            await s.pty_exec_start(f"echo r; exec sleep {marker}", until="r")
        with caplog.at_level(logging.INFO, logger="sandbox"):
            await s.pty_exec_start("echo tenth", until="tenth")
        update = await asyncio.wait_for(first, 10)
        assert update.process_id is None
        assert "pruned" in update.output and "full" in update.output
        with pytest.raises(sandbox.PtyProcessNotFoundError, match="pruned"):
            await s.pty_write_stdin(oldest, "")
        assert any("pruned" in r.getMessage() for r in caplog.records)


# ---- a session nobody closed ---------------------------------------------------------------


async def test_unclosed_session_warns_and_kills_its_processes(tmp_path: Path) -> None:
    marker = unique_seconds()
    s = UnixLocalSession(workdir=tmp_path)
    await s.start()
    await s.pty_exec_start(f"echo r; exec sleep {marker}", tty=True, until="r")
    await s.pty_exec_start(f"echo r; sleep {marker} & sleep {marker}", until="r")
    assert await eventually(lambda: len(host_pids_with_arg(marker)) == 3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        del s
        gc.collect()
    messages = [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)]
    assert any("unix_local" in m and "unclosed" in m for m in messages), messages
    assert await eventually(lambda: host_pids_with_arg(marker) == [])


async def test_confined_jail_takes_even_a_setsid_orphan_with_it(tmp_path: Path) -> None:
    # Even one that also cleared its environment (unconfined, the tag would not find it):
    # nothing outlives the jail's PID namespace.
    marker = unique_seconds()
    async with UnixLocalSession(workdir=tmp_path, terminate_grace_s=0.3, confine=True) as s:
        update = await s.pty_exec_start("sh -i", tty=True, yield_time_s=2)
        pid = update.process_id
        assert pid is not None
        await s.pty_write_stdin(pid, f"env -i setsid sleep {marker} &\n", yield_time_s=1)
        assert await eventually(lambda: len(host_pids_with_arg(marker)) == 1)
        await s.pty_terminate(pid)
        assert await eventually(lambda: host_pids_with_arg(marker) == [], timeout=2)
