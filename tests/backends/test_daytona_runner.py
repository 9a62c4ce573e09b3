"""The `daytona` backend with the runner (docs/runner.md), through the SDK fake: the runner
really runs in the fake sandbox (a local process in the sandbox's own runner folder),
uploaded by `fs.upload_file` and reached by a session command, `connect --text --start`,
whose input (`send_session_command_input`) and logs carry its frames as base64 lines.

Delivery by content hash (a second client finds the file and the running runner), the
headline (a terminal's output printed while no client was connected is replayed after a
resume: the daemon keeps no PTY output), byte-exact output of a pipe process (all 256
byte values, which the SDK's text logs would replace), an open stdin ended by
`pty_close_stdin` (also across a detach: the daemon's session commands have no EOF),
whole-tree kills, and the daemon's own processes where this install has no runner for
the sandbox's machine (`runner=None`) or a refusal (`runner=True`).
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import stat
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

import sandbox
from sandbox.backends.daytona import DaytonaSession
from sandbox.runner import runner_binary
from sandbox.testing.daytona_fake import FakeDaytona
from tests.helpers import (
    describe_pids,
    eventually,
    host_pids_with_arg,
    require_runner,
    runner_pid,
    unique_seconds,
)

KEY = "dtn_runner_test_key_0123456789"
ALL_BYTES = bytes(range(256))


@pytest.fixture(autouse=True)
def _runner_built() -> None:
    require_runner("daytona runner")


@pytest.fixture
async def fake(tmp_path: Path) -> AsyncIterator[FakeDaytona]:
    root = tmp_path / "fake-daytona"
    root.mkdir()
    f = FakeDaytona(api_key=KEY, root=root)
    yield f
    await f.aclose()
    # Deleting the sandbox ends the runner and everything it kept, and its folder.
    assert await eventually(lambda: f.leftover_pids() == [], timeout=15), describe_pids(
        f.leftover_pids()
    )
    assert not [folder for folder in f.runner_dirs if os.path.exists(folder)]


def open_daytona(fake: FakeDaytona, **options: Any) -> DaytonaSession:
    options.setdefault("runner", True)
    s = sandbox.open_session(
        "daytona", api_key=KEY, daytona_class=fake.AsyncDaytona, terminate_grace_s=0.2, **options
    )
    assert isinstance(s, DaytonaSession)
    return s


def resume(fake: FakeDaytona, ref: sandbox.SessionRef) -> DaytonaSession:
    s = sandbox.resume_session(ref, api_key=KEY, daytona_class=fake.AsyncDaytona)
    assert isinstance(s, DaytonaSession)
    return s


def uploads(fake: FakeDaytona) -> int:
    """How many files the fake was asked to upload (only the runner, in these tests)."""
    return fake.calls.count("upload_file")


def links(fake: FakeDaytona) -> int:
    """How many session commands were started (through the runner: only its links)."""
    return fake.calls.count("execute_session_command")


async def test_a_second_client_finds_the_delivered_runner_by_its_hash(fake: FakeDaytona) -> None:
    async with open_daytona(fake, keep=True) as first:
        assert first.keeps_processes is True
        assert (await first.exec("echo", "one")).stdout == b"one\n"
        pid = runner_pid(first)
        sandbox_id = first.sandbox_id
        assert sandbox_id is not None
    assert uploads(fake) == 1 and links(fake) == 1
    # The link's session was deleted at the close: the runner was not (kept sandbox).
    assert fake.session_ids(sandbox_id) == []
    state = fake.sandboxes[sandbox_id]
    binary = runner_binary()
    assert binary is not None
    path = Path(state.runner_dir) / f".sandbox-runner-{binary.sha256[:16]}"
    assert hashlib.sha256(path.read_bytes()).hexdigest() == binary.sha256
    assert stat.S_IMODE(path.stat().st_mode) == 0o755
    assert [p.name for p in path.parent.iterdir() if p.name.endswith(".tmp")] == []

    # The same bytes are there: no upload; the running runner answers the new link.
    async with open_daytona(fake, sandbox_id=sandbox_id, keep=True) as second:
        assert runner_pid(second) == pid
        assert (await second.exec("echo", "two")).stdout == b"two\n"
    assert uploads(fake) == 1 and links(fake) == 2

    # Other bytes at the runner's name are replaced (the running runner is still found).
    other = path.with_name("impostor")
    other.write_bytes(b"#!/bin/sh\necho impostor\n")
    other.replace(path)
    async with open_daytona(fake, sandbox_id=sandbox_id) as third:
        assert runner_pid(third) == pid
        assert (await third.exec("echo", "three")).stdout == b"three\n"
        assert hashlib.sha256(path.read_bytes()).hexdigest() == binary.sha256
    assert uploads(fake) == 2
    assert fake.live_sandbox_ids() == []  # the last one did not keep it


@pytest.mark.parametrize("tty", [True, False], ids=["tty", "pipes"])
async def test_output_printed_while_detached_is_replayed_after_resume(
    fake: FakeDaytona, tty: bool
) -> None:
    script = (
        "echo early; while [ ! -e go ]; do sleep 0.02; done; "
        "echo late-1; echo late-2; touch finished; exit 3"
    )
    async with open_daytona(fake) as s:
        waiting = await s.pty_exec_start(script, tty=tty, yield_time_s=5, until="early")
        assert "early" in waiting.output
        ticking = await s.pty_exec_start(
            "for i in 1 2 3; do echo tick-$i; done; exec sleep 600",
            tty=tty,
            yield_time_s=5,
            until="tick-3",
        )
        pid = runner_pid(s)
        workdir = Path(s.workdir)
        ref = await s.detach()
    assert ref.keeps_processes is True and ref.options["runner"] is True
    assert all(p.running and "runner_id" in p.handle for p in ref.processes)
    # While nobody follows it, the process goes on and prints.
    (workdir / "go").write_bytes(b"")
    assert await eventually(lambda: (workdir / "finished").exists(), timeout=15)

    async with resume(fake, ref) as resumed:
        assert runner_pid(resumed) == pid and uploads(fake) == 1
        ids = {info.process_id for info in resumed.pty_processes()}
        assert ids == {waiting.process_id, ticking.process_id}
        last = await resumed.pty_write_stdin(waiting.process_id, "", yield_time_s=10)
        # Replayed from the runner's ring, not the daemon's "printed meanwhile" note.
        assert "late-1" in last.output and "late-2" in last.output
        assert "early" not in last.output  # the client had read it: not replayed
        assert "not shown" not in last.output
        assert last.exit_code == 3
        alive = await resumed.pty_write_stdin(ticking.process_id, "", yield_time_s=0.2)
        assert alive.exit_code is None and "tick" not in alive.output


async def test_without_the_runner_a_terminal_loses_what_it_printed_while_detached(
    fake: FakeDaytona,
) -> None:
    # The contrast the runner exists for: the daemon broadcasts a PTY's output to the
    # clients connected at that moment and keeps none of it.
    async with open_daytona(fake, runner=False) as s:
        waiting = await s.pty_exec_start(
            "echo early; while [ ! -e go ]; do sleep 0.02; done; echo late; touch finished; "
            "exec sleep 600",
            tty=True,
            yield_time_s=5,
            until="early",
        )
        workdir = Path(s.workdir)
        ref = await s.detach()
    assert ref.options["runner"] is False
    (workdir / "go").write_bytes(b"")
    assert await eventually(lambda: (workdir / "finished").exists(), timeout=15)
    async with resume(fake, ref) as resumed:
        last = await resumed.pty_write_stdin(waiting.process_id, "", yield_time_s=0.5)
        assert "not shown" in last.output and "late" not in last.output


async def test_every_byte_value_comes_back_exact_through_a_pipe_process(
    fake: FakeDaytona,
) -> None:
    async with open_daytona(fake) as s:
        await s.write_file("bytes.bin", ALL_BYTES)
        started = await s.pty_exec_start(
            "while [ ! -e go ]; do sleep 0.02; done; cat bytes.bin", yield_time_s=0
        )
        [entry] = [e for e in s._core.processes.entries() if e.process_id == started.process_id]
        await s.write_file("go", b"")
        assert await eventually(lambda: entry.exited, timeout=15)
        # The bytes the process printed, as the session holds them before decoding.
        assert b"".join(entry.output.since(entry.output.start_pos)) == ALL_BYTES
        done = await s.pty_write_stdin(started.process_id, "", yield_time_s=5)
        assert done.exit_code == 0
        result = await s.exec("cat bytes.bin; cat bytes.bin >&2")
        assert result.stdout == ALL_BYTES and result.stderr == ALL_BYTES
    async with open_daytona(fake, runner=False) as plain:
        await plain.write_file("bytes.bin", ALL_BYTES)
        # What the runner is for: the daemon's logs reach the SDK's callbacks as text.
        assert (await plain.exec("cat bytes.bin")).stdout != ALL_BYTES


async def test_open_stdin_is_ended_by_close_stdin_also_across_a_detach(
    fake: FakeDaytona,
) -> None:
    async with open_daytona(fake) as s:
        started = await s.pty_exec_start("sort", stdin=True, yield_time_s=0.2)
        await s.pty_write_stdin(started.process_id, "pear\napple\n")
        await s.pty_close_stdin(started.process_id)
        done = await s.pty_write_stdin(started.process_id, "", yield_time_s=10)
        assert done.output == "apple\npear\n" and done.exit_code == 0

        kept = await s.pty_exec_start("sort", stdin=True, yield_time_s=0.2)
        await s.pty_write_stdin(kept.process_id, "cherry\n")
        ref = await s.detach()
    async with resume(fake, ref) as resumed:
        await resumed.pty_write_stdin(kept.process_id, "banana\n")
        await resumed.pty_close_stdin(kept.process_id)
        last = await resumed.pty_write_stdin(kept.process_id, "", yield_time_s=10)
        assert last.output == "banana\ncherry\n" and last.exit_code == 0


async def test_open_stdin_without_the_runner_is_refused_before_anything_starts(
    fake: FakeDaytona,
) -> None:
    async with open_daytona(fake, runner=False) as s:
        with pytest.raises(sandbox.UnsupportedOperationError, match="runner=True"):
            await s.pty_exec_start("sort", stdin=True, yield_time_s=0.2)
        assert s.pty_processes() == []
        assert s.sandbox_id is not None and fake.session_ids(s.sandbox_id) == []


async def test_a_kill_ends_the_whole_tree_escapees_included(fake: FakeDaytona) -> None:
    seconds = unique_seconds()
    async with open_daytona(fake, keep=True) as s:
        started = await s.pty_exec_start(
            f"sleep {seconds} & setsid sleep {seconds} & echo up; wait",
            yield_time_s=5,
            until="up",
        )
        assert await eventually(lambda: len(host_pids_with_arg(seconds)) == 2)
        await s.pty_terminate(started.process_id)
        # Kept sandbox: nothing but the runner ended them.
        assert await eventually(lambda: host_pids_with_arg(seconds) == [])
        assert (await s.exec("echo", "after")).stdout == b"after\n"


async def test_a_terminal_resizes_and_processes_start_in_the_workdir(fake: FakeDaytona) -> None:
    async with open_daytona(fake) as s:
        workdir = s.workdir
        assert (await s.exec("pwd")).stdout.decode().strip() == workdir
        (Path(workdir) / "sub").mkdir()
        assert (await s.exec("pwd", cwd="sub")).stdout.decode().strip() == f"{workdir}/sub"
        started = await s.pty_exec_start(
            "echo ready; read line; stty size", tty=True, rows=24, cols=80, until="ready"
        )
        await s.pty_resize(started.process_id, rows=33, cols=101)
        size = await s.pty_write_stdin(started.process_id, "\n", yield_time_s=5, until="33")
        assert "33 101" in size.output


@pytest.fixture
def riscv(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Fake sandboxes whose `uname` says they are a riscv64 machine (no runner build):
    the fake gives its processes this process's PATH."""
    stubs = tmp_path / "bin"
    stubs.mkdir()
    uname = stubs / "uname"
    uname.write_text("#!/bin/sh\necho riscv64\n")
    uname.chmod(0o755)
    monkeypatch.setenv("PATH", f"{stubs}:{os.environ.get('PATH', '/usr/bin:/bin')}")


@pytest.mark.usefixtures("riscv")
async def test_without_a_runner_for_the_sandbox_runner_none_keeps_the_daemons_processes(
    fake: FakeDaytona,
) -> None:
    async with open_daytona(fake, runner=None) as s:
        assert s._runner is None and s.keeps_processes is True
        assert (await s.exec("echo", "daemon")).stdout == b"daemon\n"
        assert s.ref().options["runner"] is False
    assert uploads(fake) == 0 and "send_session_command_input" not in fake.calls


@pytest.mark.usefixtures("riscv")
async def test_without_a_runner_for_the_sandbox_runner_true_is_refused(fake: FakeDaytona) -> None:
    s = open_daytona(fake, runner=True)
    with pytest.raises(sandbox.UnsupportedOperationError, match="riscv64"):
        await s.start()
    assert uploads(fake) == 0 and links(fake) == 0
    assert fake.live_sandbox_ids() == []  # the failed start deleted what it created


async def test_runner_none_uses_the_runner_where_there_is_one(fake: FakeDaytona) -> None:
    async with open_daytona(fake, runner=None) as s:
        assert s._runner is not None
        assert (await s.exec("echo", "through the runner")).stdout == b"through the runner\n"
        assert s.ref().options["runner"] is True


async def test_the_default_is_the_daemons_processes(fake: FakeDaytona) -> None:
    async with sandbox.open_session("daytona", api_key=KEY, daytona_class=fake.AsyncDaytona) as s:
        assert isinstance(s, DaytonaSession) and s._runner is None
        assert (await s.exec("echo", "plain")).stdout == b"plain\n"
        assert s.ref().options["runner"] is False
    assert uploads(fake) == 0 and "send_session_command_input" not in fake.calls


def test_runner_must_be_a_bool_or_none() -> None:
    with pytest.raises(sandbox.InvalidArgumentError, match="runner"):
        sandbox.open_session("daytona", api_key=KEY, runner="yes")


async def test_a_dropped_link_loses_the_processes_and_the_next_session_has_the_runner(
    fake: FakeDaytona,
) -> None:
    async with open_daytona(fake, keep=True) as s:
        started = await s.pty_exec_start("echo up; sleep 600", yield_time_s=5, until="up")
        pid = runner_pid(s)
        sandbox_id = s.sandbox_id
        # The link's log stream dies (a connection Daytona dropped): the reader ends it.
        assert fake.drop_streams("stream reset") == 1
        with pytest.raises(sandbox.ConnectionLostError):
            await s.exec("echo", "never")
        last = await s.pty_write_stdin(started.process_id, "", yield_time_s=1)
        assert "process lost" in last.output and last.exit_code is None
    # The runner did not end with its link: the next client reaches it.
    async with open_daytona(fake, sandbox_id=sandbox_id) as again:
        assert runner_pid(again) == pid
        assert (await again.exec("echo", "back")).stdout == b"back\n"


@pytest.mark.parametrize("point", ["upload_file", "execute_session_command"])
async def test_a_start_cancelled_while_the_runner_is_put_in_leaves_nothing(
    fake: FakeDaytona, point: str
) -> None:
    gate = fake.block(point)
    s = open_daytona(fake)
    task = asyncio.ensure_future(s.start())
    await gate.reached.wait()
    task.cancel()
    gate.release()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert fake.live_sandbox_ids() == []
    assert await eventually(lambda: fake.leftover_pids() == []), describe_pids(fake.leftover_pids())
    assert await eventually(lambda: fake.open_streams() == [])
