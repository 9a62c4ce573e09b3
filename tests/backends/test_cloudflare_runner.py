"""The `cloudflare` backend with the runner (docs/runner.md), through the loopback Worker:
the runner really runs in the stand-in's container (a local process in its own runner
folder), written there by the file route and reached over a terminal of its own
(`toolkit.TerminalLink`: `connect --text --start --ready`).

Delivery by content hash (a second client finds the file and the running runner), all
256 byte values both ways on a terminal and on pipes, an open stdin ended by
`pty_close_stdin` (which the bridge's terminals cannot give), a resume that replays what
a process printed meanwhile and the exit code of one that ended, whole-tree kills, a
start cancelled while the runner is put in or while its link opens, and the option's
values.
"""

from __future__ import annotations

import asyncio
import hashlib
import stat
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

import sandbox
from sandbox.backends.cloudflare import CloudflareSession
from sandbox.runner import runner_binary
from sandbox.session import SessionState
from sandbox.testing.cloudflare_server import CloudflareWorkerServer
from tests.helpers import (
    describe_pids,
    eventually,
    host_pids_with_arg,
    require_runner,
    runner_pid,
    unique_seconds,
)

KEY = "cf-runner-test-key-3c9d"
ALL_BYTES = bytes(range(256))


@pytest.fixture(autouse=True)
def _runner_built() -> None:
    require_runner("cloudflare runner")


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[CloudflareWorkerServer]:
    async with CloudflareWorkerServer(api_key=KEY, root=tmp_path / "worker") as srv:
        yield srv
    # The container's end takes the runner and everything it kept, and its folder.
    assert await eventually(lambda: srv.leftover_pids() == [], timeout=15), describe_pids(
        srv.leftover_pids()
    )
    assert srv.leftover_runner_dirs() == []


def open_cf(server: CloudflareWorkerServer, **options: Any) -> CloudflareSession:
    options.setdefault("runner", True)
    s = sandbox.open_session("cloudflare", worker_url=server.url, api_key=KEY, **options)
    assert isinstance(s, CloudflareSession)
    return s


def uploads(server: CloudflareWorkerServer) -> int:
    """How many files were PUT (only the runner, in these tests)."""
    return sum(1 for r in server.requests if r.endpoint == "file_put")


def terminals(server: CloudflareWorkerServer) -> int:
    """How many terminal sockets were asked for (each link opens one)."""
    return sum(1 for r in server.requests if r.endpoint == "pty")


async def test_a_second_client_finds_the_delivered_runner_by_its_hash(
    server: CloudflareWorkerServer,
) -> None:
    async with open_cf(server, keep=True) as first:
        assert (await first.exec("echo", "one")).stdout == b"one\n"
        pid = runner_pid(first)
        sandbox_id = first.sandbox_id
        assert sandbox_id is not None
    assert uploads(server) == 1 and terminals(server) == 1
    box = server.sandboxes[sandbox_id]
    # The link's bridge session was deleted at close (and the mark of a kept sandbox).
    assert box.sessions == {}
    binary = runner_binary()
    assert binary is not None
    path = Path(box.runner_dir) / f".sandbox-runner-{binary.sha256[:16]}"
    assert hashlib.sha256(path.read_bytes()).hexdigest() == binary.sha256
    assert stat.S_IMODE(path.stat().st_mode) == 0o755
    assert [p.name for p in Path(box.root).iterdir() if p.name.endswith(".tmp")] == []

    async with open_cf(server, sandbox_id=sandbox_id, keep=True) as second:
        assert runner_pid(second) == pid
        assert (await second.exec("echo", "two")).stdout == b"two\n"
    assert uploads(server) == 1 and terminals(server) == 2

    # Other bytes at the runner's name are replaced (the running runner is still found).
    other = path.with_name("impostor")  # the running file's bytes cannot be written
    other.write_bytes(b"#!/bin/sh\necho impostor\n")
    other.replace(path)
    async with open_cf(server, sandbox_id=sandbox_id) as third:
        assert runner_pid(third) == pid
        assert hashlib.sha256(path.read_bytes()).hexdigest() == binary.sha256
    assert uploads(server) == 2
    assert sandbox_id in server.deleted


async def test_every_byte_value_round_trips_on_a_terminal_and_on_pipes(
    server: CloudflareWorkerServer,
) -> None:
    async with open_cf(server) as s:
        await s.write_file("bytes.bin", ALL_BYTES)
        result = await s.exec("cat bytes.bin; cat bytes.bin >&2")
        assert result.stdout == ALL_BYTES and result.stderr == ALL_BYTES
        for tty in (True, False):
            # Out: what the process printed, as the session holds it before decoding
            # (a raw terminal changes nothing).
            raw = "stty raw -echo; " if tty else ""
            started = await s.pty_exec_start(
                f"{raw}while [ ! -e go ]; do sleep 0.02; done; cat bytes.bin",
                tty=tty,
                yield_time_s=0.1,  # it waits for `go`: the window has nothing to show
            )
            [entry] = [e for e in s._core.processes.entries() if e.process_id == started.process_id]
            await s.write_file("go", b"")
            assert await eventually(lambda entry=entry: entry.exited, timeout=15)
            assert b"".join(entry.output.since(entry.output.start_pos)).endswith(ALL_BYTES)
            await s.exec("rm go")
            # In: every byte typed into a raw terminal, or written to an open stdin.
            command = "stty raw -echo; echo ready; head -c 256 > got.bin; echo done"
            started = await s.pty_exec_start(
                command if tty else "cat > got.bin",
                tty=tty,
                stdin=not tty,
                until="ready" if tty else None,
                yield_time_s=5 if tty else 0.1,  # `cat` prints nothing
            )
            # (On pipes `cat` ends only at close_stdin: a short window.)
            done = await s.pty_write_stdin(
                started.process_id, ALL_BYTES, yield_time_s=5 if tty else 0.1
            )
            if not tty:
                await s.pty_close_stdin(started.process_id)
            if done.exit_code is None:
                done = await s.pty_write_stdin(started.process_id, "", yield_time_s=10)
            assert done.exit_code == 0
            assert await s.read_file("got.bin") == ALL_BYTES


async def test_open_stdin_is_ended_by_close_stdin_also_across_a_detach(
    server: CloudflareWorkerServer,
) -> None:
    async with open_cf(server) as s:
        started = await s.pty_exec_start("sort", stdin=True, yield_time_s=0.2)
        await s.pty_write_stdin(started.process_id, "pear\napple\n")
        await s.pty_close_stdin(started.process_id)
        done = await s.pty_write_stdin(started.process_id, "", yield_time_s=10)
        assert done.output == "apple\npear\n" and done.exit_code == 0

        kept = await s.pty_exec_start("sort", stdin=True, yield_time_s=0.2)
        await s.pty_write_stdin(kept.process_id, "cherry\n")
        ref = await s.detach()
    async with sandbox.resume_session(ref, worker_url=server.url, api_key=KEY) as resumed:
        await resumed.pty_write_stdin(kept.process_id, "banana\n")
        await resumed.pty_close_stdin(kept.process_id)
        last = await resumed.pty_write_stdin(kept.process_id, "", yield_time_s=10)
        assert last.output == "banana\ncherry\n" and last.exit_code == 0


async def test_without_the_runner_open_stdin_is_refused_before_anything_starts(
    server: CloudflareWorkerServer,
) -> None:
    async with open_cf(server, runner=False) as s:
        with pytest.raises(sandbox.UnsupportedOperationError, match="runner"):
            await s.pty_exec_start("sort", stdin=True)
        assert s.pty_processes() == []
    assert terminals(server) == 0


@pytest.mark.parametrize("tty", [True, False], ids=["tty", "pipes"])
async def test_output_printed_while_detached_is_replayed_after_resume(
    server: CloudflareWorkerServer, tty: bool
) -> None:
    script = (
        "echo early; while [ ! -e go ]; do sleep 0.02; done; "
        "echo late-1; echo late-2; touch finished; exit 3"
    )
    async with open_cf(server) as s:
        waiting = await s.pty_exec_start(script, tty=tty, yield_time_s=5, until="early")
        assert "early" in waiting.output
        ticking = await s.pty_exec_start(
            "for i in 1 2 3; do echo tick-$i; done; exec sleep 600",
            tty=tty,
            yield_time_s=5,
            until="tick-3",
        )
        pid = runner_pid(s)
        assert s.sandbox_id is not None
        home = Path(server.workspace(s.sandbox_id))
        ref = await s.detach()
    assert ref.keeps_processes is True and ref.options["runner"] is True
    assert all(p.running and "runner_id" in p.handle for p in ref.processes)
    (home / "go").write_bytes(b"")
    assert await eventually(lambda: (home / "finished").exists(), timeout=15)

    async with sandbox.resume_session(ref, worker_url=server.url, api_key=KEY) as resumed:
        assert isinstance(resumed, CloudflareSession)
        assert runner_pid(resumed) == pid and uploads(server) == 1
        ids = {info.process_id for info in resumed.pty_processes()}
        assert ids == {waiting.process_id, ticking.process_id}
        last = await resumed.pty_write_stdin(waiting.process_id, "", yield_time_s=10)
        assert "late-1" in last.output and "late-2" in last.output
        assert "early" not in last.output  # the client had read it: not replayed
        assert last.exit_code == 3
        alive = await resumed.pty_write_stdin(ticking.process_id, "", yield_time_s=0.2)
        assert alive.exit_code is None and "tick" not in alive.output


async def test_a_kill_ends_the_whole_tree_escapees_included(
    server: CloudflareWorkerServer,
) -> None:
    seconds = unique_seconds()
    async with open_cf(server, keep=True) as s:
        started = await s.pty_exec_start(
            f"sleep {seconds} & setsid sleep {seconds} & echo up; wait",
            yield_time_s=5,
            until="up",
        )
        assert await eventually(lambda: len(host_pids_with_arg(seconds)) == 2)
        execs = sum(1 for r in server.requests if r.endpoint == "exec")
        await s.pty_terminate(started.process_id)
        # Kept sandbox: nothing but the runner ended them (no kill script exec).
        assert await eventually(lambda: host_pids_with_arg(seconds) == [])
        assert sum(1 for r in server.requests if r.endpoint == "exec") == execs
        assert (await s.exec("echo", "after")).stdout == b"after\n"


async def cancel_when_reached(coro: Any, reached: asyncio.Event) -> asyncio.Task[Any]:
    """Run `coro`, cancel it once the server signals that it holds the request."""
    task = asyncio.ensure_future(coro)
    waiter = asyncio.ensure_future(reached.wait())
    await asyncio.wait([task, waiter], return_when=asyncio.FIRST_COMPLETED)
    assert not task.done(), f"finished before the server held it: {task.result()!r}"
    await waiter
    task.cancel()
    return task


@pytest.mark.parametrize("point", ["file_put", "session_create", "pty_ready"])
async def test_a_start_cancelled_while_the_runner_is_put_in_or_linked_leaves_nothing(
    server: CloudflareWorkerServer, point: str
) -> None:
    # A kept sandbox, so that nothing is cleaned up by its deletion.
    async with open_cf(server, runner=False, keep=True) as plain:
        sandbox_id = plain.sandbox_id
    assert sandbox_id is not None
    box = server.sandboxes[sandbox_id]
    stall = server.stall(point)
    s = open_cf(server, sandbox_id=sandbox_id, keep=True)
    task = await cancel_when_reached(s.start(), stall.reached)
    if point == "file_put":
        # The PUT is the session's own task: the cancelled start waits for its answer
        # (the Worker writes what it got), then removes the temporary file.
        stall.release()
    else:
        await stall.abandoned.wait()
        stall.release()
    with pytest.raises(asyncio.CancelledError):
        await task
    await server.wait_idle()
    assert s.state is SessionState.NEW and s._runner is None
    # No bridge session, no terminal, no process; no temporary upload.
    assert box.sessions == {} and server.open_terminals() == 0
    assert server.live_processes() == 0
    assert [p.name for p in Path(box.root).iterdir() if p.name.endswith(".tmp")] == []
    if point == "file_put":
        assert uploads(server) == 1 and not any(Path(box.runner_dir).iterdir())
    async with s:  # the same session starts again
        assert (await s.exec("echo", "up")).stdout == b"up\n"


async def test_runner_none_uses_the_runner_where_there_is_one(
    server: CloudflareWorkerServer,
) -> None:
    async with open_cf(server, runner=None) as s:
        assert s._runner is not None
        assert (await s.exec("echo", "through")).stdout == b"through\n"
        assert s.ref().options["runner"] is True


async def test_the_default_is_the_bridges_terminals(server: CloudflareWorkerServer) -> None:
    async with sandbox.open_session("cloudflare", worker_url=server.url, api_key=KEY) as s:
        assert isinstance(s, CloudflareSession) and s._runner is None
        assert (await s.exec("echo", "plain")).stdout == b"plain\n"
        assert s.ref().options["runner"] is False
    assert uploads(server) == 0 and terminals(server) == 0


def test_runner_must_be_a_bool_or_none() -> None:
    with pytest.raises(sandbox.InvalidArgumentError, match="runner"):
        sandbox.open_session(
            "cloudflare", worker_url="http://127.0.0.1:9", api_key=KEY, runner="yes"
        )
