"""cloudflare specifics: the Worker protocol's quirks, every injected fault, cancellation
while a request is blocked on the server (signal-based), leaks, and the API key.

Everything runs against `sandbox.testing.cloudflare_server` on loopback: real sockets,
real processes behind it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import shutil
import sys
import traceback
import tracemalloc
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

import sandbox
from sandbox.backends.cloudflare import (
    API_KEY_ENV,
    WORKER_URL_ENV,
    CloudflareSession,
    WorkerTerminal,
    exit_status,
)
from sandbox.backends.cloudflare.bounds import (
    MAX_JSON_BODY,
    MAX_PRE_READY,
    MAX_SSE_EVENT,
    MAX_WS_MESSAGE,
)
from sandbox.backends.cloudflare.sse import SseDecoder, SseEvent
from sandbox.backends.toolkit import TAG_VARIABLE, wrapper_argv
from sandbox.session import SessionState
from sandbox.testing.cloudflare_server import CloudflareWorkerServer
from tests.helpers import children_of_me, eventually, host_pids_with_arg, open_fds, unique_seconds

KEY = "cf-test-key-SECRET-5b1e90"
AUTH = {"Authorization": f"Bearer {KEY}"}


def other_tasks() -> set[asyncio.Task[Any]]:
    return {t for t in asyncio.all_tasks() if t is not asyncio.current_task()}


@pytest.fixture(autouse=True)
def key_never_logged(caplog: pytest.LogCaptureFixture) -> Any:
    """Every test runs with DEBUG logging captured; the key must never appear in it."""
    caplog.set_level(logging.DEBUG)
    yield
    assert KEY not in caplog.text


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[CloudflareWorkerServer]:
    """A loopback Worker; on exit, checks that nothing leaked: tasks, fds, children."""
    fds, kids, tasks = open_fds(), children_of_me(), other_tasks()
    async with CloudflareWorkerServer(api_key=KEY, root=tmp_path / "worker") as srv:
        yield srv
    for _ in range(10):  # closed transports release their sockets on the next iterations
        await asyncio.sleep(0)
    assert other_tasks() <= tasks, "a task outlived the session and the server"
    assert children_of_me() <= kids, "a process outlived the session and the server"
    assert open_fds() <= fds, "a socket or fd leaked"


async def idle(server: CloudflareWorkerServer) -> None:
    """Wait (bounded: a bug must fail, not hang) until the server serves nothing."""
    async with asyncio.timeout(10):
        await server.wait_idle()


def open_cf(server: CloudflareWorkerServer, **options: Any) -> CloudflareSession:
    session = sandbox.open_session("cloudflare", worker_url=server.url, api_key=KEY, **options)
    assert isinstance(session, CloudflareSession)
    return session


def assert_no_secret(*things: object, secret: str = KEY) -> None:
    """`secret` is in none of these (errors: message, repr, formatted traceback and the
    whole cause/context chain, which must not hold aiohttp objects)."""
    for thing in things:
        text = repr(thing) + str(thing)
        if isinstance(thing, BaseException):
            text += "".join(traceback.format_exception(thing))
            seen: BaseException | None = thing
            while seen is not None:
                assert not isinstance(seen, aiohttp.ClientError), (
                    "an aiohttp error (it carries the request headers) is chained to ours"
                )
                text += repr(seen) + repr(vars(seen))
                seen = seen.__cause__ or seen.__context__
        assert secret not in text, f"the secret leaked into {type(thing).__name__}"


# ---- the event-stream decoder ----------------------------------------------------------

STREAM = (
    b": hello\r\n"
    b"event: stdout\rdata: aGk=\r\n\n"
    b"event: stderr\nid: 2\ndata: ZXJy\n\r\n"
    b"event: multi\r\ndata: a\r\ndata:b\r\r"
    b'event: exit\r\ndata: {"exit_code": 0}\r\n\r\n'
)
EXPECTED = [
    SseEvent("stdout", "aGk="),
    SseEvent("stderr", "ZXJy", "2"),
    SseEvent("multi", "a\nb", "2"),
    SseEvent("exit", '{"exit_code": 0}', "2"),
]


def decode_in_pieces(pieces: list[bytes]) -> list[SseEvent]:
    decoder = SseDecoder()
    events = []
    for piece in pieces:
        events += decoder.feed(piece)
    return events + decoder.finish()


def test_sse_every_split_point_gives_the_same_events() -> None:
    for at in range(len(STREAM) + 1):
        assert decode_in_pieces([STREAM[:at], STREAM[at:]]) == EXPECTED, at
    for at in range(1, len(STREAM)):
        for again in range(at, len(STREAM), 7):
            assert decode_in_pieces([STREAM[:at], b"", STREAM[at:again], STREAM[again:]]) == (
                EXPECTED
            )


def test_sse_byte_by_byte_and_cr_lf_across_chunks() -> None:
    assert decode_in_pieces([bytes([b]) for b in STREAM]) == EXPECTED
    # A CR ending one chunk and the LF starting the next are ONE line end: the event
    # must not be dispatched early (that would take "data: x" as an empty line's event).
    decoder = SseDecoder()
    assert decoder.feed(b"event: a\r") == []
    assert decoder.feed(b"") == []
    assert decoder.feed(b"\ndata: x\r") == []
    assert decoder.feed(b"\n\r\n") == [SseEvent("a", "x")]


def test_sse_finish_keeps_an_unterminated_last_event() -> None:
    decoder = SseDecoder()
    assert decoder.feed(b'event: exit\ndata: {"exit_code": 4}') == []
    assert decoder.finish() == [SseEvent("exit", '{"exit_code": 4}')]


def test_negative_exit_codes_mean_signals() -> None:
    assert exit_status(-9) == 137
    assert exit_status(3) == 3
    assert exit_status(None) is None
    assert exit_status(True) is None


# ---- one-shot exec over the event stream -------------------------------------------------


async def test_exec_binary_output_through_split_events(server: CloudflareWorkerServer) -> None:
    payload = bytes(range(256)) * 3000
    async with open_cf(server) as s:
        await s.write_file("data.bin", payload)
        result = await s.exec("cat data.bin; cat data.bin >&2; exit 5")
        assert result.exit_code == 5
        assert result.stdout == payload and result.stderr == payload
        assert (await s.exec("true")).exit_code == 0
        assert (await s.exec("kill -9 $$")).exit_code == 137


async def test_exec_runs_under_the_tagged_wrapper_without_timeout_ms(
    server: CloudflareWorkerServer,
) -> None:
    """The bridge ignores `timeout_ms` on the streaming path (execute-handler.ts), and
    the base session owns the timeout: none is sent. Every command runs under the
    toolkit's wrapper, its kill tag in the environment, then as given."""
    async with open_cf(server) as s:
        await s.exec("true", timeout=2)
        await s.exec("true")
    first, second = server.exec_bodies[0], server.exec_bodies[1]
    assert isinstance(first, dict) and isinstance(second, dict)
    assert "timeout_ms" not in first and "timeout_ms" not in second
    assert first["argv"][0] == "env" and first["argv"][1].startswith(f"{TAG_VARIABLE}=")
    tag = first["argv"][1].split("=", 1)[1]
    assert first["argv"] == wrapper_argv(tag, ["sh", "-c", "true"])
    assert second["argv"][1] != first["argv"][1], "a fresh tag per command"


async def test_the_bridge_applies_no_timeout_and_no_abort(server: CloudflareWorkerServer) -> None:
    """execute-handler.ts: `timeout_ms` is not applied on the streaming path and a
    client going away does not stop the command (the stand-in follows it)."""
    marker = unique_seconds()
    async with aiohttp.ClientSession(headers=AUTH) as http:
        async with http.post(f"{server.url}/v1/sandbox") as resp:
            sandbox_id = (await resp.json())["id"]
        body = {"argv": ["sh", "-c", f"echo a; exec sleep {marker}"], "timeout_ms": 100}
        async with http.post(f"{server.url}/v1/sandbox/{sandbox_id}/exec", json=body) as resp:
            assert await resp.content.readany()
        await idle(server)
        # (It may still be the shell that printed "a", about to exec `sleep`.)
        assert await eventually(lambda: bool(host_pids_with_arg(marker))), "it outlived its client"
        async with http.delete(f"{server.url}/v1/sandbox/{sandbox_id}") as resp:
            assert resp.status == 204
    assert await eventually(lambda: not host_pids_with_arg(marker), timeout=3)


async def test_exec_stream_without_exit_is_a_transport_error(
    server: CloudflareWorkerServer,
) -> None:
    server.exec_omit_exit = True
    async with open_cf(server) as s:
        with pytest.raises(sandbox.ConnectionLostError, match="without an exit status") as info:
            await s.exec("echo hi")
        assert info.value.retryable
        assert_no_secret(info.value)
        server.exec_omit_exit = False
        assert (await s.exec("echo again")).stdout == b"again\n"


async def test_exec_stream_dropped_mid_way(server: CloudflareWorkerServer) -> None:
    marker = unique_seconds()
    server.drop_exec_after_events = 1
    async with open_cf(server) as s:
        with pytest.raises(sandbox.ConnectionLostError) as info:
            await s.exec(f"echo first; exec sleep {marker}")
        assert info.value.retryable
        assert_no_secret(info.value)
        await idle(server)
        assert await eventually(lambda: not host_pids_with_arg(marker), timeout=3)
        server.drop_exec_after_events = None
        assert (await s.exec("echo fine")).ok


async def test_exec_error_event(server: CloudflareWorkerServer) -> None:
    server.exec_error = "the container is not running"
    async with open_cf(server) as s:
        with pytest.raises(sandbox.ProviderError, match="the container is not running") as info:
            await s.exec("echo hi")
        assert not info.value.retryable
        assert not isinstance(info.value, sandbox.ExecTimeoutError)


# ---- HTTP statuses -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "retryable", "words"),
    [
        (503, True, "unavailable"),
        (500, False, "HTTP 500"),
        (400, False, "HTTP 400"),
        (401, False, API_KEY_ENV),
        (404, False, "not found"),
    ],
)
async def test_exec_statuses(
    server: CloudflareWorkerServer, status: int, retryable: bool, words: str
) -> None:
    async with open_cf(server) as s:
        server.fail("exec", status)
        with pytest.raises(sandbox.ProviderError, match=words) as info:
            await s.exec("echo hi")
        assert info.value.retryable is retryable
        assert_no_secret(info.value)
        assert (await s.exec("echo ok")).ok


@pytest.mark.parametrize(("status", "retryable"), [(503, True), (401, False), (500, False)])
async def test_create_statuses_leave_the_session_restartable(
    server: CloudflareWorkerServer, status: int, retryable: bool
) -> None:
    s = open_cf(server)
    server.fail("create", status)
    with pytest.raises(sandbox.ProviderError) as info:
        await s.start()
    assert info.value.retryable is retryable
    assert s.state is SessionState.NEW and s._client.http is None
    assert_no_secret(info.value, s)
    async with s:
        assert (await s.exec("echo hi")).stdout == b"hi\n"
    assert server.sandboxes == {}


async def test_wrong_key_is_a_clear_auth_error(server: CloudflareWorkerServer) -> None:
    wrong = "wrong-key-also-SECRET-77"
    s = sandbox.open_session("cloudflare", worker_url=server.url, api_key=wrong)
    with pytest.raises(sandbox.ProviderError, match="rejected the credentials") as info:
        await s.start()
    assert API_KEY_ENV in str(info.value)
    assert not info.value.retryable
    assert_no_secret(info.value, s, secret=wrong)
    assert [r.authorized for r in server.requests] == [False]


@pytest.mark.parametrize(("status", "retryable"), [(503, True), (401, False), (404, False)])
async def test_refused_terminal_handshake(
    server: CloudflareWorkerServer, status: int, retryable: bool
) -> None:
    async with open_cf(server) as s:
        server.fail("pty", status)
        with pytest.raises(sandbox.ProviderError) as info:
            await s.pty_exec_start("echo hi", tty=True)
        assert info.value.retryable is retryable
        assert_no_secret(info.value)
        assert s.pty_processes() == [] and s._core.processes.reserved == set()
        update = await s.pty_exec_start("echo hi", tty=True)
        assert update.output == "hi\r\n" and update.exit_code == 0


async def test_error_body_echoing_the_key_is_redacted(server: CloudflareWorkerServer) -> None:
    async with open_cf(server) as s:
        server.fail("exec", 400, body=json.dumps({"error": f"bad token {KEY} for exec"}))
        with pytest.raises(sandbox.ProviderError, match="bad token <redacted> for exec") as info:
            await s.exec("true")
        assert_no_secret(info.value)


# ---- files -------------------------------------------------------------------------------


async def test_file_errors_and_quoting(server: CloudflareWorkerServer) -> None:
    async with open_cf(server) as s:
        with pytest.raises(sandbox.SandboxFileNotFoundError) as missing:
            await s.read_file("nope.txt")
        assert isinstance(missing.value, FileNotFoundError)
        asked = len(server.requests)
        for path in ("../outside.txt", "a/../../outside.txt", "/etc/hostname", "/workspace2/x"):
            with pytest.raises(sandbox.WorkspacePathError):
                await s.read_file(path)
            with pytest.raises(sandbox.WorkspacePathError):
                await s.write_file(path, b"x")
        assert len(server.requests) == asked  # refused before any request (stat included)
        name = "dir with space/ü?#%.txt"
        await s.write_file(name, "hé")
        assert await s.read_file(name) == "hé".encode()
        assert (await s.exec("cat 'dir with space/ü?#%.txt'")).stdout == "hé".encode()
        server.fail("file_get", 503)
        with pytest.raises(sandbox.ProviderError) as info:
            await s.read_file(name)
        assert info.value.retryable


async def test_one_shared_client_session_reuses_connections(
    server: CloudflareWorkerServer,
) -> None:
    async with open_cf(server) as s:
        http = s._client.http
        assert http is not None
        for i in range(5):
            await s.write_file(f"f{i}", b"x")
            await s.read_file(f"f{i}")
            await s.exec("true")
        assert s._client.http is http
    assert http.closed and s._client.http is None
    file_ports = {r.client_port for r in server.requests if r.endpoint.startswith("file")}
    assert len(file_ports) == 1, "sequential requests should share one pooled connection"


# ---- sandbox lifecycle -----------------------------------------------------------------------


async def test_keep_then_attach_then_delete(server: CloudflareWorkerServer) -> None:
    async with open_cf(server, keep=True) as first:
        await first.write_file("note.txt", b"kept")
        sandbox_id = first.sandbox_id
    assert sandbox_id in server.sandboxes
    async with open_cf(server, sandbox_id=sandbox_id) as second:
        assert await second.read_file("note.txt") == b"kept"
        assert repr(second).count(str(sandbox_id)) == 1
    assert server.sandboxes == {} and server.deleted == [sandbox_id]


async def test_attach_to_unknown_sandbox(server: CloudflareWorkerServer) -> None:
    """warm-pool.ts `getContainer`: the bridge gives an id without a running container
    (never made, deleted, stopped) a fresh one at its first request, so an attach to it
    succeeds with an empty /workspace; nothing in the bridge tells it apart. (A resume
    does: it looks for its session's container mark, tests/durable.)"""
    async with open_cf(server, sandbox_id="missing") as s:
        assert server.allocated == ["missing"]
        assert (await s.list_dir(".")) == []
    assert server.deleted == ["missing"]


async def test_attach_to_a_sandbox_that_is_not_running(server: CloudflareWorkerServer) -> None:
    async with open_cf(server, keep=True) as first:
        sandbox_id = first.sandbox_id
    assert sandbox_id is not None
    server.stop_sandbox(sandbox_id)
    s = open_cf(server, sandbox_id=sandbox_id)
    with pytest.raises(sandbox.ProviderError, match="not running") as info:
        await s.start()
    assert not info.value.retryable
    assert server.deleted == []


async def test_failed_attach_never_deletes_the_sandbox(server: CloudflareWorkerServer) -> None:
    async with open_cf(server, keep=True) as first:
        sandbox_id = first.sandbox_id
    server.fail("running", 503)
    s = open_cf(server, sandbox_id=sandbox_id)
    with pytest.raises(sandbox.ProviderError) as info:
        await s.start()
    assert info.value.retryable
    assert [r.endpoint for r in server.requests].count("delete") == 0
    async with s:  # the Worker is back: attaching works, and closing deletes it
        assert s.sandbox_id == sandbox_id
    assert server.deleted == [sandbox_id]


async def test_close_tolerates_an_already_deleted_sandbox(server: CloudflareWorkerServer) -> None:
    async with open_cf(server) as s:
        await s.pty_exec_start("echo r; exec cat", tty=True, until="r")
        async with aiohttp.ClientSession(headers=AUTH) as http:
            async with http.delete(f"{server.url}/v1/sandbox/{s.sandbox_id}") as resp:
                assert resp.status == 204
    assert s.state is SessionState.CLOSED


async def test_failed_delete_is_reported_and_still_closes_the_client(
    server: CloudflareWorkerServer,
) -> None:
    s = open_cf(server)
    await s.start()
    http = s._client.http
    assert http is not None
    server.fail("delete", 503)
    with pytest.raises(sandbox.ProviderError) as info:
        await s.aclose()
    assert info.value.retryable
    assert s.state is SessionState.CLOSED and http.closed
    await s.aclose()  # idempotent, and the delete is not retried behind our back
    assert len(server.sandboxes) == 1  # the server's close removes it


async def test_credentials_from_options_or_environment(
    server: CloudflareWorkerServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(WORKER_URL_ENV, raising=False)
    monkeypatch.delenv(API_KEY_ENV, raising=False)
    with pytest.raises(sandbox.CredentialsMissingError, match=WORKER_URL_ENV):
        sandbox.open_session("cloudflare")
    with pytest.raises(sandbox.CredentialsMissingError, match=API_KEY_ENV):
        sandbox.open_session("cloudflare", worker_url=server.url)
    with pytest.raises(sandbox.InvalidArgumentError) as bad:
        sandbox.open_session("cloudflare", worker_url=f"ftp://{KEY}@host", api_key="k")
    assert_no_secret(bad.value)
    monkeypatch.setenv(WORKER_URL_ENV, server.url)
    monkeypatch.setenv(API_KEY_ENV, KEY)
    async with sandbox.open_session("cloudflare") as s:
        assert (await s.exec("echo env")).stdout == b"env\n"


def test_urls_keep_a_path_prefix_and_encode_paths() -> None:
    s = CloudflareSession(worker_url="https://w.example.com/base/?x=1", api_key="k")
    s._client.sandbox_id = "sbx 1"
    assert str(s._client.url()) == "https://w.example.com/base/v1/sandbox"
    assert (
        str(s._client.sandbox_url("exec")) == "https://w.example.com/base/v1/sandbox/sbx%201/exec"
    )
    assert str(s._client.file_url("a b/c?.txt")) == (
        "https://w.example.com/base/v1/sandbox/sbx%201/file/workspace/a%20b/c%3F.txt"
    )


# ---- the terminal WebSocket ----------------------------------------------------------------


async def test_output_before_ready_is_not_lost(server: CloudflareWorkerServer) -> None:
    server.pre_ready_output = b"BANNER-early\r\n"
    async with aiohttp.ClientSession(headers=AUTH) as http:
        async with http.post(f"{server.url}/v1/sandbox") as resp:
            sandbox_id = (await resp.json())["id"]
        ws = await http.ws_connect(f"{server.url}/v1/sandbox/{sandbox_id}/pty?cols=80&rows=24")
        early = await WorkerTerminal.wait_ready(ws)
        # pty-ws-handler.ts: the buffered output in one frame before `ready` (whether the
        # shell's prompt is in it yet depends on timing; the banner always is).
        assert early[0].startswith(b"BANNER-early\r\n")
        expected = list(early)
        terminal = WorkerTerminal(ws, early)
        seen = [(await terminal.next_event()).data for _ in expected]
        assert seen == expected
        await ws.close()
    await idle(server)


async def test_nothing_added_shows_in_pty_output(server: CloudflareWorkerServer) -> None:
    server.pre_ready_output = b"BANNER-early\r\n"
    async with open_cf(server) as s:
        update = await s.pty_exec_start("echo $GREETING; pwd", tty=True, env={"GREETING": "hi"})
        assert update.output == f"hi\r\n{server.workspace(s.sandbox_id or '')}\r\n"
        update = await s.pty_exec_start("pwd; test -t 0 || echo no-stdin-tty", cwd="/")
        assert update.output == "/\nno-stdin-tty\n"
        assert update.exit_code == 0


async def test_error_frame_before_ready(server: CloudflareWorkerServer) -> None:
    server.pty_error_instead_of_ready = f"no capacity for {KEY}"
    async with open_cf(server) as s:
        with pytest.raises(sandbox.ProviderError, match="no capacity for <redacted>") as info:
            await s.pty_exec_start("echo hi", tty=True)
        assert_no_secret(info.value)
        assert s.pty_processes() == [] and s._core.processes.reserved == set()
        await idle(server)
        assert server.live_processes() == 0


async def test_error_frame_mid_stream_is_shown_and_the_process_goes_on(
    server: CloudflareWorkerServer,
) -> None:
    async with open_cf(server) as s:
        update = await s.pty_exec_start("echo ready; exec cat", tty=True, until="ready")
        pid = update.process_id
        assert pid is not None
        assert await server.send_pty_error("disk almost full") == 1
        update = await s.pty_write_stdin(pid, "", until="disk almost full", yield_time_s=10)
        assert "[sandbox: the Worker reported an error: disk almost full]" in update.output
        update = await s.pty_write_stdin(pid, "still\n", until=re.compile("still.*still", re.S))
        assert update.process_id == pid


@pytest.mark.parametrize("tty", [True, False], ids=["tty", "pipes"])
async def test_dropped_socket_ends_the_process(server: CloudflareWorkerServer, tty: bool) -> None:
    marker = unique_seconds()
    async with open_cf(server) as s:
        update = await s.pty_exec_start(f"echo ready; exec sleep {marker}", tty=tty, until="ready")
        pid = update.process_id
        assert pid is not None
        assert server.drop_pty_connections() == 1
        loop = asyncio.get_running_loop()
        started = loop.time()
        final = await s.pty_write_stdin(pid, "", yield_time_s=30)
        assert loop.time() - started < 5, "a dropped socket must end the window, not hang"
        assert final.process_id is None and final.exit_code is None
        assert "process lost" in final.output and "closed before the process exited" in (
            final.output
        )
        assert KEY not in final.output
        await idle(server)
        assert await eventually(lambda: not host_pids_with_arg(marker), timeout=3)


async def test_terminal_not_ready_in_time(server: CloudflareWorkerServer) -> None:
    stall = server.stall("pty_ready")
    async with open_cf(server, ready_timeout_s=0.3) as s:
        with pytest.raises(sandbox.ProviderError, match="not ready within") as info:
            await s.pty_exec_start("echo hi", tty=True)
        assert info.value.retryable
        assert s.pty_processes() == [] and s._core.processes.reserved == set()
        await stall.abandoned.wait()
        stall.release()
        await idle(server)
        assert server.live_processes() == 0


# ---- cancellation while the server holds a request ------------------------------------------


async def cancel_when_reached(coro: Any, reached: asyncio.Event) -> asyncio.Task[Any]:
    """Run `coro`, cancel it once the server signals that it holds the request; returns
    the (cancelled, maybe still settling) task."""
    task = asyncio.ensure_future(coro)
    waiter = asyncio.ensure_future(reached.wait())
    await asyncio.wait([task, waiter], return_when=asyncio.FIRST_COMPLETED)
    assert not task.done(), f"finished before the server held it: {task.result()!r}"
    await waiter
    task.cancel()
    return task


async def test_cancel_start_during_create(server: CloudflareWorkerServer) -> None:
    stall = server.stall("create")
    s = open_cf(server)
    task = await cancel_when_reached(s.start(), stall.reached)
    # The create is the session's own task: the cancelled start waits for its answer
    # (bounded by call_timeout_s) and deletes what the Worker made.
    stall.release()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert s.state is SessionState.NEW and s._client.http is None
    assert server.sandboxes == {}
    async with s:
        assert (await s.exec("echo up")).ok


@pytest.mark.parametrize("point", ["pty", "pty_ready"])
async def test_cancel_start_during_the_handshake(
    server: CloudflareWorkerServer, point: str
) -> None:
    async with open_cf(server) as s:
        stall = server.stall(point)
        task = await cancel_when_reached(s.pty_exec_start("echo hi", tty=True), stall.reached)
        with pytest.raises(asyncio.CancelledError):
            await task
        assert s.pty_processes() == [] and s._core.processes.reserved == set()
        await stall.abandoned.wait()
        stall.release()
        await idle(server)
        assert server.live_processes() == 0 and server.open_terminals() == 0
        assert (await s.pty_exec_start("echo hi", tty=True)).output == "hi\r\n"


@pytest.mark.parametrize("point", ["file_get", "file_put"])
async def test_cancel_file_transfer(server: CloudflareWorkerServer, point: str) -> None:
    async with open_cf(server) as s:
        if point == "file_get":
            await s.write_file("g.txt", b"old")  # a read asks what the path is first
        stall = server.stall(point)
        call = s.read_file("g.txt") if point == "file_get" else s.write_file("f.txt", b"data")
        task = await cancel_when_reached(call, stall.reached)
        with pytest.raises(asyncio.CancelledError):
            await task
        await stall.abandoned.wait()
        stall.release()
        with pytest.raises(sandbox.SandboxFileNotFoundError):
            await s.read_file("f.txt")  # the cancelled write never happened
        await s.write_file("f.txt", b"data")
        assert await s.read_file("f.txt") == b"data"


@pytest.mark.parametrize("point", ["exec", "exec_stream"])
async def test_cancel_exec_kills_the_command(server: CloudflareWorkerServer, point: str) -> None:
    marker = unique_seconds()
    async with open_cf(server) as s:
        stall = server.stall(point)
        task = await cancel_when_reached(s.exec(f"echo first; exec sleep {marker}"), stall.reached)
        await stall.abandoned.wait()
        # The cancelled exec kills its command through a second exec: let that through.
        stall.release()
        with pytest.raises(asyncio.CancelledError):
            await task
        await idle(server)
        assert await eventually(lambda: not host_pids_with_arg(marker), timeout=3)
        assert (await s.exec("echo next")).stdout == b"next\n"


async def test_client_enforces_the_timeout_when_the_worker_stalls(
    server: CloudflareWorkerServer,
) -> None:
    marker = unique_seconds()
    async with open_cf(server) as s:
        stall = server.stall("exec_stream")
        with pytest.raises(sandbox.ExecTimeoutError) as info:
            await s.exec(f"echo first; exec sleep {marker}", timeout=0.5)
        assert info.value.stdout == b"first\n"
        await stall.abandoned.wait()
        stall.release()
        await idle(server)
        assert await eventually(lambda: not host_pids_with_arg(marker), timeout=3)


async def test_cancel_write_in_flight_keeps_the_stream_intact(
    server: CloudflareWorkerServer,
) -> None:
    size = 16 * 1024 * 1024
    async with open_cf(server) as s:
        update = await s.pty_exec_start(
            f"stty raw -echo; echo ready; head -c {size + 1} >/dev/null; echo done",
            tty=True,
            until="ready",
        )
        pid = update.process_id
        assert pid is not None
        stall = server.stall("pty_input")
        await s.pty_write_stdin(pid, "x")  # held by the server: what follows backs up
        await stall.reached.wait()
        task = asyncio.ensure_future(s.pty_write_stdin(pid, b"y" * size))

        def in_flight() -> bool:
            # Filled the socket and blocked in the drain (on a loaded machine the write
            # task may take a while to get there).
            write = s._core.processes.lookup(pid).write_task
            return write is not None and "send_frame" in awaiting(write)

        assert await eventually(in_flight, timeout=10), "the write itself is in flight"
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        stall.release()
        final = await s.pty_write_stdin(pid, "", until="done", yield_time_s=30)
        assert "done" in final.output, "every byte of the cancelled write still arrived whole"


def awaiting(task: asyncio.Task[Any]) -> list[str]:
    """The chain of coroutines `task` is suspended in, outermost first."""
    chain, coro = [], task.get_coro()
    while coro is not None:
        chain.append(getattr(coro, "__qualname__", type(coro).__name__))
        coro = getattr(coro, "cr_await", None)
    return chain


async def test_cancel_terminate_while_the_session_delete_is_in_flight(
    server: CloudflareWorkerServer,
) -> None:
    marker = unique_seconds()
    async with open_cf(server) as s:
        update = await s.pty_exec_start(f"echo ready; exec sleep {marker}", tty=True, until="ready")
        assert update.process_id is not None
        stall = server.stall("session_delete")
        task = await cancel_when_reached(s.pty_terminate(update.process_id), stall.reached)
        await asyncio.sleep(0)
        assert not task.done(), "the teardown is settled: it waits for the delete"
        stall.release()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert s.pty_processes() == [] and s._core.processes.reserved == set()
        await idle(server)
        assert await eventually(lambda: not host_pids_with_arg(marker), timeout=3)


async def test_cancel_close_while_the_delete_is_in_flight(server: CloudflareWorkerServer) -> None:
    marker = unique_seconds()
    s = open_cf(server)
    await s.start()
    http = s._client.http
    assert http is not None
    await s.pty_exec_start(f"echo ready; exec sleep {marker}", tty=True, until="ready")
    stall = server.stall("delete")
    task = await cancel_when_reached(s.aclose(), stall.reached)
    await asyncio.sleep(0)
    assert not task.done(), "the close is settled: it waits for the delete"
    stall.release()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert s.state is SessionState.CLOSED and http.closed
    assert server.sandboxes == {}
    assert await eventually(lambda: not host_pids_with_arg(marker), timeout=3)


# ---- the key stays secret ------------------------------------------------------------------------


async def test_key_not_in_reprs(server: CloudflareWorkerServer) -> None:
    async with open_cf(server) as s:
        update = await s.pty_exec_start("echo r; exec cat", tty=True, until="r")
        assert update.process_id is not None
        entry_handle = s._core.processes.lookup(update.process_id).handle
        assert_no_secret(s, vars(s), entry_handle, s._client.http, server)


async def test_cli_run_against_the_server_never_prints_the_key(
    server: CloudflareWorkerServer,
) -> None:
    env = dict(os.environ, **{WORKER_URL_ENV: server.url, API_KEY_ENV: KEY})
    cli = [sys.executable, "-m", "sandbox.cli", "run", "--backend", "cloudflare", "--"]

    async def run(env: dict[str, str], *command: str) -> tuple[int, str, str]:
        proc = await asyncio.create_subprocess_exec(
            *cli, *command, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
        )
        out, err = await proc.communicate()
        assert proc.returncode is not None
        return proc.returncode, out.decode(), err.decode()

    code, out, err = await run(env, "echo from-cli; exit 4")
    assert (code, out) == (4, "from-cli\n")
    wrong = "wrong-cli-key-SECRET-31"
    code, out, err = await run(dict(env, **{API_KEY_ENV: wrong}), "true")
    assert code == 1 and "rejected the credentials" in err and "Traceback" not in err
    assert wrong not in out + err and KEY not in out + err


# ---- provider fidelity: the real bridge's rules (docs/providers.md, "Cloudflare") ----------


async def test_two_ptys_at_once_each_see_only_their_own_output(
    server: CloudflareWorkerServer,
) -> None:
    """session-manager.ts `getPty`: one PTY per session, shared by every socket."""
    async with open_cf(server) as s:
        a = await s.pty_exec_start("echo AAA-one; exec cat", tty=True, until="AAA-one")
        b = await s.pty_exec_start("echo BBB-two; exec cat", tty=True, until="BBB-two")
        assert a.process_id is not None and b.process_id is not None
        assert "AAA" not in b.output
        more = await s.pty_write_stdin(
            a.process_id, "only-a\n", until=re.compile("only-a.*only-a", re.S)
        )
        assert "BBB" not in more.output
        other = await s.pty_write_stdin(b.process_id, "", yield_time_s=0.3)
        assert "only-a" not in other.output and "AAA" not in other.output
        sessions = {r.session for r in server.requests if r.endpoint == "pty"}
        assert len(sessions) == 2 and None not in sessions


async def test_exit_is_reported_without_an_exit_frame(server: CloudflareWorkerServer) -> None:
    """pty-ws-handler.ts sends `ready` and `error` only: the status comes in-band."""
    async with open_cf(server) as s:
        update = await s.pty_exec_start("echo done; exit 7", tty=True, yield_time_s=10)
        assert update.exit_code == 7 and "done" in update.output
        update = await s.pty_exec_start("echo piped; exit 3", tty=False, yield_time_s=10)
        assert (update.exit_code, update.output) == (3, "piped\n")


async def test_the_legacy_exit_frame_still_works(tmp_path: Path) -> None:
    async with CloudflareWorkerServer(
        api_key=KEY, root=tmp_path / "w", legacy_exit_frame=True
    ) as server:
        async with open_cf(server) as s:
            update = await s.pty_exec_start("echo old; exit 4", tty=True, yield_time_s=10)
            assert update.exit_code == 4 and "old" in update.output
            assert (await s.exec("echo after")).stdout == b"after\n"


async def test_terminate_deletes_the_session_and_kills_the_process(
    server: CloudflareWorkerServer,
) -> None:
    """Closing the socket leaves the PTY running (pty-ws-handler.ts `onClose`)."""
    marker = unique_seconds()
    async with open_cf(server) as s:
        update = await s.pty_exec_start(
            f"echo ready; sleep {marker} & exec sleep {marker}", tty=True, until="ready"
        )
        assert update.process_id is not None
        sid = next(r.session for r in server.requests if r.endpoint == "pty")
        assert await eventually(lambda: len(host_pids_with_arg(marker)) == 2, timeout=5)
        await s.pty_terminate(update.process_id)
        assert sid in server.deleted_sessions
        assert sid not in server.sandboxes[s.sandbox_id or ""].sessions
        assert await eventually(lambda: not host_pids_with_arg(marker), timeout=3)


async def test_relative_file_paths_are_in_the_workspace(server: CloudflareWorkerServer) -> None:
    """routes.ts resolves `'/' + path` under /workspace: relative means the workspace."""
    async with open_cf(server) as s:
        workspace = Path(server.workspace(s.sandbox_id or ""))
        await s.write_file("notes.txt", b"hello")
        assert (workspace / "notes.txt").read_bytes() == b"hello"
        assert await s.read_file("notes.txt") == b"hello"
        assert await s.read_file("/workspace/notes.txt") == b"hello"
        (workspace / "sub").mkdir()
        await s.write_file("sub/x.txt", b"x")
        assert (await s.exec("cat sub/x.txt")).stdout == b"x"
        with pytest.raises(sandbox.WorkspacePathError):
            await s.read_file("/etc/hostname")
        with pytest.raises(sandbox.NotAFileError):
            await s.read_file("sub")


async def test_a_cancelled_exec_is_killed(server: CloudflareWorkerServer) -> None:
    """The bridge passes no abort signal: the backend kills the command itself."""
    marker = unique_seconds()
    async with open_cf(server) as s:
        task = asyncio.ensure_future(s.exec(f"echo go; sleep {marker} & exec sleep {marker}"))
        assert await eventually(lambda: bool(host_pids_with_arg(marker)), timeout=5)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert await eventually(lambda: not host_pids_with_arg(marker), timeout=3)
        with pytest.raises(sandbox.ExecTimeoutError):
            await s.exec(f"exec sleep {marker}", timeout=0.3)
        assert await eventually(lambda: not host_pids_with_arg(marker), timeout=3)


async def test_attach_to_a_stopped_sandbox_says_so(server: CloudflareWorkerServer) -> None:
    """routes.ts `running`: 200 with `{"running": false}`, never an error status."""
    async with open_cf(server, keep=True) as s:
        sandbox_id = s.sandbox_id or ""
    server.stop_sandbox(sandbox_id)
    attach = open_cf(server, sandbox_id=sandbox_id)
    with pytest.raises(sandbox.ProviderError, match="not running") as info:
        await attach.start()
    assert not info.value.retryable
    assert sandbox_id not in server.deleted
    await attach.aclose()


@pytest.mark.parametrize("bad", ["sbx-1", "UPPER", "a" * 129, "with1digit"])
def test_a_bad_sandbox_id_is_an_invalid_argument(bad: str) -> None:
    """routes.ts: ids must match ^[a-z2-7]{1,128}$ (else 400)."""
    with pytest.raises(sandbox.InvalidArgumentError, match="a-z and 2-7"):
        CloudflareSession(worker_url="https://w.example.com", api_key="k", sandbox_id=bad)


@pytest.mark.parametrize("keep", [False, True], ids=["deleted", "kept"])
async def test_close_leaves_terminals_to_the_sandbox_delete_unless_kept(
    server: CloudflareWorkerServer, keep: bool
) -> None:
    """`entry.sandbox_stopping`: when the close deletes the sandbox next, that ends every
    terminal, so no kill exec and no session delete are sent; a kept sandbox still gets
    both, so nothing of ours keeps running in it."""
    marker = unique_seconds()
    async with open_cf(server, keep=keep) as s:
        await s.pty_exec_start(f"echo ready; exec sleep {marker}", tty=True, until="ready")
        sandbox_id = s.sandbox_id
        execs_before = len(server.exec_bodies)
    endpoints = [r.endpoint for r in server.requests]
    # A kept sandbox also loses the session's container mark (backends.cloudflare.durable).
    assert endpoints.count("session_delete") == (2 if keep else 0)
    assert len(server.exec_bodies) - execs_before == (1 if keep else 0)
    assert (sandbox_id in server.sandboxes) is keep
    assert await eventually(lambda: not host_pids_with_arg(marker), timeout=3)


# ---- bounds and deadlines on what the Worker sends -----------------------------------------

# 3000 controls (every C0 but NUL, and DEL): each is typed as a 4-byte octal escape, so
# the typed line is far above the 4095 bytes a canonical-mode tty keeps of a line.
LONG_CONTROLS = ("".join(chr(c) for c in (*range(1, 32), 127)) * 100)[:3000]
# What the client may keep above a bound while a peer floods it (buffers of one read).
SLACK = 3 * 1024 * 1024
FLOOD = 64 * 1024 * 1024


class PeakMemory:
    """The peak of Python allocations (client and stand-in alike) inside the block."""

    def __enter__(self) -> PeakMemory:
        tracemalloc.start()
        self.peak = 0
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()


@pytest.mark.parametrize("tty", [True, False])
async def test_a_long_env_value_of_control_characters_reaches_the_command_whole(
    server: CloudflareWorkerServer, tmp_path: Path, tty: bool
) -> None:
    """The keystroke-safe line grows 4x. The container sends `ready` at once and its
    bash reads the user's ~/.bashrc before readline takes the tty, so the line may
    meet a tty in canonical mode, which keeps 4095 bytes of a line: it goes through a
    file that removes itself. Here the shell's rc file waits until a whole typed line
    is in the tty's queue, so the line always arrives in canonical mode."""
    bash = shutil.which("bash")
    assert bash is not None
    rc = tmp_path / "bashrc"
    rc.write_text("until read -t 0; do sleep 0.01; done\n")
    server.shell = [bash, "--noprofile", "--rcfile", str(rc), "-i"]
    marker = f"m{unique_seconds()}"
    async with open_cf(server) as s:
        update = await s.pty_exec_start(
            f'printf %s "$V" > v.out; echo {marker}',
            tty=tty,
            env={"V": LONG_CONTROLS},
            yield_time_s=20,
        )
        assert update.exit_code == 0, update
        assert await s.read_file("v.out") == LONG_CONTROLS.encode()
    left = [p for p in Path("/tmp").glob(".sandbox-pty-*") if marker.encode() in p.read_bytes()]
    assert left == []


@pytest.mark.parametrize("kind", ["line", "event"])
async def test_an_endless_event_fails_with_bounded_memory(
    server: CloudflareWorkerServer, kind: str
) -> None:
    marker = unique_seconds()
    server.exec_flood = kind
    server.flood_bytes = FLOOD
    async with open_cf(server) as s:
        with (
            PeakMemory() as memory,
            pytest.raises(sandbox.ProviderError, match=r"(long|larg)er than"),
        ):
            await s.exec(f"echo go; exec sleep {marker}")
        assert memory.peak < MAX_SSE_EVENT + SLACK, memory.peak
        assert server.flooded < FLOOD
        # The command it was running is killed like any unfinished one.
        assert await eventually(lambda: not host_pids_with_arg(marker), timeout=5)
        assert (await s.exec("echo still")).stdout == b"still\n"


async def test_a_huge_json_answer_fails_with_bounded_memory(
    server: CloudflareWorkerServer,
) -> None:
    server.oversize("create", FLOOD)
    session = open_cf(server)
    with PeakMemory() as memory, pytest.raises(sandbox.ProviderError, match="larger than"):
        await session.start()
    await session.aclose()
    assert memory.peak < MAX_JSON_BODY + SLACK, memory.peak
    assert server.flooded < FLOOD


async def test_a_huge_file_answer_is_cut_at_max_bytes(server: CloudflareWorkerServer) -> None:
    """The stat said small; the body grew: never more than max_bytes is kept."""
    async with open_cf(server) as s:
        await s.write_file("small.txt", b"x")
        server.oversize("file_get", FLOOD)
        with PeakMemory() as memory, pytest.raises(sandbox.FileTooLargeError) as info:
            await s.read_file("small.txt", max_bytes=1024 * 1024)
        assert info.value.limit == 1024 * 1024
        assert memory.peak < 1024 * 1024 + SLACK, memory.peak
        assert await s.read_file("small.txt") == b"x"


async def test_a_huge_terminal_frame_ends_the_process_with_bounded_memory(
    server: CloudflareWorkerServer,
) -> None:
    server.pty_flood = "frame"
    server.flood_bytes = FLOOD
    async with open_cf(server) as s:
        with PeakMemory() as memory:
            update = await s.pty_exec_start("exec cat", tty=True, yield_time_s=20)
        assert update.exit_code is None and update.process_id is None, update
        assert f"larger than {MAX_WS_MESSAGE} bytes" in update.output
        assert memory.peak < MAX_WS_MESSAGE + SLACK, memory.peak
        assert server.flooded < FLOOD


async def test_output_before_ready_is_bounded(server: CloudflareWorkerServer) -> None:
    server.pty_flood = "early"
    server.flood_bytes = FLOOD
    async with open_cf(server) as s:
        with PeakMemory() as memory, pytest.raises(sandbox.ProviderError, match="before the"):
            await s.pty_exec_start("echo hi", tty=True)
        assert memory.peak < MAX_PRE_READY + SLACK, memory.peak
        assert server.flooded < FLOOD
        update = await s.pty_exec_start("echo hi", tty=True, yield_time_s=20)
        assert update.output == "hi\r\n"


async def test_a_worker_that_never_answers_or_trickles_fails_in_time(
    server: CloudflareWorkerServer,
) -> None:
    """Every request has a deadline: the exec's answer (its headers) too, and a body
    trickling a byte at a time is bounded by the whole request's time."""
    async with open_cf(server, call_timeout_s=0.5) as s:
        stall = server.stall("exec")
        async with asyncio.timeout(20):  # a hang fails the test instead of blocking it
            with pytest.raises(sandbox.ConnectionLostError, match="did not answer in time"):
                await s.exec("true")
        stall.release()
        server.trickle("session_create")
        async with asyncio.timeout(20):
            with pytest.raises(sandbox.ConnectionLostError, match="did not answer in time"):
                await s.pty_exec_start("echo hi", tty=True)
        assert (await s.exec("echo ok")).stdout == b"ok\n"


@pytest.mark.parametrize(
    ("name", "value"),
    [("memory_limit_bytes", 512 * 1024 * 1024), ("process_limit", 64), ("cpu_limit", 1.5)],
)
async def test_resource_limits_are_unsupported(
    server: CloudflareWorkerServer, name: str, value: object
) -> None:
    """routes.ts `POST /sandbox` reads no body: nothing to map a limit to."""
    with pytest.raises(sandbox.UnsupportedOperationError, match=name):
        open_cf(server, **{name: value})
    assert server.requests == []


async def test_no_snapshot_through_the_bridge(server: CloudflareWorkerServer) -> None:
    """routes.ts routes no backup (createBackup/restoreBackup are the Durable Object's
    only): refused before any request, and the file calls still run by exec (the bridge
    routes no listFiles/mkdir/deleteFile either; docs/providers.md)."""
    async with open_cf(server) as s:
        asked = len(server.requests)
        with pytest.raises(sandbox.UnsupportedOperationError, match="routes no backup"):
            await s.snapshot()
        assert len(server.requests) == asked
        await s.make_dir("d/e")
        assert [i.name for i in await s.list_dir("d")] == ["e"]
        await s.remove("d", recursive=True)
        assert {r.endpoint for r in server.requests[asked:]} == {"exec"}


@pytest.mark.parametrize("keep", [False, True], ids=["created", "attached-kept"])
async def test_a_start_cancelled_while_marking_its_container_leaves_nothing(
    server: CloudflareWorkerServer, keep: bool
) -> None:
    """The container mark (`durable.mark`, a session create at start) is a new await
    point of the start: cancelled there, the created sandbox is deleted; an attached,
    kept one stays, without the mark."""
    sandbox_id = None
    if keep:
        async with open_cf(server, keep=True) as first:
            sandbox_id = first.sandbox_id
    s = open_cf(server, sandbox_id=sandbox_id, keep=keep)
    stall = server.stall("session_create")
    starting = asyncio.ensure_future(s.start())
    await stall.reached.wait()
    starting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await starting
    stall.release()
    await server.wait_idle()
    if keep:
        assert sandbox_id is not None and server.sandboxes[sandbox_id].sessions == {}
    else:
        assert server.sandboxes == {} and len(server.deleted) == 1
    assert s._client.http is None
