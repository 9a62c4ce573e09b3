"""Open stdin on unix_local (`stdin=True`): a real pipe on both start paths.

The conformance suite checks the behaviour (sort gets its EOF, ordering, errors); here
what is local: fd 0 is our pipe on the clone3 helper's path and on `Popen`'s, a large
write waits for room without blocking the loop, and no fd of ours is left behind.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandbox.backends.unix_local import UnixLocalSession
from sandbox.local import spawn_helper as sh
from tests.helpers import eventually, open_fds

HELPER = sh.loaded()


@contextlib.contextmanager
def _helper_state(helper: sh.Helper | None) -> Iterator[None]:
    saved = (sh._helper, sh._why)
    sh._helper, sh._why = helper, "off for this test"
    try:
        yield
    finally:
        sh._helper, sh._why = saved


@pytest.fixture(params=["helper", "popen"])
def path(request: pytest.FixtureRequest) -> Iterator[str]:
    if request.param == "helper" and HELPER is None:
        pytest.skip(f"no spawn helper here: {sh.reason()}")
    with _helper_state(HELPER if request.param == "helper" else None):
        yield request.param


async def _final(session: UnixLocalSession, pid: int) -> tuple[str, int | None]:
    output = ""
    for _ in range(10):
        update = await session.pty_write_stdin(pid, "", yield_time_s=10)
        output += update.output
        if update.process_id is None:
            return output, update.exit_code
    raise AssertionError(f"process {pid} did not exit: {output[-200:]!r}")


async def test_stdin_is_our_pipe_and_ends_with_the_close(tmp_path: Path, path: str) -> None:
    async with UnixLocalSession(workdir=tmp_path) as s:
        # Without stdin=True: /dev/null, as before.
        plain = await s.pty_exec_start("readlink /proc/self/fd/0", yield_time_s=5)
        assert plain.output == "/dev/null\n"
        update = await s.pty_exec_start(
            "readlink /proc/self/fd/0; exec wc -l", stdin=True, until="\n", yield_time_s=5
        )
        pid = update.process_id
        assert pid is not None and update.output.startswith("pipe:["), update
        await s.pty_write_stdin(pid, "one\ntwo\nthree\n", yield_time_s=0.1)
        await s.pty_close_stdin(pid)
        output, code = await _final(s, pid)
        assert (output.strip(), code) == ("3", 0)


async def test_a_write_larger_than_the_pipe_waits_for_room(tmp_path: Path, path: str) -> None:
    # 512 KiB through a 64 KiB pipe to a reader that takes nothing at first (a sleep
    # before `cat`): the write waits for room on the loop, and every byte comes back in
    # order before the end of input.
    payload = b"".join(b"%07d\n" % n for n in range(65_536))
    async with UnixLocalSession(workdir=tmp_path) as s:
        update = await s.pty_exec_start(
            "echo ready; sleep 0.3; exec cat", stdin=True, until="ready", yield_time_s=5
        )
        pid = update.process_id
        assert pid is not None
        written = await s.pty_write_stdin(pid, payload, until="0065535\n", yield_time_s=30)
        assert written.unwritten_bytes == 0
        await s.pty_close_stdin(pid)
        output, code = await _final(s, pid)
        assert (written.output + output).encode() == payload
        assert code == 0


async def test_no_fd_is_left_behind(tmp_path: Path, path: str) -> None:
    async with UnixLocalSession(workdir=tmp_path) as s:
        # The baseline after a first start: the session keeps a cgroup file per leaf.
        first = await s.pty_exec_start("true", yield_time_s=5)
        assert first.exit_code == 0
        baseline = open_fds()
        for _ in range(3):
            update = await s.pty_exec_start(
                "echo ready; exec cat", stdin=True, until="ready", yield_time_s=5
            )
            pid = update.process_id
            assert pid is not None
            echoed = await s.pty_write_stdin(pid, "x\n", until="x\n", yield_time_s=5)
            await s.pty_close_stdin(pid)
            output, code = await _final(s, pid)
            assert (echoed.output + output, code) == ("x\n", 0)
        # One still open, then terminated: its pipe goes with it.
        update = await s.pty_exec_start(
            "echo ready; exec cat", stdin=True, until="ready", yield_time_s=5
        )
        assert update.process_id is not None
        await s.pty_terminate(update.process_id)
        assert await eventually(lambda: open_fds() <= baseline)


async def test_a_close_waits_for_the_write_before_it(tmp_path: Path, path: str) -> None:
    # The close is asked while a large write still waits for room (the reader sleeps
    # first): it runs only after the write, so the process reads every byte, then EOF.
    payload = b"".join(b"%07d\n" % n for n in range(65_536))
    async with UnixLocalSession(workdir=tmp_path) as s:
        update = await s.pty_exec_start(
            "echo ready; sleep 0.5; exec cat", stdin=True, until="ready", yield_time_s=5
        )
        pid = update.process_id
        assert pid is not None
        entry = s._core.processes.lookup(pid)
        writing = asyncio.ensure_future(
            s.pty_write_stdin(pid, payload, until="0065535\n", yield_time_s=30)
        )
        assert await eventually(lambda: entry.write_task is not None)
        closing = asyncio.ensure_future(s.pty_close_stdin(pid))
        written = await writing
        await closing
        assert written.unwritten_bytes == 0
        output, code = await _final(s, pid)
        assert (written.output + output).encode() == payload
        assert code == 0
