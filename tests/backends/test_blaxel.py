"""blaxel specifics, against the loopback `BlaxelServer`: terminal frame quirks, the
terminal URL, every injected fault, cancellation while a call is blocked (signalled by
the server), leaks, and secrets."""

from __future__ import annotations

import asyncio
import io
import logging
import os
import re
import traceback
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

pytest.importorskip("blaxel", reason="the blaxel extra is not installed")
pytest.importorskip("aiohttp", reason="the blaxel extra is not installed")

import sandbox
from sandbox.backends.blaxel import (
    BlaxelAPIError,
    BlaxelSession,
    is_retryable,
    parse_terminal_frame,
)
from sandbox.backends.blaxel.sdk import close_shared_sdk_client
from sandbox.backends.toolkit.credentials import REDACTED
from sandbox.testing.blaxel_server import GARBAGE_FRAMES, BlaxelServer
from tests.helpers import eventually, host_pids_with_arg, open_fds, unique_seconds

# Characters that change under percent-encoding, so every form of the key is checked.
SPECIAL_KEY = "bl-Secret/Key+with&odd=chars%-0123456789abcdef"


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[BlaxelServer]:
    async with BlaxelServer(api_key=SPECIAL_KEY, root=str(tmp_path)) as srv:
        yield srv


def make_session(server: BlaxelServer, tmp_path: Path, **extra: object) -> BlaxelSession:
    options = {"workdir": str(tmp_path / "ws"), "terminate_grace_s": 0.3, **extra}
    return BlaxelSession(**server.backend_options(**options))


@pytest.fixture
async def session(server: BlaxelServer, tmp_path: Path) -> AsyncIterator[BlaxelSession]:
    async with make_session(server, tmp_path) as s:
        yield s
    assert server.sandboxes == {}
    assert await eventually(lambda: server.live_processes() == 0)


def key_forms(key: str) -> set[str]:
    return {key, quote(key, safe=""), quote(key)}


def texts_of(exc: BaseException) -> list[str]:
    """Every text an error shows: message, repr, full traceback, its whole chain."""
    texts = ["".join(traceback.format_exception(exc))]
    seen: BaseException | None = exc
    while seen is not None:
        texts += [str(seen), repr(seen), repr(getattr(seen, "args", ()))]
        seen = seen.__cause__ or seen.__context__
    return texts


def assert_no_secret(*texts: str, key: str = SPECIAL_KEY) -> None:
    for text in texts:
        for form in key_forms(key):
            assert form not in text, "the API key leaked"


@pytest.fixture
def all_logs(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    caplog.set_level(logging.DEBUG)
    # Per-logger levels too (the Blaxel SDK raises httpx's); caplog restores them.
    for name in ("sandbox", "sandbox.blaxel", "aiohttp", "blaxel", "httpx", "asyncio"):
        caplog.set_level(logging.DEBUG, logger=name)
    yield caplog


# ---- frames ---------------------------------------------------------------------------


def test_frames_text_binary_and_capitalised_keys() -> None:
    assert parse_terminal_frame('{"type": "output", "data": "hi"}') == ("output", "hi")
    assert parse_terminal_frame(b'{"Type": "output", "Data": "h\\u00e9"}') == ("output", "hé")
    assert parse_terminal_frame('{"TYPE": "Output", "DATA": ""}') == ("output", "")
    assert parse_terminal_frame('{"type": "error", "data": "boom"}') == ("error", "boom")
    assert parse_terminal_frame('{"Type": "error", "Message": "m"}') == ("error", "m")
    assert parse_terminal_frame(bytearray(b'{"type":"error"}')) == ("error", "")


@pytest.mark.parametrize("frame", GARBAGE_FRAMES, ids=repr)
def test_garbage_frames_are_skipped(frame: str | bytes) -> None:
    assert parse_terminal_frame(frame) is None


def test_retryable_classification() -> None:
    assert is_retryable(503, "WORKLOAD_UNAVAILABLE")
    assert is_retryable(None, "WORKLOAD_UNAVAILABLE")
    assert is_retryable(503, None) and is_retryable(429, None) and is_retryable(504, None)
    assert is_retryable(429, "RATE_LIMIT_EXCEEDED")
    for status, code in (
        (404, "WORKLOAD_NOT_FOUND"),
        (401, "AUTHENTICATION_FAILED"),
        (403, "FORBIDDEN"),
        (400, "BAD_REQUEST"),
        (429, "USAGE_LIMIT_EXCEEDED"),
        (403, "QUOTA_EXCEEDED"),
        (404, None),
        (401, None),
        (400, None),
        (500, None),
    ):
        assert not is_retryable(status, code), (status, code)
    assert not is_retryable(503, "TOKEN_REVOKED"), "the code wins over the status"


# ---- the terminal URL and what the terminal shows -------------------------------------


async def test_terminal_url_query_is_percent_encoded(server: BlaxelServer, tmp_path: Path) -> None:
    odd = tmp_path / "w s&x#y%z=?"
    async with make_session(server, tmp_path, workdir=str(odd)) as s:
        first = await s.pty_exec_start("pwd", tty=True, rows=33, cols=91)
        await s.pty_exec_start("true", tty=True)
    assert first.output == f"{odd}\r\n"
    a, b = server.terminals[-2:]
    assert a["token"] == SPECIAL_KEY
    assert (a["rows"], a["cols"], a["workingDir"]) == ("33", "91", str(odd))
    assert re.fullmatch(r"[0-9a-f]{16}", a["sessionId"]) and a["sessionId"] != b["sessionId"]
    path = f"/run/{server.workspace}/sandboxes/{s.sandbox_name}/terminal/ws"
    assert ("GET", path) in server.requests


@pytest.mark.parametrize("quirks", [True, False], ids=["quirks", "plain"])
async def test_one_character_frames_split_every_marker(tmp_path: Path, quirks: bool) -> None:
    async with BlaxelServer(output_frame_chars=1, quirks=quirks, root=str(tmp_path)) as server:
        async with make_session(server, tmp_path) as s:
            pipes = await s.pty_exec_start("printf 'h\\303\\251llo\\n'; echo err >&2; exit 4")
            tty = await s.pty_exec_start("printf 'h\\303\\251llo\\n'; kill -TERM $$", tty=True)
    assert (pipes.output, pipes.exit_code, pipes.process_id) == ("héllo\nerr\n", 4, None)
    assert (tty.output, tty.exit_code) == ("héllo\r\n", 143)


async def test_nothing_added_shows_in_the_output(session: BlaxelSession) -> None:
    tty = await session.pty_exec_start("echo hi", tty=True)
    pipes = await session.pty_exec_start("echo hi; echo err >&2; kill -9 $$")
    assert (tty.output, tty.exit_code) == ("hi\r\n", 0)
    assert (pipes.output, pipes.exit_code) == ("hi\nerr\n", 137)


async def test_pipes_are_real_pipes_with_stdin_closed(session: BlaxelSession) -> None:
    update = await session.pty_exec_start(
        "[ -t 0 ] || echo in-not-tty; [ -t 1 ] || echo out-not-tty; cat; echo eof"
    )
    assert (update.output, update.exit_code) == ("in-not-tty\nout-not-tty\neof\n", 0)


async def test_pty_env_and_relative_cwd(session: BlaxelSession) -> None:
    await session.write_file("sub/keep", b"")
    update = await session.pty_exec_start(
        'printf "%s|" "$GREETING"; pwd', env={"GREETING": "a b'c\"d"}, cwd="sub"
    )
    assert update.output == f"a b'c\"d|{session.workdir}/sub\n"


async def test_a_long_command_goes_through_a_file(
    server: BlaxelServer, session: BlaxelSession
) -> None:
    word = "x" * 6000
    update = await session.pty_exec_start(f"echo {word}; echo done", tty=True)
    assert (update.output, update.exit_code) == (f"{word}\r\ndone\r\n", 0)
    scripts = [p for m, p in server.requests if m == "PUT" and "/.sandbox-pty-" in p]
    assert len(scripts) == 1
    assert not os.path.exists(scripts[0].split("/filesystem/", 1)[1]), "the script removed itself"


async def test_interrupt_reaches_a_pipe_process_and_its_handler(session: BlaxelSession) -> None:
    update = await session.pty_exec_start(
        "trap 'echo caught; exit 5' INT; echo ready; while :; do sleep 0.05; done",
        until="ready",
    )
    assert update.process_id is not None
    await session.pty_interrupt(update.process_id)
    final = await session.pty_write_stdin(update.process_id, "", yield_time_s=10)
    assert (final.exit_code, final.process_id) == (5, None)
    assert "caught" in final.output


async def test_error_frames_are_shown_scrubbed_and_logged(
    server: BlaxelServer, session: BlaxelSession, all_logs: pytest.LogCaptureFixture
) -> None:
    update = await session.pty_exec_start("echo ready; exec cat", tty=True, until="ready")
    assert update.process_id is not None
    await server.send_terminal_error(f"token {SPECIAL_KEY} is odd")
    poll = await session.pty_write_stdin(update.process_id, "", until="odd]", yield_time_s=10)
    assert f"[sandbox: Blaxel terminal error: token {REDACTED} is odd]" in poll.output
    assert poll.process_id == update.process_id, "an error frame does not end the process"
    assert any("Blaxel terminal error" in r.getMessage() for r in all_logs.records)
    assert_no_secret(poll.output, all_logs.text)


# ---- faults ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "code", "retryable"),
    [
        (503, "WORKLOAD_UNAVAILABLE", True),
        (429, "RATE_LIMIT_EXCEEDED", True),
        (401, "AUTHENTICATION_FAILED", False),
        (403, "FORBIDDEN", False),
        (400, "BAD_REQUEST", False),
        (400, "QUOTA_EXCEEDED", False),
        (429, "USAGE_LIMIT_EXCEEDED", False),
    ],
)
async def test_create_errors(
    server: BlaxelServer, tmp_path: Path, status: int, code: str, retryable: bool
) -> None:
    server.fail("create", status, code=code, message=f"no ({SPECIAL_KEY})")
    session = make_session(server, tmp_path)
    with pytest.raises(BlaxelAPIError) as info:
        await session.start()
    error = info.value
    assert (error.status, error.code, error.retryable) == (status, code, retryable)
    assert f"HTTP {status}" in str(error) and code in str(error)
    assert_no_secret(*texts_of(error))
    assert session.state is sandbox.SessionState.NEW
    assert session._client.http is None and session._client.instance is None
    # The failed start still tried to delete whatever it might have created.
    assert ("DELETE", f"/v0/sandboxes/{session.sandbox_name}") in server.requests
    async with session:  # a later start works
        assert (await session.exec("echo ok")).stdout == b"ok\n"


async def test_unauthorized_key_is_final(server: BlaxelServer, tmp_path: Path) -> None:
    session = BlaxelSession(**server.backend_options(api_key="wrong-key", workdir=str(tmp_path)))
    with pytest.raises(BlaxelAPIError) as info:
        await session.start()
    assert (info.value.status, info.value.retryable) == (401, False)


async def test_data_plane_errors(server: BlaxelServer, session: BlaxelSession) -> None:
    server.fail("read", 503)
    with pytest.raises(BlaxelAPIError) as info:
        await session.read_file("x")
    assert (info.value.status, info.value.code, info.value.retryable) == (
        503,
        "WORKLOAD_UNAVAILABLE",
        True,
    )
    server.fail("write", 401)
    with pytest.raises(BlaxelAPIError) as info:
        await session.write_file("x", b"data")
    assert (info.value.status, info.value.retryable) == (401, False)
    server.fail("exec", 404)
    with pytest.raises(BlaxelAPIError) as info:
        await session.exec("true")
    assert (info.value.status, info.value.retryable) == (404, False)
    server.fail("exec", 503)
    with pytest.raises(BlaxelAPIError) as info:
        await session.exec("true")
    assert info.value.retryable
    with pytest.raises(sandbox.SandboxFileNotFoundError):
        await session.read_file("missing.txt")
    assert (await session.exec("echo fine")).stdout == b"fine\n"


async def test_sandbox_deleted_behind_our_back(server: BlaxelServer, tmp_path: Path) -> None:
    session = make_session(server, tmp_path)
    async with session:
        server.fail("delete", 404)  # as if someone else deleted it first
        box = server.sandboxes.pop(session.sandbox_name)
        await server._destroy(box)
        with pytest.raises(BlaxelAPIError) as info:
            await session.exec("true")
        assert (info.value.status, info.value.code) == (404, "WORKLOAD_NOT_FOUND")
        assert not info.value.retryable
    assert session.state is sandbox.SessionState.CLOSED  # a gone sandbox closes cleanly


@pytest.mark.parametrize(
    ("status", "retryable"), [(401, False), (403, False), (404, False), (503, True)]
)
async def test_terminal_handshake_refused(
    server: BlaxelServer, session: BlaxelSession, status: int, retryable: bool
) -> None:
    server.fail("terminal", status)
    with pytest.raises(BlaxelAPIError) as info:
        await session.pty_exec_start("true", tty=True)
    error = info.value
    assert (error.status, error.retryable) == (status, retryable)
    assert error.__cause__ is None and error.__context__ is None
    assert_no_secret(*texts_of(error))
    assert session.pty_processes() == [] and session._core.processes.reserved == set()
    assert (await session.pty_exec_start("exit 2", tty=True)).exit_code == 2


async def test_dropped_socket_ends_the_process(
    server: BlaxelServer, session: BlaxelSession
) -> None:
    marker = unique_seconds()
    update = await session.pty_exec_start(f"echo ready; exec sleep {marker}", until="ready")
    assert update.process_id is not None
    assert server.drop_terminals() == 1
    final = await session.pty_write_stdin(update.process_id, "", yield_time_s=20)
    assert (final.process_id, final.exit_code) == (None, None)
    assert "[sandbox: process lost: the Blaxel terminal connection closed" in final.output
    assert session.pty_processes() == [] and session._core.processes.reserved == set()
    assert await eventually(lambda: not host_pids_with_arg(marker))


async def test_socket_dropped_mid_stream_never_hangs(
    server: BlaxelServer, session: BlaxelSession
) -> None:
    server.drop_terminals_after(40)
    update = await session.pty_exec_start("seq 1 1000000", yield_time_s=20)
    assert (update.process_id, update.exit_code) == (None, None)
    assert update.output.startswith("1\n2\n")
    assert "process lost" in update.output
    server.drop_terminals_after(None)
    assert (await session.pty_exec_start("exit 6")).exit_code == 6


async def test_exec_after_the_edge_cut_a_silent_wait(
    server: BlaxelServer, session: BlaxelSession
) -> None:
    server.fail("exec_wait", 504)
    result = await session.exec("echo a; sleep 0.2; echo b >&2; exit 2")
    assert result == sandbox.ExecResult(stdout=b"a\n", stderr=b"b\n", exit_code=2)


async def test_exec_408_is_a_timeout(server: BlaxelServer, session: BlaxelSession) -> None:
    marker = unique_seconds()
    server.fail("exec_wait", 408)
    with pytest.raises(sandbox.ExecTimeoutError, match="timed out at its deadline"):
        await session.exec(f"echo started; exec sleep {marker}")
    assert await eventually(lambda: not host_pids_with_arg(marker))


async def test_credentials_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("BL_API_KEY", raising=False)
    monkeypatch.delenv("BL_WORKSPACE", raising=False)
    with pytest.raises(sandbox.CredentialsMissingError, match="BL_API_KEY"):
        sandbox.open_session("blaxel", workspace="w")
    with pytest.raises(sandbox.CredentialsMissingError, match="BL_WORKSPACE"):
        sandbox.open_session("blaxel", api_key="k")
    monkeypatch.setenv("BL_API_KEY", "k")
    monkeypatch.setenv("BL_WORKSPACE", "w")
    session = sandbox.open_session("blaxel", sandbox_id="box-1")
    assert isinstance(session, BlaxelSession) and session.sandbox_name == "box-1"
    with pytest.raises(sandbox.InvalidArgumentError, match="name= is now sandbox_id="):
        sandbox.open_session("blaxel", name="a")


async def test_keep_and_attach_by_name(server: BlaxelServer, tmp_path: Path) -> None:
    async with make_session(server, tmp_path, sandbox_id="kept-box", keep=True) as s:
        await s.write_file("note", b"still here")
    assert list(server.sandboxes) == ["kept-box"]
    async with make_session(server, tmp_path, sandbox_id="kept-box") as s:
        assert await s.read_file("note") == b"still here"
    assert server.sandboxes == {}
    creates = [p for m, p in server.requests if (m, p) == ("POST", "/v0/sandboxes")]
    assert len(creates) == 2


async def test_sdk_can_be_pointed_at_the_server(server: BlaxelServer) -> None:
    from blaxel.core.sandbox import SandboxInstance

    from sandbox.backends.blaxel.sdk import close_shared_sdk_client

    server.configure_sdk()
    box = await SandboxInstance.create_if_not_exists({"name": "sdk-box", "region": "local-1"})
    try:
        result = await box.process.exec({"command": "echo hi", "wait_for_completion": True})
        assert (result.stdout, result.exit_code) == ("hi\n", 0)
        await box.fs.write_binary(f"{server.root}/f.bin", b"\x00\x01")
        assert await box.fs.read_binary(f"{server.root}/f.bin") == b"\x00\x01"
    finally:
        await SandboxInstance.delete("sdk-box")
        for action in (box.process, box.fs):
            await action.get_client().aclose()
        await close_shared_sdk_client(asyncio.get_running_loop())
    assert server.sandboxes == {}


async def test_64_terminals_at_once(session: BlaxelSession) -> None:
    updates = await asyncio.gather(
        *(session.pty_exec_start("echo r; exec cat", tty=True, until="r") for _ in range(64))
    )
    pids = [u.process_id for u in updates]
    assert None not in pids and len(set(pids)) == 64
    # Each window ends at its echo; the maximum only matters on a loaded machine, where 64
    # round trips can outlast the default 0.25 s write window.
    replies = await asyncio.gather(
        *(
            session.pty_write_stdin(p, f"n{p}\n", until=f"n{p}\r\nn{p}", yield_time_s=20)  # type: ignore[arg-type]
            for p in pids
        )
    )
    assert all(r.output.count(f"n{p}") == 2 for r, p in zip(replies, pids, strict=True))
    assert (await session.exec("echo still fast")).ok


# ---- cancellation ---------------------------------------------------------------------------


async def _cancel_after(coro, steps: int) -> BaseException | object:  # type: ignore[no-untyped-def]
    task = asyncio.ensure_future(coro)
    for _ in range(steps):
        if task.done():
            break
        await asyncio.sleep(0)
    task.cancel()
    try:
        return await task
    except BaseException as exc:
        return exc


async def test_cancel_session_start_at_every_step(server: BlaxelServer, tmp_path: Path) -> None:
    for steps in range(0, 80, 2):
        session = make_session(server, tmp_path)
        outcome = await _cancel_after(session.start(), steps)
        if outcome is None:  # it finished first
            assert session.state is sandbox.SessionState.RUNNING
            await session.aclose()
            break
        assert isinstance(outcome, asyncio.CancelledError)
        assert session.state is sandbox.SessionState.NEW
        assert session._client.http is None and session._client.instance is None
    assert await eventually(lambda: server.live_processes() == 0)


async def test_cancel_session_close_at_every_step(server: BlaxelServer, tmp_path: Path) -> None:
    for steps in range(0, 60, 5):
        marker = unique_seconds()
        session = make_session(server, tmp_path)
        await session.start()
        await session.pty_exec_start(f"echo ready; exec sleep {marker}", tty=True, until="ready")
        outcome = await _cancel_after(session.aclose(), steps)
        assert outcome is None or isinstance(outcome, asyncio.CancelledError)
        if steps == 0:  # cancelled before it ran: nothing happened
            assert session.state is sandbox.SessionState.RUNNING
            await session.aclose()
        assert session.state is sandbox.SessionState.CLOSED
        assert session._client.http is None and session._client.instance is None
        assert session.sandbox_name not in server.sandboxes
        assert await eventually(lambda m=marker: not host_pids_with_arg(m))  # type: ignore[misc]


# ---- cancellation while a call is blocked (the server signals it) -----------------------


async def test_cancel_start_while_create_is_blocked(server: BlaxelServer, tmp_path: Path) -> None:
    session = make_session(server, tmp_path)
    blocked = server.stall("create")
    task = asyncio.create_task(session.start())
    await blocked.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert session.state is sandbox.SessionState.NEW
    assert session._client.http is None
    server.release()
    # The released call still creates the sandbox (the server had received it): the
    # next start attaches to it by name, and closing deletes it.
    assert await eventually(lambda: session.sandbox_name in server.sandboxes)
    async with session:
        assert (await session.exec("echo ok")).ok
    assert server.sandboxes == {}


async def test_cancel_start_while_the_handshake_is_blocked(
    server: BlaxelServer, session: BlaxelSession
) -> None:
    blocked = server.stall("terminal")
    task = asyncio.create_task(session.pty_exec_start("echo never", tty=True))
    await blocked.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert session.pty_processes() == [] and session._core.processes.reserved == set()
    server.release()
    assert await eventually(lambda: server.live_processes() == 0)
    assert (await session.pty_exec_start("exit 3", tty=True)).exit_code == 3


async def test_cancel_a_read_while_output_is_withheld(
    server: BlaxelServer, session: BlaxelSession
) -> None:
    update = await session.pty_exec_start("echo ready; exec cat", tty=True, until="ready")
    pid = update.process_id
    assert pid is not None
    blocked = server.stall("terminal_output")
    task = asyncio.create_task(session.pty_write_stdin(pid, "x\n", until="x\r\nx", yield_time_s=30))
    await blocked.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert [i.process_id for i in session.pty_processes()] == [pid]
    server.release()
    poll = await session.pty_write_stdin(pid, "", until="x\r\nx", yield_time_s=10)
    assert "x\r\nx" in poll.output and poll.process_id == pid


async def test_cancel_a_write_blocked_by_a_full_socket(
    server: BlaxelServer, session: BlaxelSession
) -> None:
    update = await session.pty_exec_start(
        "echo ready; exec cat >/dev/null", tty=True, until="ready"
    )
    pid = update.process_id
    assert pid is not None
    blocked = server.stall("terminal_input")
    await session.pty_write_stdin(pid, "a\n")
    await blocked.wait()
    # 32 MB cannot fit in the socket buffers of a peer that stopped reading.
    # A long window: the call cannot end by its deadline on a loaded machine before the
    # cancel (only the blocked write keeps it).
    task = asyncio.create_task(
        session.pty_write_stdin(pid, "y" * (32 * 1024 * 1024), yield_time_s=30)
    )
    for _ in range(50):
        await asyncio.sleep(0)
    assert not task.done(), "the write must be blocked on the socket"
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await session.pty_terminate(pid)
    assert session.pty_processes() == [] and session._core.processes.reserved == set()
    server.release()
    assert await eventually(lambda: server.live_processes() == 0)


@pytest.mark.parametrize("endpoint", ["read", "write"])
async def test_cancel_file_calls_while_blocked(
    server: BlaxelServer, session: BlaxelSession, endpoint: str
) -> None:
    blocked = server.stall(endpoint)
    call = session.read_file("f") if endpoint == "read" else session.write_file("f", b"1")
    task = asyncio.create_task(call)
    await blocked.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    server.release()
    await session.write_file("f", b"2")
    assert await session.read_file("f") == b"2"


async def test_cancel_exec_kills_the_remote_command(
    server: BlaxelServer, session: BlaxelSession
) -> None:
    marker = unique_seconds()
    task = asyncio.create_task(session.exec(f"sleep {marker} & exec sleep {marker}"))
    assert await eventually(lambda: len(host_pids_with_arg(marker)) == 2)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await eventually(lambda: not host_pids_with_arg(marker))
    assert any(m == "DELETE" and p.endswith("/kill") for m, p in server.requests)


async def test_cancel_close_while_the_delete_is_blocked(
    server: BlaxelServer, tmp_path: Path
) -> None:
    marker = unique_seconds()
    session = make_session(server, tmp_path)
    await session.start()
    await session.pty_exec_start(f"echo ready; exec sleep {marker}", tty=True, until="ready")
    blocked = server.stall("delete")
    task = asyncio.create_task(session.aclose())
    await blocked.wait()
    task.cancel()
    for _ in range(20):
        await asyncio.sleep(0)
    assert not task.done(), "a cancelled close still waits for its teardown"
    server.release()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert session.state is sandbox.SessionState.CLOSED
    assert session._client.http is None and session._client.instance is None
    assert server.sandboxes == {}
    assert await eventually(lambda: not host_pids_with_arg(marker))
    await session.aclose()  # idempotent


async def test_a_delete_that_never_answers_is_bounded(server: BlaxelServer, tmp_path: Path) -> None:
    session = make_session(server, tmp_path, call_timeout_s=0.3)
    await session.start()
    server.stall("delete")
    with pytest.raises(sandbox.ConnectionLostError) as info:
        await session.aclose()
    assert info.value.retryable and session.sandbox_name in str(info.value)
    assert session.state is sandbox.SessionState.CLOSED and session._client.http is None


# ---- leaks and secrets ---------------------------------------------------------------------


async def test_nothing_leaks_over_many_cycles(server: BlaxelServer, tmp_path: Path) -> None:
    fds, tasks = open_fds(), len(asyncio.all_tasks())
    async with make_session(server, tmp_path) as s:
        for i in range(20):
            update = await s.pty_exec_start("echo $0", tty=i % 2 == 0)
            assert update.exit_code == 0
        for i in range(6):
            update = await s.pty_exec_start("echo r; exec sleep 30", tty=i % 2 == 0, until="r")
            assert update.process_id is not None
        await s.exec("true")
        await s.write_file("a", b"b")
        assert await s.read_file("a") == b"b"
        await s.pty_terminate_all()
        await s.pty_exec_start("echo r; exec cat", tty=True, until="r")  # left for close
    assert server.live_processes() == 0
    assert await eventually(lambda: open_fds() <= fds)
    assert len(asyncio.all_tasks()) == tasks


async def test_secrets_never_leak(
    server: BlaxelServer,
    tmp_path: Path,
    all_logs: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen: list[str] = []
    session = make_session(server, tmp_path)
    seen.append(repr(session))
    server.fail("create", 401, message=f"bad key {SPECIAL_KEY}")
    with pytest.raises(BlaxelAPIError) as info:
        await session.start()
    seen += texts_of(info.value)
    async with session:
        seen.append(repr(session))
        for endpoint, status in (("terminal", 401), ("terminal", 503), ("exec", 403)):
            server.fail(endpoint, status, message=f"echo {SPECIAL_KEY}")
            with pytest.raises(BlaxelAPIError) as info:
                if endpoint == "terminal":
                    await session.pty_exec_start("true", tty=True)
                else:
                    await session.exec("true")
            seen += texts_of(info.value)
        update = await session.pty_exec_start("echo ready; exec cat", tty=True, until="ready")
        assert update.process_id is not None
        seen += [repr(session.pty_processes()), repr(session._core.processes.entries())]
        await server.send_terminal_error(SPECIAL_KEY)
        server.drop_terminals()
        final = await session.pty_write_stdin(update.process_id, "", yield_time_s=10)
        seen.append(final.output)
        assert final.exit_code is None and final.process_id is None
    seen.append(repr(session))
    seen.append(all_logs.text)
    seen += [r.getMessage() for r in all_logs.records]

    from sandbox.cli.backends_report import print_backends

    monkeypatch.setenv("BL_API_KEY", SPECIAL_KEY)
    monkeypatch.setenv("BL_WORKSPACE", "w")
    out = io.StringIO()
    print_backends(out)
    assert "blaxel" in out.getvalue() and "found (BL_API_KEY + BL_WORKSPACE)" in out.getvalue()
    seen.append(out.getvalue())
    assert_no_secret(*seen)


def test_importing_the_backend_leaves_logging_alone() -> None:
    """The Blaxel SDK configures the root logger on import; our backend undoes that."""
    import subprocess
    import sys

    code = (
        "import logging; r = logging.getLogger()\n"
        "before = (r.level, list(r.handlers), logging.getLogger('httpx').level)\n"
        "import sandbox.backends.blaxel\n"
        "print(before == (r.level, list(r.handlers), logging.getLogger('httpx').level))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "True"


async def test_a_directory_answered_as_a_listing_is_not_a_file(session: BlaxelSession) -> None:
    """The API answers a GET of a directory with its JSON listing: a symlink to a
    directory passes the listing check (a symlink), and the answer itself is refused."""
    await session.exec("mkdir -p real && echo in > real/f && ln -s real link")
    with pytest.raises(sandbox.NotAFileError, match="'link'"):
        await session.read_file("link")
    # A file that merely holds JSON shaped like a listing is a file.
    shaped = b'{"name": "x", "path": "/x", "files": [], "subdirectories": []}'
    await session.write_file("shaped.json", shaped)
    assert await session.read_file("shaped.json") == shaped


# ---- provider fidelity: what the real sandbox API does (see docs/providers.md) -------


async def test_the_stand_in_answers_like_the_sandbox_api(tmp_path: Path) -> None:
    """The stand-in itself, through the SDK: an unwrapped signal death is -1, the
    server's timeout is a 422 that leaves the process running, a silent wait is cut
    with a 504 while the command goes on."""
    from blaxel.core.sandbox import SandboxInstance

    async with BlaxelServer(root=str(tmp_path), edge_cut_s=0.5) as server:
        server.configure_sdk()
        box = await SandboxInstance.create_if_not_exists({"name": "fidelity"})
        try:
            await _drive_the_stand_in(server, box)
        finally:
            # The SDK never closes a helper's client, nor its process-wide one.
            for action in (box.process, box.fs):
                await action.get_client().aclose()
            await close_shared_sdk_client(asyncio.get_running_loop())


async def _drive_the_stand_in(server: BlaxelServer, box: Any) -> None:
    """Each fact of the stand-in, through the SDK instance `box`."""
    from blaxel.core.sandbox import SandboxInstance

    killed = await box.process.exec({"command": "kill -9 $$", "wait_for_completion": True})
    assert (killed.status, killed.exit_code) == ("failed", -1)
    marker = unique_seconds()
    with pytest.raises(Exception) as info:
        await box.process.exec(
            {"command": f"exec sleep {marker}", "wait_for_completion": True, "timeout": 1}
        )
    assert info.value.response.status_code == 504  # type: ignore[attr-defined]
    await box.process.exec(
        {"name": "late", "command": "sleep 0.3; exit 4", "wait_for_completion": False}
    )
    assert host_pids_with_arg(marker), "the command outlived the edge's 504"
    server.edge_cut_s = None
    with pytest.raises(Exception) as info:
        await box.process.exec(
            {"command": "exec sleep 30", "wait_for_completion": True, "timeout": 1}
        )
    assert info.value.response.status_code == 422  # type: ignore[attr-defined]
    assert "process timed out after 1 seconds" in str(info.value)
    assert host_pids_with_arg(marker) and server.live_processes() >= 2, "nothing killed"
    await SandboxInstance.delete("fidelity")


async def test_a_long_silent_exec_outlives_the_edge_cut(tmp_path: Path) -> None:
    async with BlaxelServer(root=str(tmp_path), edge_cut_s=0.5) as server:
        async with make_session(server, tmp_path) as s:
            result = await s.exec("sleep 1.5; echo done; echo e >&2; exit 3", timeout=90)
    assert result == sandbox.ExecResult(stdout=b"done\n", stderr=b"e\n", exit_code=3)


async def test_a_silent_exec_past_the_edge_cut_is_killed_at_our_deadline(
    tmp_path: Path,
) -> None:
    marker = unique_seconds()
    async with BlaxelServer(root=str(tmp_path), edge_cut_s=0.5) as server:
        async with make_session(server, tmp_path) as s:
            with pytest.raises(sandbox.ExecTimeoutError) as info:
                await s.exec(f"echo started; exec sleep {marker}", timeout=2.5)
            assert info.value.stdout == b"started\n"
            assert await eventually(lambda: not host_pids_with_arg(marker))
            assert (await s.exec("echo still-here")).stdout == b"still-here\n"


@pytest.mark.parametrize(("command", "code"), [("kill -TERM $$", 143), ("kill -9 $$", 137)])
async def test_one_shot_signal_deaths_are_128_plus_n(
    session: BlaxelSession, command: str, code: int
) -> None:
    # The server reports -1 for both (Go's ExitCode()); the wrapper makes them exact.
    result = await session.exec(f"echo before; {command}")
    assert result == sandbox.ExecResult(stdout=b"before\n", stderr=b"", exit_code=code)


async def test_the_servers_timeout_is_an_exec_timeout_and_kills(
    server: BlaxelServer, session: BlaxelSession
) -> None:
    # The server's own timeout (422) answers while the process runs on: it is killed.
    marker = unique_seconds()
    server.fail("exec_wait", 422, message="process timed out after 1 seconds")
    with pytest.raises(sandbox.ExecTimeoutError) as info:
        await session.exec(f"exec sleep {marker}", timeout=30)
    assert "timed out" in str(info.value)
    assert await eventually(lambda: not host_pids_with_arg(marker))
    assert any(m == "DELETE" and p.endswith("/kill") for m, p in server.requests)
    # Any other 422 is a plain, final provider error.
    server.fail("exec_wait", 422, message="could not execute command")
    with pytest.raises(BlaxelAPIError) as other:
        await session.exec("true")
    assert other.value.status == 422 and not other.value.retryable


async def test_resize_is_seen_by_stty_size(server: BlaxelServer, session: BlaxelSession) -> None:
    update = await session.pty_exec_start(
        "echo ready; read x; stty size; exec cat", tty=True, until="ready"
    )
    assert update.process_id is not None
    await session.pty_resize(update.process_id, rows=40, cols=120)
    update = await session.pty_write_stdin(update.process_id, "\n", until="40 120")
    assert "40 120" in update.output
    assert server.resizes == [(40, 120)]


async def test_a_shell_killed_without_the_end_marker_is_lost_in_bounded_time(
    server: BlaxelServer, tmp_path: Path
) -> None:
    marker = unique_seconds()
    async with make_session(server, tmp_path, probe_interval_s=0.5) as s:
        update = await s.pty_exec_start(
            f"echo shell=$PPID; exec sleep {marker}", tty=True, until=re.compile(r"shell=\d+\s")
        )
        pid = update.process_id
        assert pid is not None
        match = re.search(r"shell=(\d+)", update.output)
        assert match is not None
        os.kill(int(match.group(1)), 9)  # the terminal's shell: no end marker is printed
        window = 30.0
        started = asyncio.get_running_loop().time()
        final = await s.pty_write_stdin(pid, "", yield_time_s=window)
        # The socket stays open after the shell died: only a probe ends the wait.
        assert asyncio.get_running_loop().time() - started < window / 2, "the window ran out"
        assert (final.process_id, final.exit_code) == (None, None)
        assert "process lost: the Blaxel terminal's shell ended" in final.output
        assert server.inputs >= 2  # the typed line, then at least one probe
        assert await eventually(lambda: not host_pids_with_arg(marker))
        assert s.pty_processes() == [] and s._core.processes.reserved == set()


async def test_split_utf8_arrives_as_the_server_sends_it(
    server: BlaxelServer, session: BlaxelSession
) -> None:
    # 20000 euro signs (3 bytes each) in one stream: the server's 4096-byte reads split
    # characters, and Go's JSON encoder turns each byte of a split one into U+FFFD.
    count = 20000
    update = await session.pty_exec_start(
        f"yes \"$(printf '\\342\\202\\254')\" | head -n {count} | tr -d '\\n'",
        tty=True,
        yield_time_s=20,
        max_output_tokens=None,
    )
    assert (update.process_id, update.exit_code) == (None, 0)
    sent = "".join(server.terminal_output()[-1])
    between = re.search("\x1eS[0-9a-f]{16}\x1e(.*)\x1eE[0-9a-f]{16}:0\x1e", sent, re.S)
    assert between is not None
    assert update.output == between.group(1), "exactly what the server sent"
    assert "\ufffd" in update.output, "no character was split (4096-byte reads)"
    # One U+FFFD per byte, as Go's encoder makes them; never more than the server sent.
    assert update.output.count("\u20ac") * 3 + update.output.count("\ufffd") == 3 * count
    assert set(update.output) == {"\u20ac", "\ufffd"}


# ---- the stand-in's side-by-side branches (terminal input and output) ---------------


async def test_a_failing_terminal_input_cancels_the_parked_output_pump(
    server: BlaxelServer, session: BlaxelSession
) -> None:
    update = await session.pty_exec_start("echo ready; exec cat", tty=True, until="ready")
    pid = update.process_id
    assert pid is not None
    parked = server.stall("terminal_output")
    await session.pty_write_stdin(pid, "x\n")  # its echo wakes the pump, which parks
    await parked.wait()
    server.break_terminals("input")
    final = await session.pty_write_stdin(pid, "y\n", yield_time_s=20)  # read: it fails
    assert (final.process_id, final.exit_code) == (None, None)
    assert "process lost" in final.output
    assert await eventually(lambda: server.terminal_tasks() == 0), "a branch kept running"
    assert await eventually(lambda: server.live_processes() == 0)
    server.release()


async def test_a_failing_terminal_output_cancels_the_parked_input_reader(
    server: BlaxelServer, session: BlaxelSession
) -> None:
    update = await session.pty_exec_start("echo ready; exec cat", tty=True, until="ready")
    pid = update.process_id
    assert pid is not None
    parked = server.stall("terminal_input")
    await session.pty_write_stdin(pid, "a\n")  # the reader parks on this message
    await parked.wait()
    server.break_terminals("output")  # wakes the pump, which fails
    final = await session.pty_write_stdin(pid, "", yield_time_s=20)
    assert (final.process_id, final.exit_code) == (None, None)
    assert "process lost" in final.output
    assert await eventually(lambda: server.terminal_tasks() == 0), "a branch kept running"
    assert await eventually(lambda: server.live_processes() == 0)
    server.release()
