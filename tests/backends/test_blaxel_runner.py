"""The `blaxel` backend with the runner (docs/runner.md), against the loopback
`BlaxelServer`: the runner really runs in the stand-in sandbox (a local process in the
sandbox's own runner folder), written there through the filesystem API and reached by
a bridge typed into one of the sandbox's terminals (`connect --text --ready`, toolkit
`runner_terminal`), its frames as base64 lines.

What it is for, each beside the plain path in the same test: lossless bytes (all 256
byte values and UTF-8 split across the server's 4096-byte reads, on a terminal, on pipes
and in a one-shot command, where the server's conversion gives U+FFFD), an open stdin
ended by `pty_close_stdin`, replay after a resume. And: delivery by content hash (a
second client finds the file and the running runner), whole-tree kills, a start
cancelled while the runner is put in or while its link opens leaves nothing, and
Blaxel's own terminals where this install has no runner for the sandbox's machine
(`runner=None`) or a refusal (`runner=True`).
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import stat
from collections import defaultdict
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("blaxel", reason="the blaxel extra is not installed")
pytest.importorskip("aiohttp", reason="the blaxel extra is not installed")

import sandbox
from sandbox.backends.blaxel import BlaxelSession
from sandbox.process_entry import PtyEntry
from sandbox.runner import runner_binary
from sandbox.testing.blaxel_server import BlaxelServer
from tests.helpers import (
    describe_pids,
    eventually,
    host_pids_with_arg,
    require_runner,
    runner_pid,
    unique_seconds,
)

ALL_BYTES = bytes(range(256))
# 20000 euro signs (3 bytes each): the server's 4096-byte reads split some of them.
EUROS = "\u20ac".encode() * 20000
REPLACEMENT = "\ufffd".encode()


@pytest.fixture(autouse=True)
def _runner_built() -> None:
    require_runner("blaxel runner")


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[BlaxelServer]:
    # The server converts terminal output as the real one does (`go_utf8=True`).
    srv = BlaxelServer(root=str(tmp_path))
    await srv.start()
    yield srv
    await srv.close()
    # Deleting a sandbox ends the runner and everything it kept, and its folder.
    assert await eventually(lambda: srv.leftover_pids() == [], timeout=15), describe_pids(
        srv.leftover_pids()
    )
    assert not [folder for folder in srv.runner_dirs() if os.path.exists(folder)]


def open_blaxel(server: BlaxelServer, tmp_path: Path, **options: Any) -> BlaxelSession:
    options.setdefault("runner", True)
    options.setdefault("workdir", str(tmp_path / "ws"))
    options.setdefault("terminate_grace_s", 0.3)
    s = sandbox.open_session("blaxel", **server.backend_options(**options))
    assert isinstance(s, BlaxelSession)
    return s


def resume(server: BlaxelServer, ref: sandbox.SessionRef) -> BlaxelSession:
    s = sandbox.resume_session(ref, **server.backend_options())
    assert isinstance(s, BlaxelSession)
    return s


def uploads(server: BlaxelServer) -> int:
    """How many times the runner's bytes were written."""
    return sum(
        1 for method, path in server.requests if method == "PUT" and ".sandbox-runner-" in path
    )


def links(server: BlaxelServer) -> int:
    """How many terminals were opened (only the runner's links, in these tests)."""
    return len(server.terminals)


@pytest.fixture
def raw_output(monkeypatch: pytest.MonkeyPatch) -> dict[int, bytearray]:
    """The bytes each process's record was fed, by process id (what the session keeps
    before any decoding of its own)."""
    captured: dict[int, bytearray] = defaultdict(bytearray)
    feed = PtyEntry.feed

    def spy(entry: PtyEntry[Any], data: bytes) -> None:
        captured[entry.process_id] += data
        feed(entry, data)

    monkeypatch.setattr(PtyEntry, "feed", spy)
    return captured


@pytest.mark.parametrize("tty", [True, False], ids=["tty", "pipes"])
async def test_every_byte_and_split_utf8_come_back_exact_where_the_server_replaces_them(
    server: BlaxelServer, tmp_path: Path, raw_output: dict[int, bytearray], tty: bool
) -> None:
    sent = ALL_BYTES + EUROS
    # A terminal's output processing turns each newline into CR LF (ONLCR).
    expected = sent.replace(b"\n", b"\r\n") if tty else sent
    results: dict[bool, tuple[bytes, sandbox.ExecResult]] = {}
    for runner in (True, False):
        async with open_blaxel(server, tmp_path, runner=runner) as s:
            await s.write_file("bytes.bin", sent)
            raw_output.clear()
            done = await s.pty_exec_start(
                "cat bytes.bin", tty=tty, yield_time_s=20, max_output_tokens=None
            )
            assert done.exit_code == 0
            [printed] = raw_output.values()
            one_shot = await s.exec("cat bytes.bin; cat bytes.bin >&2")
            results[runner] = (bytes(printed), one_shot)
    through_runner, plain = results[True], results[False]
    assert through_runner[0] == expected
    assert through_runner[1].stdout == sent and through_runner[1].stderr == sent
    # Blaxel's own path: the server's text conversion replaced bytes (one-shot output
    # comes back as JSON text as well).
    assert plain[0] != expected and REPLACEMENT in plain[0]
    assert plain[1].stdout != sent


async def test_output_printed_while_detached_is_replayed_after_resume(
    server: BlaxelServer, tmp_path: Path
) -> None:
    work = tmp_path / "ws"
    script = (
        "echo early; while [ ! -e go ]; do sleep 0.02; done; "
        "echo late-1; echo late-2; touch finished; exit 3"
    )
    async with open_blaxel(server, tmp_path) as s:
        waiting = await s.pty_exec_start(script, tty=True, yield_time_s=5, until="early")
        assert "early" in waiting.output
        ticking = await s.pty_exec_start(
            "for i in 1 2 3; do echo tick-$i; done; exec sleep 600",
            tty=False,
            yield_time_s=5,
            until="tick-3",
        )
        pid = runner_pid(s)
        ref = await s.detach()
    assert ref.keeps_processes is True and ref.options["runner"] is True
    assert all(p.running and "runner_id" in p.handle for p in ref.processes)
    (work / "go").write_bytes(b"")
    assert await eventually(lambda: (work / "finished").exists(), timeout=15)

    async with resume(server, ref) as resumed:
        assert runner_pid(resumed) == pid and uploads(server) == 1
        ids = {info.process_id for info in resumed.pty_processes()}
        assert ids == {waiting.process_id, ticking.process_id}
        last = await resumed.pty_write_stdin(waiting.process_id, "", yield_time_s=10)
        assert "late-1" in last.output and "late-2" in last.output
        assert "early" not in last.output  # the client had read it: not replayed
        assert "not shown" not in last.output
        assert last.exit_code == 3
        alive = await resumed.pty_write_stdin(ticking.process_id, "", yield_time_s=0.2)
        assert alive.exit_code is None and "tick" not in alive.output


async def test_open_stdin_is_ended_by_close_stdin_also_across_a_detach(
    server: BlaxelServer, tmp_path: Path
) -> None:
    async with open_blaxel(server, tmp_path) as s:
        started = await s.pty_exec_start("sort", stdin=True, yield_time_s=0.2)
        await s.pty_write_stdin(started.process_id, "pear\napple\n")
        await s.pty_close_stdin(started.process_id)
        done = await s.pty_write_stdin(started.process_id, "", yield_time_s=10)
        assert done.output == "apple\npear\n" and done.exit_code == 0

        kept = await s.pty_exec_start("sort", stdin=True, yield_time_s=0.2)
        await s.pty_write_stdin(kept.process_id, "cherry\n")
        ref = await s.detach()
    async with resume(server, ref) as resumed:
        await resumed.pty_write_stdin(kept.process_id, "banana\n")
        await resumed.pty_close_stdin(kept.process_id)
        last = await resumed.pty_write_stdin(kept.process_id, "", yield_time_s=10)
        assert last.output == "banana\ncherry\n" and last.exit_code == 0
    # Without the runner no pipe keeps its stdin open: refused before anything starts.
    async with open_blaxel(server, tmp_path, runner=False) as plain:
        with pytest.raises(sandbox.UnsupportedOperationError, match="runner=True"):
            await plain.pty_exec_start("sort", stdin=True)
        assert plain.pty_processes() == []


async def test_a_second_client_finds_the_delivered_runner_by_its_hash(
    server: BlaxelServer, tmp_path: Path
) -> None:
    async with open_blaxel(server, tmp_path, keep=True) as first:
        assert (await first.exec("echo", "one")).stdout == b"one\n"
        pid = runner_pid(first)
        name = first.sandbox_name
    assert uploads(server) == 1 and links(server) == 1
    # The link's terminal ends with its bridge: no session of it is left running.
    assert await eventually(lambda: not any(server.terminal_sessions(name).values()))
    [box] = server.sandboxes.values()
    binary = runner_binary()
    assert binary is not None
    path = Path(box.runner_dir) / f".sandbox-runner-{binary.sha256[:16]}"
    assert hashlib.sha256(path.read_bytes()).hexdigest() == binary.sha256
    assert stat.S_IMODE(path.stat().st_mode) == 0o755
    assert [p.name for p in path.parent.iterdir() if p.name.endswith(".tmp")] == []

    async with open_blaxel(server, tmp_path, sandbox_id=name, keep=True) as second:
        assert runner_pid(second) == pid
        assert (await second.exec("echo", "two")).stdout == b"two\n"
    assert uploads(server) == 1 and links(server) == 2

    # Other bytes at the runner's name are replaced (the running runner is still found).
    path.with_name("impostor").write_bytes(b"#!/bin/sh\necho impostor\n")
    path.with_name("impostor").replace(path)
    async with open_blaxel(server, tmp_path, sandbox_id=name) as third:
        assert runner_pid(third) == pid
        assert hashlib.sha256(path.read_bytes()).hexdigest() == binary.sha256
    assert uploads(server) == 2
    assert server.sandboxes == {}


async def test_a_kill_ends_the_whole_tree_escapees_included(
    server: BlaxelServer, tmp_path: Path
) -> None:
    seconds = unique_seconds()
    async with open_blaxel(server, tmp_path, keep=True) as s:
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
        name = s.sandbox_name
    async with open_blaxel(server, tmp_path, sandbox_id=name):
        pass  # deletes the kept sandbox


async def test_a_start_cancelled_while_the_runner_is_put_in_leaves_nothing(
    server: BlaxelServer, tmp_path: Path
) -> None:
    s = open_blaxel(server, tmp_path)
    blocked = server.stall("write")
    task = asyncio.create_task(s.start())
    await blocked.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert s.state is sandbox.SessionState.NEW and s._runner is None
    server.release()
    assert server.sandboxes == {} and links(server) == 0
    assert await eventually(lambda: server.leftover_pids() == [])
    assert not [folder for folder in server.runner_dirs() if os.path.exists(folder)]


async def test_a_start_cancelled_while_the_link_opens_leaves_nothing(
    server: BlaxelServer, tmp_path: Path
) -> None:
    s = open_blaxel(server, tmp_path, keep=True)
    blocked = server.stall("terminal")
    task = asyncio.create_task(s.start())
    await blocked.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert s.state is sandbox.SessionState.NEW and s._runner is None
    server.release()
    # Kept: the sandbox stays, but no terminal session and no runner were made.
    [box] = server.sandboxes.values()
    assert await eventually(lambda: server.terminal_tasks() == 0)
    assert box.term_sessions == {}
    assert server.leftover_pids() == [] and server.live_processes() == 0
    async with open_blaxel(server, tmp_path, sandbox_id=s.sandbox_name) as again:
        assert (await again.exec("echo", "ok")).stdout == b"ok\n"


async def _sandbox_of_machine(
    server: BlaxelServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, machine: str
) -> None:
    """Every process of the stand-in (this machine) finds a `uname` that says it is a
    `machine` (no runner build)."""
    stubs = tmp_path / "bin"
    stubs.mkdir()
    uname = stubs / "uname"
    uname.write_text(f"#!/bin/sh\necho {machine}\n")
    uname.chmod(0o755)
    monkeypatch.setenv("PATH", f"{stubs}:{os.environ['PATH']}")


async def test_without_a_runner_for_the_sandbox_runner_none_keeps_blaxels_terminals(
    server: BlaxelServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    await _sandbox_of_machine(server, tmp_path, monkeypatch, "riscv64")
    async with open_blaxel(server, tmp_path, runner=None) as s:
        assert s._runner is None
        assert (await s.exec("echo", "plain")).stdout == b"plain\n"
        assert s.ref().options["runner"] is False
    assert uploads(server) == 0 and links(server) == 0
    s = open_blaxel(server, tmp_path, runner=True)
    with pytest.raises(sandbox.UnsupportedOperationError, match="riscv64"):
        await s.start()
    assert uploads(server) == 0 and links(server) == 0 and server.sandboxes == {}


async def test_runner_none_uses_the_runner_where_there_is_one(
    server: BlaxelServer, tmp_path: Path
) -> None:
    async with open_blaxel(server, tmp_path, runner=None) as s:
        assert s._runner is not None
        assert (await s.exec("echo", "through the runner")).stdout == b"through the runner\n"
        assert s.ref().options["runner"] is True


async def test_the_default_is_blaxels_own_terminals(server: BlaxelServer, tmp_path: Path) -> None:
    async with sandbox.open_session(
        "blaxel", workdir=str(tmp_path / "ws"), **server.backend_options()
    ) as s:
        assert isinstance(s, BlaxelSession) and s._runner is None
        assert (await s.exec("echo", "plain")).stdout == b"plain\n"
        assert s.ref().options["runner"] is False
    assert uploads(server) == 0 and links(server) == 0


@pytest.mark.parametrize("value", ["yes", 1, 0.0, []])
def test_runner_must_be_a_bool_or_none(value: object) -> None:
    with pytest.raises(sandbox.InvalidArgumentError, match="runner"):
        sandbox.open_session("blaxel", api_key="k", workspace="w", runner=value)


async def test_a_dropped_link_loses_the_processes_and_the_next_session_has_the_runner(
    server: BlaxelServer, tmp_path: Path
) -> None:
    async with open_blaxel(server, tmp_path, keep=True) as s:
        started = await s.pty_exec_start("echo up; sleep 600", yield_time_s=5, until="up")
        pid = runner_pid(s)
        name = s.sandbox_name
        # The link's socket dies (a connection Blaxel dropped): its reader ends the link.
        assert server.drop_terminals() == 1
        with pytest.raises(sandbox.ConnectionLostError):
            await s.exec("echo", "never")
        last = await s.pty_write_stdin(started.process_id, "", yield_time_s=1)
        assert "process lost" in last.output and last.exit_code is None
    # The runner did not end with its link: the next client reaches it.
    async with open_blaxel(server, tmp_path, sandbox_id=name) as again:
        assert runner_pid(again) == pid
        assert (await again.exec("echo", "back")).stdout == b"back\n"
