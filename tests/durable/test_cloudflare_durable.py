"""Detach, resume, takeover and crash survival on cloudflare, against the loopback bridge
Worker (`sandbox.testing.cloudflare_server`: real sockets, real processes).

Each fact the backend relies on is one the stand-in models from the public source
(docs/providers.md, "Cloudflare", "Durable sessions"): a terminal session outlives its
socket with a 256 KiB ring of its output, replayed to the next socket; a stopped
container is replaced by a fresh one under the same id.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("aiohttp")

import aiohttp

import sandbox
from sandbox.backends.cloudflare.durable import (
    LOST_NOTE,
    PTY_RING_BYTES,
    RING_NOTE,
    CloudflareDurability,
    mark_id,
)
from sandbox.testing.cloudflare_server import CloudflareWorkerServer
from tests.helpers import HookGate, eventually, host_pids_with_arg, unique_seconds

KEY = "cf-durable-key-SECRET-90ab"
WAIT = "while [ ! -e {name} ]; do sleep 0.02; done"


@pytest.fixture(autouse=True)
def _no_key_in_logs(caplog: pytest.LogCaptureFixture):
    caplog.set_level("DEBUG")
    yield
    assert KEY not in caplog.text


@pytest.fixture
async def server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[CloudflareWorkerServer]:
    async with CloudflareWorkerServer(api_key=KEY, root=tmp_path / "worker") as worker:
        # A resume takes no Worker URL from a ref: this client's environment names it.
        monkeypatch.setenv("CLOUDFLARE_SANDBOX_WORKER_URL", worker.url)
        yield worker
        assert worker.live_processes() == 0 or await eventually(
            lambda: worker.live_processes() == 0
        )


def _open(server: CloudflareWorkerServer, **options: Any) -> sandbox.BaseSandboxSession:
    return sandbox.open_session("cloudflare", worker_url=server.url, api_key=KEY, **options)


def _resume(ref: sandbox.SessionRef | str, **options: Any) -> sandbox.BaseSandboxSession:
    return sandbox.resume_session(ref, api_key=KEY, **options)


def _touch(server: CloudflareWorkerServer, sandbox_id: str, name: str) -> None:
    (Path(server.workspace(sandbox_id)) / name).write_bytes(b"")


async def test_output_written_while_detached_comes_once_on_the_first_poll(server):
    session = _open(server)
    await session.start()
    assert session.keeps_processes is True
    started = await session.pty_exec_start(
        f"echo early; {WAIT.format(name='go')}; echo late; exit 4",
        env={"API_TOKEN": "hunter2-SECRET"},
        until="early",
        yield_time_s=10,
    )
    assert "early" in started.output
    ref = await session.detach()
    text = ref.to_json()
    assert KEY not in text and "hunter2" not in text
    [proc] = ref.processes
    assert proc.running and proc.handle["position"] > 0
    sandbox_id = ref.sandbox["sandbox_id"]
    assert server.open_terminals() == 0  # released: sockets closed, nothing killed
    # "late" and the exit are printed with no client attached.
    _touch(server, sandbox_id, "go")
    assert await eventually(lambda: b"\nlate" in _ring(server, sandbox_id, proc.handle["session"]))
    async with _resume(ref) as resumed:
        update = await resumed.pty_write_stdin(started.process_id, "", yield_time_s=10)
        assert "late" in update.output and "early" not in update.output
        assert update.exit_code == 4
    assert sandbox_id in server.deleted


def _ring(server: CloudflareWorkerServer, sandbox_id: str, session: str) -> bytes:
    pty = server.sandboxes[sandbox_id].sessions[session].pty
    return b"" if pty is None else bytes(pty.buffer)


async def test_a_second_detach_keeps_counting_from_the_first_byte(server):
    session = _open(server)
    await session.start()
    started = await session.pty_exec_start(
        f"echo one; {WAIT.format(name='go')}; echo two; {WAIT.format(name='go2')}; echo three",
        until="one",
        yield_time_s=10,
    )
    ref = await session.detach()
    async with _resume(ref) as resumed:
        await resumed.write_file("go", b"")
        update = await resumed.pty_write_stdin(started.process_id, "", until="two")
        assert "two" in update.output and "one" not in update.output
        second = await resumed.detach()
    async with _resume(second) as last:
        await last.write_file("go2", b"")
        update = await last.pty_write_stdin(started.process_id, "", yield_time_s=10)
        assert "three" in update.output
        assert "one" not in update.output and "two" not in update.output
        assert update.exit_code == 0


async def test_a_process_that_ended_while_detached_reports_its_exit_code(server):
    session = _open(server)
    await session.start()
    started = await session.pty_exec_start(
        f"{WAIT.format(name='go')}; echo bye; exit 9", tty=True, yield_time_s=0.2
    )
    ref = await session.detach()
    [proc] = ref.processes
    sandbox_id = ref.sandbox["sandbox_id"]
    _touch(server, sandbox_id, "go")
    pty = server.sandboxes[sandbox_id].sessions[proc.handle["session"]].pty
    assert pty is not None
    assert await eventually(lambda: pty.exit_code is not None)  # the shell is gone
    async with _resume(ref) as resumed:
        done = await resumed.pty_write_stdin(started.process_id, "")
        assert "bye" in done.output and done.exit_code == 9
        assert done.process_id is None


async def test_a_process_whose_session_the_container_lost_is_ended_with_a_note(server):
    session = _open(server)
    await session.start()
    marker = unique_seconds()
    started = await session.pty_exec_start(f"exec sleep {marker}", yield_time_s=0.2)
    ref = await session.detach()
    [proc] = ref.processes
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {KEY}"}) as http:
        url = f"{server.url}/v1/sandbox/{ref.sandbox['sandbox_id']}/session/"
        async with http.delete(url + proc.handle["session"]) as resp:
            assert resp.status == 200
    assert await eventually(lambda: host_pids_with_arg(marker) == [])
    async with _resume(ref) as resumed:
        [info] = resumed.pty_processes()
        assert info.process_id == started.process_id and not info.running
        update = await resumed.pty_write_stdin(started.process_id, "")
        assert LOST_NOTE in update.output
        # The look for the session made none that lingers.
        assert proc.handle["session"] not in server.sandboxes[ref.sandbox["sandbox_id"]].sessions


async def test_output_past_the_ring_is_noted_and_its_tail_kept(server):
    session = _open(server, output_limit_bytes=4 * PTY_RING_BYTES)
    await session.start()
    started = await session.pty_exec_start(
        f"echo first-line; {WAIT.format(name='go')}; "
        "head -c 400000 /dev/zero | tr '\\0' x; echo; echo the-end; exit 3",
        until="first-line",
        yield_time_s=10,
    )
    ref = await session.detach()
    [proc] = ref.processes
    sandbox_id = ref.sandbox["sandbox_id"]
    _touch(server, sandbox_id, "go")
    # The echo's own line: the typed command line, which the terminal echoes into the
    # ring at once, holds "the-end;" but not this.
    assert await eventually(
        lambda: b"\nthe-end\n" in _ring(server, sandbox_id, proc.handle["session"]), timeout=20
    )
    async with _resume(ref) as resumed:
        update = await resumed.pty_write_stdin(started.process_id, "", yield_time_s=10)
        assert update.output.startswith(f"\n[sandbox: {RING_NOTE}]\n")
        assert "the-end" in update.output and update.exit_code == 3
        assert "first-line" not in update.output
        assert 200_000 < update.output.count("x") < 400_000


async def test_takeover_leaves_the_new_owners_processes_running(server):
    old = _open(server)
    await old.start()
    started = await old.pty_exec_start("cat", tty=True, yield_time_s=0.2)
    ref = old.ref()
    async with _resume(ref) as new:
        with pytest.raises(sandbox.SessionTakenOverError):
            await old.pty_write_stdin(started.process_id, "x\n")
        await old.aclose()  # lets go: no kill, no session delete, no sandbox delete
        assert server.deleted == [] and server.deleted_sessions == []
        echoed = await new.pty_write_stdin(started.process_id, "hello\n", until="hello")
        assert "hello" in echoed.output
        assert [p.running for p in new.pty_processes()] == [True]


async def test_close_racing_a_resume_leaves_one_owner(server):
    old = _open(server)
    await old.start()
    ref = old.ref()
    gate = HookGate(old, "_stop_backend")
    closing = asyncio.ensure_future(old.aclose())
    await gate.reached.wait()  # the close has claimed the lease
    with pytest.raises(sandbox.SessionGoneError):
        async with _resume(ref):
            pass
    gate.release()
    await closing
    assert server.deleted == [ref.sandbox["sandbox_id"]]


async def test_a_replaced_container_is_session_gone(server):
    session = _open(server)
    await session.start()
    await session.write_file("kept.txt", b"kept")
    await session.pty_exec_start("sleep 600", yield_time_s=0.2)
    ref = await session.detach()
    sandbox_id = ref.sandbox["sandbox_id"]
    await server.replace_container(sandbox_id)  # it slept: a fresh container, same id
    with pytest.raises(sandbox.SessionGoneError) as caught:
        async with _resume(ref):
            pass
    assert caught.value.retryable is False
    assert "fresh" in str(caught.value)
    # The look for the mark left nothing in the fresh container; it is not deleted (the
    # id is not this ref's any more).
    assert mark_id(ref.session_id) not in server.sandboxes[sandbox_id].sessions
    assert sandbox_id not in server.deleted


async def test_worker_urls_that_could_hold_a_token_stay_out_of_the_ref(server):
    # Same loopback Worker, reached through a path (a token could hide there).
    async with _open(server) as plain:
        assert plain.ref().options["worker_url"] == server.url
    session = sandbox.open_session(
        "cloudflare", worker_url=server.url + "/", api_key=KEY, keep=True
    )
    async with session:
        assert session.ref().options["worker_url"] == server.url
    for url in (
        "https://user:SECRET@w.example.com",
        "https://w.example.com/SECRET",
        "https://w.example.com/?t=SECRET",
    ):
        cf = sandbox.open_session("cloudflare", worker_url=url, api_key=KEY)
        assert "worker_url" not in CloudflareDurability(cf).ref_options({})


async def test_sigkilled_client_leaves_its_process_running_until_the_resume(server, tmp_path):
    from tests.durable.crash import crash_with_a_process

    marker = unique_seconds()
    ref_file = tmp_path / "ref.json"
    process_id = await crash_with_a_process(
        "cloudflare",
        {"worker_url": server.url, "api_key": KEY},
        ref_file,
        ["sh", "-c", f"echo before; {WAIT.format(name='go')}; echo after; exec sleep {marker}"],
    )
    # The container keeps the terminal with nobody attached.
    assert host_pids_with_arg(marker) == []
    assert await eventually(lambda: server.open_terminals() == 0)
    ref = sandbox.read_ref_file(ref_file)
    assert KEY not in ref_file.read_text()
    sandbox_id = ref.sandbox["sandbox_id"]
    _touch(server, sandbox_id, "go")
    assert await eventually(lambda: host_pids_with_arg(marker) != [])
    async with _resume(ref) as s:
        [info] = s.pty_processes()
        assert info.process_id == process_id and info.running
        update = await s.pty_write_stdin(process_id, "", until="after")
        assert "after" in update.output  # printed after the crash, while nobody read
    assert sandbox_id in server.deleted
    assert await eventually(lambda: host_pids_with_arg(marker) == [])


async def test_a_resume_that_won_the_lease_makes_the_old_close_let_go(server):
    old = _open(server)
    await old.start()
    started = await old.pty_exec_start("cat", tty=True, yield_time_s=0.2)
    ref = old.ref()
    new = _resume(ref)
    gate = HookGate(new, "durability.reattach")  # the lease is the new client's by now
    starting = asyncio.ensure_future(new.start())
    await gate.reached.wait()
    await old.aclose()  # its claim fails: it lets go, deletes nothing
    assert server.deleted == [] and server.deleted_sessions == []
    gate.release()
    await starting
    async with new:
        echoed = await new.pty_write_stdin(started.process_id, "still\n", until="still")
        assert "still" in echoed.output
    assert server.deleted == [ref.sandbox["sandbox_id"]]


@pytest.mark.parametrize("point", ["running", "session_create", "exec", "pty_ready"])
async def test_a_resume_cancelled_inside_a_request_leaves_the_ref_the_owner(server, point):
    """Each request of a resume (the attach, the mark's and the session's looks, the
    lease, the terminal's handshake) parked at the Worker and cancelled there: nothing
    is left open, and the ref resumes afterwards with its process still running."""
    session = _open(server)
    await session.start()
    started = await session.pty_exec_start(
        f"echo one; {WAIT.format(name='go')}; echo two", until="one", yield_time_s=10
    )
    ref = await session.detach()
    stall = server.stall(point)
    resumed = _resume(ref)
    starting = asyncio.ensure_future(resumed.start())
    await stall.reached.wait()
    starting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await starting
    await stall.abandoned.wait()
    stall.release()
    assert resumed.state is sandbox.SessionState.NEW
    assert await eventually(lambda: server.open_terminals() == 0)
    [proc] = ref.processes
    assert proc.handle["session"] in server.sandboxes[ref.sandbox["sandbox_id"]].sessions
    server.faults.gates.clear()
    async with _resume(ref) as again:
        await again.write_file("go", b"")
        update = await again.pty_write_stdin(started.process_id, "", yield_time_s=10)
        assert "two" in update.output and "one" not in update.output


async def test_a_close_that_cannot_read_the_lease_lets_go_and_says_so(
    server: CloudflareWorkerServer, tmp_path: Path
) -> None:
    """The lease read at the start of a close fails: the close cannot tell whether a new
    owner holds the sandbox, so it tears nothing down, releases its own clients (strict
    pytest fails on a socket left open), keeps the ref file, and raises the reason."""
    ref_file = tmp_path / "ref.json"
    session = _open(server, ref_file=ref_file)
    await session.start()
    marker = unique_seconds()
    update = await session.pty_exec_start(f"exec sleep {marker}", tty=False, yield_time_s=0.1)
    sandbox_id = session.ref().sandbox["sandbox_id"]
    server.fail("exec", 500, times=1)  # the close's lease read
    with pytest.raises(sandbox.CleanupError, match="left running") as info:
        await session.aclose()
    assert "the API key" not in str(info.value) and KEY not in str(info.value)
    assert session.state is sandbox.SessionState.CLOSED
    assert host_pids_with_arg(marker), "the close killed what it could not prove it owns"
    assert server.open_terminals() == 0
    # The ref file still finds the sandbox and its process: the next client closes it.
    async with _resume(sandbox.read_ref_file(ref_file)) as resumed:
        assert resumed.ref().sandbox["sandbox_id"] == sandbox_id
        assert [p.process_id for p in resumed.pty_processes()] == [update.process_id]
    assert await eventually(lambda: not host_pids_with_arg(marker))
