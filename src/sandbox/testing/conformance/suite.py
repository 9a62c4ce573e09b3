"""The contract's tests: what every backend does the same way (docs/contract.md).

Star-import this module into a test module that defines the `backend_under_test`
fixture (see `sandbox.testing.conformance`); its test functions and the fixtures they
use (`session`, `processes_with_arg`) are then collected there. tests/test_conformance.py
runs it over every in-tree backend.
"""

from __future__ import annotations

import asyncio
import re
import shlex
import time
from pathlib import Path
from typing import Any

import pytest

import sandbox
from sandbox import BaseSandboxSession
from sandbox.output.decoding import omission_marker

from ..faults import park_calls
from . import Backend, ProcessLister, eventually, needs, unique_seconds
from ._fixtures import (
    backend_under_test_fixture,
    cancel_after,
    mark_async_tests,
    processes_with_arg_fixture,
    reserved_ids,
    session_fixture,
)

__all__ = [
    "backend_under_test_fixture",
    "processes_with_arg_fixture",
    "session_fixture",
    "test_bad_cwd",
    "test_bad_env_is_an_invalid_argument",
    "test_cancel_close_at_every_step",
    "test_cancel_start_at_every_step",
    "test_cancel_terminate_all_tears_everything_down",
    "test_cancel_terminate_at_every_step",
    "test_cancel_write_and_poll_at_every_step",
    "test_checked_start_runs_the_command_unchanged",
    "test_close_leaves_nothing",
    "test_close_stdin_cancelled_while_the_hook_is_blocked",
    "test_close_stdin_errors",
    "test_close_stdin_raced_by_a_terminate",
    "test_close_stdin_raced_by_the_session_close",
    "test_concurrent_writes_do_not_interleave",
    "test_control_characters_are_data",
    "test_empty_poll_returns_at_exit",
    "test_exec_argv_without_shell",
    "test_exec_env_and_cwd",
    "test_exec_nonzero_and_stderr",
    "test_exec_ok",
    "test_exec_output_keeps_head_and_tail",
    "test_exec_output_limit_is_checked",
    "test_exec_parts_are_quoted_with_shell",
    "test_exec_stream_cancelled_while_waiting_kills_the_tree",
    "test_exec_stream_delivers_output_while_the_command_runs",
    "test_exec_stream_ends_with_the_session_close",
    "test_exec_stream_keeps_each_stream_in_order",
    "test_exec_stream_left_early_kills_the_tree",
    "test_exec_stream_raises_what_cannot_start",
    "test_exec_stream_timeout_kills_the_tree",
    "test_exec_timeout_keeps_a_flood_bounded",
    "test_exec_timeout_kills_the_tree",
    "test_exited_process_is_gone_after_final_poll",
    "test_file_chunks_round_trip",
    "test_file_directory_is_not_a_file",
    "test_file_fifo_is_refused_without_hanging",
    "test_file_nul_in_path_is_refused",
    "test_file_read_over_the_limit",
    "test_file_round_trip",
    "test_file_write_under_a_file_is_refused",
    "test_immediate_exit_reports_code_early",
    "test_initial_size_is_applied",
    "test_interrupt_sleeping_process",
    "test_invalid_names_and_lone_surrogates_are_invalid_arguments",
    "test_large_output_keeps_exact_head_and_tail",
    "test_lone_surrogate_keystrokes_are_invalid_arguments",
    "test_missing_program_without_shell",
    "test_multibyte_character_split_across_windows",
    "test_open_stdin_large_writes_arrive_before_the_end",
    "test_open_stdin_sort_gets_its_eof",
    "test_output_then_exit_is_complete",
    "test_pipes_reject_stdin_but_poll",
    "test_prune_rule_on_the_65th_start",
    "test_resize_is_seen_by_stty",
    "test_running_process_is_listed",
    "test_screen_renders_tty_output_and_until_screen",
    "test_terminate_and_terminate_all_leave_nothing",
    "test_token_truncation",
    "test_tty_echo_round_trip_with_until",
    "test_unknown_process_ids",
    "test_until_regex_and_substring",
]

# ---- one-shot exec ------------------------------------------------------------------


async def test_exec_ok(session: BaseSandboxSession) -> None:
    result = await session.exec("echo hi")
    assert result == sandbox.ExecResult(stdout=b"hi\n", stderr=b"", exit_code=0)
    assert result.ok


async def test_exec_nonzero_and_stderr(session: BaseSandboxSession) -> None:
    result = await session.exec("echo out; echo err >&2; exit 7")
    assert result.exit_code == 7
    assert not result.ok
    assert result.stdout == b"out\n"
    assert result.stderr == b"err\n"


async def test_exec_argv_without_shell(session: BaseSandboxSession) -> None:
    result = await session.exec("printf", "%s|", "a b", "$HOME", shell=False)
    assert result.stdout == b"a b|$HOME|"


async def test_exec_parts_are_quoted_with_shell(session: BaseSandboxSession) -> None:
    result = await session.exec("printf", "%s|", "a b", "c;d")
    assert result.stdout == b"a b|c;d|"


async def test_exec_env_and_cwd(session: BaseSandboxSession) -> None:
    result = await session.exec("echo $GREETING; pwd", env={"GREETING": "hola"}, cwd="/")
    assert result.stdout == b"hola\n/\n"


async def test_exec_timeout_kills_the_tree(
    session: BaseSandboxSession, processes_with_arg: ProcessLister
) -> None:
    marker = unique_seconds()
    started = time.monotonic()
    with pytest.raises(sandbox.ExecTimeoutError) as info:
        await session.exec(f"echo before; sleep {marker} & sleep {marker}; wait", timeout=1.5)
    assert time.monotonic() - started < 15
    assert b"before" in info.value.stdout
    assert await eventually(lambda: not processes_with_arg(marker))
    # The sandbox itself survived the timeout.
    assert (await session.exec("echo still-here")).stdout == b"still-here\n"


@needs("files")
async def test_file_round_trip(session: BaseSandboxSession) -> None:
    payload = bytes(range(256)) * 400
    await session.write_file("sub/dir/data.bin", payload)
    assert await session.read_file("sub/dir/data.bin") == payload
    assert (await session.exec("wc -c < sub/dir/data.bin")).stdout.strip() == b"102400"


# ---- files: regular files only, bounded reads, streaming (issue 12) -------------------


@needs("files")
async def test_file_fifo_is_refused_without_hanging(session: BaseSandboxSession) -> None:
    assert (await session.exec("mkfifo fifo")).exit_code == 0
    async with asyncio.timeout(60):  # a safety net only: the refusal must not wait
        with pytest.raises(sandbox.NotAFileError, match="'fifo'"):
            await session.read_file("fifo")
        with pytest.raises(sandbox.NotAFileError, match="'fifo'"):
            await session.write_file("fifo", b"x")
        with pytest.raises(sandbox.NotAFileError, match="'fifo'"):
            await anext(session.read_file_chunks("fifo"))
    assert (await session.exec("test -p fifo && echo still-a-fifo")).stdout == b"still-a-fifo\n"


@needs("files")
async def test_file_directory_is_not_a_file(session: BaseSandboxSession) -> None:
    assert (await session.exec("mkdir -p d/inner && echo kept > d/inner/f")).exit_code == 0
    with pytest.raises(sandbox.NotAFileError, match="'d'"):
        await session.read_file("d")
    with pytest.raises(sandbox.NotAFileError, match="'d'"):
        await session.write_file("d", b"x")
    with pytest.raises(sandbox.NotAFileError, match="'d'"):
        await session.write_file_chunks("d", [b"x"])
    assert (await session.exec("cat d/inner/f")).stdout == b"kept\n"


@needs("files")
async def test_file_write_under_a_file_is_refused(session: BaseSandboxSession) -> None:
    await session.write_file("plain", b"p")
    with pytest.raises(sandbox.NotAFileError, match="'plain/sub'"):
        await session.write_file("plain/sub", b"x")
    assert await session.read_file("plain") == b"p"


@needs("files")
async def test_file_nul_in_path_is_refused(session: BaseSandboxSession) -> None:
    await session.write_file("a", b"kept")
    with pytest.raises(sandbox.InvalidArgumentError, match="NUL"):
        await session.read_file("a\0b")
    with pytest.raises(sandbox.InvalidArgumentError, match="NUL"):
        await session.write_file("a\0b", b"x")
    assert await session.read_file("a") == b"kept"


@needs("files")
async def test_file_read_over_the_limit(session: BaseSandboxSession) -> None:
    await session.write_file("ten.txt", b"0123456789")
    assert await session.read_file("ten.txt", max_bytes=10) == b"0123456789"
    with pytest.raises(sandbox.FileTooLargeError, match="limit of 9 bytes") as info:
        await session.read_file("ten.txt", max_bytes=9)
    assert info.value.limit == 9 and info.value.size in (10, None)


@needs("files")
async def test_file_chunks_round_trip(session: BaseSandboxSession) -> None:
    payload = bytes(range(256)) * (3 * 4096) + b"tail"  # 3 MiB and a bit: several chunks
    pieces = (payload[i : i + 100_000] for i in range(0, len(payload), 100_000))
    await session.write_file_chunks("chunks/data.bin", pieces)
    chunks = [c async for c in session.read_file_chunks("chunks/data.bin", chunk_size=1 << 20)]
    assert b"".join(chunks) == payload
    assert len(chunks) >= 4 and all(0 < len(c) <= 1 << 20 for c in chunks)
    size = (await session.exec("wc -c < chunks/data.bin")).stdout.strip()
    assert size == str(len(payload)).encode()


# ---- process start and exit ---------------------------------------------------------

# Waits until the test creates the file "go" in the workspace (`touch go`):
# output the test expects in a LATER window is printed only once the test says so, never
# after a sleep a loaded machine may outlast before the first window has ended.
WAIT_FOR_GO = "until [ -e go ]; do sleep 0.01; done"


@pytest.mark.parametrize("tty", [True, False], ids=["tty", "pipes"])
@pytest.mark.parametrize(
    ("command", "code"), [("true", 0), ("exit 3", 3), ("kill -9 $$", 137), ("kill -TERM $$", 143)]
)
async def test_immediate_exit_reports_code_early(
    session: BaseSandboxSession, command: str, code: int, tty: bool
) -> None:
    started = time.monotonic()
    update = await session.pty_exec_start(command, tty=tty, yield_time_s=10)
    assert time.monotonic() - started < 5, "the window must end at the exit, not the deadline"
    assert update.process_id is None
    assert update.exit_code == code
    assert update.output == "", "nothing a wrapper, trap or shell adds may show"
    assert session.pty_processes() == []


async def test_output_then_exit_is_complete(session: BaseSandboxSession) -> None:
    update = await session.pty_exec_start("seq 1 20000", yield_time_s=20)
    assert update.process_id is None
    assert update.exit_code == 0
    assert update.output == "".join(f"{i}\n" for i in range(1, 20001))


async def test_running_process_is_listed(session: BaseSandboxSession) -> None:
    update = await session.pty_exec_start("echo ready; exec cat", tty=True, until="ready")
    assert update.process_id is not None
    assert update.exit_code is None
    infos = session.pty_processes()
    assert [i.process_id for i in infos] == [update.process_id]
    assert infos[0].command == "echo ready; exec cat"
    assert infos[0].tty and infos[0].running and infos[0].exit_code is None
    assert 1000 <= update.process_id < 100_000


async def test_tty_echo_round_trip_with_until(session: BaseSandboxSession) -> None:
    update = await session.pty_exec_start("echo ready; exec cat", tty=True, until="ready")
    pid = update.process_id
    assert pid is not None
    started = time.monotonic()
    update = await session.pty_write_stdin(
        pid, "ping\n", until=re.compile(r"ping\r?\n(.|\n)*ping"), yield_time_s=20
    )
    assert time.monotonic() - started < 10, "until must end the window early"
    assert update.output.count("ping") == 2
    assert update.process_id == pid


async def test_until_regex_and_substring(session: BaseSandboxSession) -> None:
    update = await session.pty_exec_start(
        "echo start; sleep 0.3; echo value=42; exec sleep 30", until=re.compile(r"value=\d+")
    )
    assert "value=42" in update.output
    assert update.process_id is not None


async def test_pipes_reject_stdin_but_poll(session: BaseSandboxSession) -> None:
    update = await session.pty_exec_start("echo one; read x; echo got=$x; echo two", until="two")
    assert update.output.replace("\r", "") == "one\ngot=\ntwo\n" or update.exit_code == 0
    marker = unique_seconds()
    update = await session.pty_exec_start(
        f"echo ready; {WAIT_FOR_GO}; echo later; exec sleep {marker}", until="ready"
    )
    assert update.process_id is not None
    with pytest.raises(sandbox.StdinClosedError, match="tty=True"):
        await session.pty_write_stdin(update.process_id, "data\n")
    await session.exec("touch go")
    poll = await session.pty_write_stdin(update.process_id, "", until="later", yield_time_s=10)
    assert poll.process_id == update.process_id
    assert poll.output.replace("\r", "") == "later\n"
    assert poll.exit_code is None


async def test_empty_poll_returns_at_exit(session: BaseSandboxSession) -> None:
    update = await session.pty_exec_start(f"echo a; {WAIT_FOR_GO}; echo b", until="a")
    assert update.process_id is not None
    await session.exec("touch go")
    started = time.monotonic()
    final = await session.pty_write_stdin(update.process_id, "", yield_time_s=30)
    assert time.monotonic() - started < 10
    assert final.process_id is None
    assert final.exit_code == 0
    assert "b" in final.output


@pytest.mark.parametrize("tty", [True, False], ids=["tty", "pipes"])
async def test_interrupt_sleeping_process(
    session: BaseSandboxSession, tty: bool, processes_with_arg: ProcessLister
) -> None:
    marker = unique_seconds()
    update = await session.pty_exec_start(
        f"echo ready; exec sleep {marker}", tty=tty, until="ready"
    )
    pid = update.process_id
    assert pid is not None
    await session.pty_interrupt(pid)
    final = await session.pty_write_stdin(pid, "", yield_time_s=10)
    assert final.process_id is None
    assert final.exit_code == 130
    assert await eventually(lambda: not processes_with_arg(marker))


async def test_resize_is_seen_by_stty(
    session: BaseSandboxSession, backend_under_test: Backend
) -> None:
    update = await session.pty_exec_start(
        "echo ready; read x; stty size", tty=True, rows=24, cols=80, until="ready"
    )
    pid = update.process_id
    assert pid is not None
    if "resize" not in backend_under_test.capabilities:
        with pytest.raises(sandbox.UnsupportedOperationError):
            await session.pty_resize(pid, rows=40, cols=120)
        return
    await session.pty_resize(pid, rows=40, cols=120)
    final = await session.pty_write_stdin(pid, "\n", until="40 120", yield_time_s=10)
    assert "40 120" in final.output


async def test_initial_size_is_applied(session: BaseSandboxSession) -> None:
    update = await session.pty_exec_start("stty size", tty=True, rows=33, cols=91)
    assert "33 91" in update.output
    assert update.exit_code == 0


# ---- output handling ------------------------------------------------------------------


async def test_large_output_keeps_exact_head_and_tail(session: BaseSandboxSession) -> None:
    count = 2_500_000  # about 20 MB of `seq` output
    update = await session.pty_exec_start(f"seq 1 {count}", yield_time_s=30)
    assert update.exit_code == 0, update.output[-300:]
    expected = "".join(f"{i}\n" for i in range(1, count + 1)).encode()
    limit = session.output_limit_bytes
    head, tail = expected[: limit // 2], expected[len(expected) - (limit - limit // 2) :]
    omitted = len(expected) - len(head) - len(tail)
    assert update.output == head.decode() + omission_marker(omitted) + tail.decode()


async def test_multibyte_character_split_across_windows(session: BaseSandboxSession) -> None:
    update = await session.pty_exec_start(
        r"stty -echo; printf 'A\303'; read x; printf '\251B'", tty=True, until="A"
    )
    assert update.output.endswith("A")
    assert "\ufffd" not in update.output
    pid = update.process_id
    assert pid is not None
    final = await session.pty_write_stdin(pid, "\n", until="B", yield_time_s=10)
    assert final.output.endswith("\u00e9B")
    assert "\ufffd" not in final.output


async def test_token_truncation(session: BaseSandboxSession) -> None:
    update = await session.pty_exec_start("seq 1 5000", max_output_tokens=100, yield_time_s=20)
    assert update.exit_code == 0
    assert update.original_token_count is not None
    assert update.original_token_count > 100
    assert update.output.startswith("Total output lines: 5001\n\n1\n2\n")
    assert update.output.endswith("4999\n5000\n")
    assert "tokens truncated" in update.output
    assert len(update.output.encode()) <= 100 * 4 + 40


async def test_concurrent_writes_do_not_interleave(session: BaseSandboxSession) -> None:
    update = await session.pty_exec_start(
        "stty -echo; echo ready; exec cat", tty=True, until="ready"
    )
    pid = update.process_id
    assert pid is not None
    a, b = "A" * 1500, "B" * 1500
    first, second = await asyncio.gather(
        session.pty_write_stdin(pid, a + "\n"), session.pty_write_stdin(pid, b + "\n")
    )
    text = first.output + second.output
    while text.count("\n") < 2:
        text += (await session.pty_write_stdin(pid, "", until="\n", yield_time_s=10)).output
    lines = [line for line in text.replace("\r", "").split("\n") if line]
    assert sorted(lines) == [a, b]


# ---- registry --------------------------------------------------------------------------


async def test_unknown_process_ids(session: BaseSandboxSession) -> None:
    for call in (
        session.pty_write_stdin(99_999_999, "x"),
        session.pty_write_stdin(424_242, ""),
        session.pty_interrupt(12),
        session.pty_terminate(100_001),
        session.pty_resize(5, rows=10, cols=10),
        session.pty_close_stdin(7),
    ):
        with pytest.raises(sandbox.PtyProcessNotFoundError) as info:
            await call
        assert isinstance(info.value, LookupError)
        assert "no process with id" in str(info.value)


async def test_exited_process_is_gone_after_final_poll(session: BaseSandboxSession) -> None:
    update = await session.pty_exec_start(f"echo ready; {WAIT_FOR_GO}; echo bye", until="ready")
    pid = update.process_id
    assert pid is not None
    await session.exec("touch go")
    final = await session.pty_write_stdin(pid, "", yield_time_s=10)
    assert final.process_id is None
    assert final.exit_code == 0
    with pytest.raises(sandbox.PtyProcessNotFoundError):
        await session.pty_write_stdin(pid, "")


async def test_prune_rule_on_the_65th_start(session: BaseSandboxSession) -> None:
    assert session.max_processes == 64
    pids = []
    for _ in range(64):
        update = await session.pty_exec_start("echo r; exec cat", tty=True, until="r")
        assert update.process_id is not None
        pids.append(update.process_id)
    assert len(set(pids)) == 64
    # An old process exits without being collected; then the 8 oldest are used again.
    await session.pty_interrupt(pids[10])
    assert await eventually(
        lambda: any(i.process_id == pids[10] and not i.running for i in session.pty_processes()),
        timeout=10,
    )
    for pid in pids[:8]:
        await session.pty_write_stdin(pid, "x\n", until="x")
    newest = await session.pty_exec_start("echo r; exec cat", tty=True, until="r")
    live = {i.process_id for i in session.pty_processes()}
    assert pids[10] not in live, "the least recently used EXITED process goes first"
    assert newest.process_id in live and len(live) == 64
    await session.pty_exec_start("echo r; exec cat", tty=True, until="r")
    live = {i.process_id for i in session.pty_processes()}
    assert pids[8] not in live, "then the least recently used running one"
    assert set(pids[:8]) <= live, "the 8 most recently used are never pruned"
    assert len(live) == 64
    await session.pty_terminate_all()
    assert session.pty_processes() == []


async def test_terminate_and_terminate_all_leave_nothing(
    session: BaseSandboxSession, processes_with_arg: ProcessLister
) -> None:
    markers = [unique_seconds() for _ in range(3)]
    pids = []
    for tty, marker in zip((True, False, True), markers, strict=True):
        update = await session.pty_exec_start(
            f"sleep {marker} & echo ready; sleep {marker}; wait", tty=tty, until="ready"
        )
        assert update.process_id is not None
        pids.append(update.process_id)
    assert await eventually(lambda: all(processes_with_arg(m) for m in markers))
    await session.pty_terminate(pids[0])
    assert await eventually(lambda: not processes_with_arg(markers[0]))
    assert {i.process_id for i in session.pty_processes()} == set(pids[1:])
    await session.pty_terminate_all()
    assert session.pty_processes() == []
    assert await eventually(lambda: not any(processes_with_arg(m) for m in markers))
    with pytest.raises(sandbox.PtyProcessNotFoundError):
        await session.pty_terminate(pids[1])


async def test_close_leaves_nothing(
    backend_under_test: Backend, tmp_path: Path, processes_with_arg: ProcessLister
) -> None:
    marker = unique_seconds()
    async with backend_under_test.session(tmp_path) as s:
        await s.pty_exec_start(f"echo ready; exec sleep {marker}", tty=True, until="ready")
        await s.pty_exec_start(f"echo ready; exec sleep {marker}", until="ready")
    assert await eventually(lambda: not processes_with_arg(marker))
    with pytest.raises(sandbox.SessionClosedError):
        await s.exec("true")
    with pytest.raises(sandbox.SessionClosedError):
        await s.pty_exec_start("true")
    await s.aclose()  # idempotent


# ---- cancellation at every await point --------------------------------------------------


def _registry_consistent(session: BaseSandboxSession) -> None:
    live = {i.process_id for i in session.pty_processes()}
    assert live <= reserved_ids(session)


async def test_cancel_start_at_every_step(
    session: BaseSandboxSession, processes_with_arg: ProcessLister
) -> None:
    marker = unique_seconds()
    for steps in range(0, 40, 3):
        outcome = await cancel_after(
            session.pty_exec_start(f"exec sleep {marker}", tty=steps % 2 == 0, yield_time_s=30),
            steps,
        )
        assert isinstance(outcome, asyncio.CancelledError)
        _registry_consistent(session)
        assert session.pty_processes() == [], "a cancelled start must not leave its process"
    assert await eventually(lambda: not processes_with_arg(marker))
    assert reserved_ids(session) == set()


async def test_cancel_write_and_poll_at_every_step(session: BaseSandboxSession) -> None:
    update = await session.pty_exec_start("echo ready; exec cat", tty=True, until="ready")
    pid = update.process_id
    assert pid is not None
    for steps in range(0, 30, 3):
        await cancel_after(session.pty_write_stdin(pid, "line\n", yield_time_s=5), steps)
        await cancel_after(session.pty_write_stdin(pid, "", yield_time_s=30), steps)
        _registry_consistent(session)
        assert [i.process_id for i in session.pty_processes()] == [pid]
    # The process is still healthy and nothing was lost or interleaved.
    update = await session.pty_write_stdin(
        pid, "final\n", until=re.compile("final\r?\n.*final", re.S)
    )
    assert update.process_id == pid


async def test_cancel_terminate_at_every_step(
    session: BaseSandboxSession, processes_with_arg: ProcessLister
) -> None:
    for steps in range(0, 12, 2):
        marker = unique_seconds()
        update = await session.pty_exec_start(f"echo ready; exec sleep {marker}", until="ready")
        pid = update.process_id
        assert pid is not None
        outcome = await cancel_after(session.pty_terminate(pid), steps)
        assert outcome is None or isinstance(outcome, asyncio.CancelledError)
        _registry_consistent(session)
        if steps == 0:  # cancelled before it ran: nothing happened, the process is intact
            assert [i.process_id for i in session.pty_processes()] == [pid]
            await session.pty_terminate(pid)
        assert session.pty_processes() == []
        assert await eventually(lambda m=marker: not processes_with_arg(m))  # type: ignore[misc]
        _registry_consistent(session)
    assert reserved_ids(session) == set()


async def test_cancel_terminate_all_tears_everything_down(
    session: BaseSandboxSession, processes_with_arg: ProcessLister
) -> None:
    marker = unique_seconds()
    for tty in (True, False, True):
        await session.pty_exec_start(f"echo ready; exec sleep {marker}", tty=tty, until="ready")
    outcome = await cancel_after(session.pty_terminate_all(), 1)  # mid-batch
    assert outcome is None or isinstance(outcome, asyncio.CancelledError)
    assert session.pty_processes() == []
    assert await eventually(lambda: not processes_with_arg(marker))
    assert reserved_ids(session) == set()


async def test_cancel_close_at_every_step(
    backend_under_test: Backend, tmp_path: Path, processes_with_arg: ProcessLister
) -> None:
    for steps in (1, 2, 4, 8, 16):
        marker = unique_seconds()
        (tmp_path / str(steps)).mkdir()
        async with backend_under_test.session(tmp_path / str(steps)) as s:
            for tty in (True, False):
                await s.pty_exec_start(f"echo ready; exec sleep {marker}", tty=tty, until="ready")
            outcome = await cancel_after(s.aclose(), steps)
            assert outcome is None or isinstance(outcome, asyncio.CancelledError)
            assert s.state is sandbox.SessionState.CLOSED, "close completes despite the cancel"
            assert s.pty_processes() == []
            assert await eventually(lambda m=marker: not processes_with_arg(m))  # type: ignore[misc]
            with pytest.raises(sandbox.SessionClosedError):
                await s.exec("true")


# ---- bounded one-shot output ------------------------------------------------------------

SEQ_LINES = 400_000  # `seq 1 400000` prints about 2.7 MB
SEQ_OUTPUT = "".join(f"{i}\n" for i in range(1, SEQ_LINES + 1)).encode()


async def test_exec_output_keeps_head_and_tail(session: BaseSandboxSession) -> None:
    limit = 1024 * 1024
    result = await session.exec(f"seq 1 {SEQ_LINES}; seq 1 {SEQ_LINES} >&2", max_output_bytes=limit)
    assert result.exit_code == 0
    expected = SEQ_OUTPUT[: limit // 2] + SEQ_OUTPUT[-(limit - limit // 2) :]
    for kept, omitted in (
        (result.stdout, result.stdout_omitted),
        (result.stderr, result.stderr_omitted),
    ):
        assert omitted == len(SEQ_OUTPUT) - limit
        assert len(kept) == limit
        assert kept == expected
    # Under the (16 MiB) default nothing is dropped.
    whole = await session.exec(f"seq 1 {SEQ_LINES}")
    assert (whole.stdout, whole.stdout_omitted, whole.stderr_omitted) == (SEQ_OUTPUT, 0, 0)


async def test_exec_timeout_keeps_a_flood_bounded(session: BaseSandboxSession) -> None:
    limit = 10_000
    with pytest.raises(sandbox.ExecTimeoutError) as info:
        await session.exec("yes", timeout=2, max_output_bytes=limit)
    error = info.value
    assert len(error.stdout) == limit
    assert error.stdout_omitted > 0
    assert set(error.stdout) <= set(b"y\n")
    assert (await session.exec("echo still-here")).stdout == b"still-here\n"


async def test_exec_output_limit_is_checked(session: BaseSandboxSession) -> None:
    for bad in (-1, 1.5, "1", True):
        with pytest.raises(sandbox.InvalidArgumentError, match="max_output_bytes"):
            await session.exec("true", max_output_bytes=bad)  # type: ignore[arg-type]
    nothing = await session.exec("echo hello", max_output_bytes=0)
    assert (nothing.stdout, nothing.stdout_omitted) == (b"", 6)


# ---- what cannot start: the same errors on every backend ----------------------------------


async def _start(session: BaseSandboxSession, how: str, *command: str, **options: Any) -> None:
    """Start `command` as a one-shot `exec`, or as a process on a terminal or on pipes."""
    if how == "exec":
        await session.exec(*command, **options)
    else:
        await session.pty_exec_start(*command, tty=how == "tty", yield_time_s=10, **options)


START_WAYS = ["exec", "tty", "pipes"]


@pytest.mark.parametrize("how", START_WAYS)
async def test_missing_program_without_shell(session: BaseSandboxSession, how: str) -> None:
    await session.exec("echo '#!/bin/sh' > not-executable.sh")
    for program, words in (
        ("no-such-program-5f2a", "was not found"),
        ("./no-such-program-5f2a", "does not exist"),
        ("./not-executable.sh", "not an executable"),
    ):
        with pytest.raises(sandbox.CommandNotFoundError, match=words) as info:
            await _start(session, how, program, "arg", shell=False)
        assert info.value.program == program and program in str(info.value)
        assert session.pty_processes() == []
    # With a shell, a missing program is the shell's exit status 127: a normal result.
    if how == "exec":
        assert (await session.exec("no-such-program-5f2a")).exit_code == 127
    else:
        update = await session.pty_exec_start("no-such-program-5f2a", tty=how == "tty")
        assert update.exit_code == 127


@pytest.mark.parametrize("how", START_WAYS)
@pytest.mark.parametrize("shell", [True, False], ids=["shell", "argv"])
async def test_bad_cwd(session: BaseSandboxSession, how: str, shell: bool) -> None:
    await session.exec("touch a-file")
    for cwd, words in (("no-such-dir", "does not exist"), ("a-file", "is not a directory")):
        with pytest.raises(sandbox.WorkdirError, match=words) as info:
            await _start(session, how, "pwd", cwd=cwd, shell=shell)
        assert info.value.cwd == cwd and repr(cwd) in str(info.value)
        assert session.pty_processes() == []


@pytest.mark.parametrize("how", START_WAYS)
async def test_checked_start_runs_the_command_unchanged(
    session: BaseSandboxSession, how: str
) -> None:
    # A `cwd` with `shell=False`: both checks pass and leave no trace in the output.
    await session.exec("mkdir -p sub")
    command = ("sh", "-c", 'echo "$GREETING"; pwd; exit 4')
    options: dict[str, Any] = {"shell": False, "cwd": "sub", "env": {"GREETING": "hola"}}
    code: int | None
    if how == "exec":
        result = await session.exec(*command, **options)
        lines = result.stdout.decode().splitlines()
        code, stderr = result.exit_code, result.stderr
    else:
        update = await session.pty_exec_start(*command, tty=how == "tty", **options)
        lines = update.output.replace("\r", "").splitlines()
        code, stderr = update.exit_code, b""
    assert code == 4 and stderr == b""
    assert lines[0] == "hola" and lines[1].endswith("/sub") and len(lines) == 2


@pytest.mark.parametrize("how", START_WAYS)
async def test_bad_env_is_an_invalid_argument(session: BaseSandboxSession, how: str) -> None:
    for env, words in (
        ({"A": "x\0y"}, "NUL"),
        ({"A": 1}, "must be a str"),
        ({"A=B": "x"}, "invalid variable name"),
        (["A=1"], "mapping"),
    ):
        with pytest.raises(sandbox.InvalidArgumentError, match=words):
            await _start(session, how, "true", env=env)
    with pytest.raises(sandbox.InvalidArgumentError, match="cwd"):
        await _start(session, how, "true", cwd=7)
    with pytest.raises(sandbox.InvalidArgumentError, match="cwd"):
        await _start(session, how, "true", cwd="a\0b")
    assert session.pty_processes() == []


@needs("files")
@pytest.mark.parametrize("how", START_WAYS)
async def test_invalid_names_and_lone_surrogates_are_invalid_arguments(
    session: BaseSandboxSession, how: str
) -> None:
    # A name no shell can export, and text with no UTF-8 form (a JSON "\ud800" from an
    # MCP client): refused before anything runs, the same on every backend.
    for env in ({"1A": "x"}, {"A-B": "x"}, {"A B": "x"}, {"": "x"}, {"\u00e9": "x"}):
        with pytest.raises(sandbox.InvalidArgumentError, match="invalid variable name"):
            await _start(session, how, "touch made", env=env)
    for options in (
        {"env": {"A": "\ud800"}},
        {"cwd": "\udfff"},
    ):
        with pytest.raises(sandbox.InvalidArgumentError, match="surrogate"):
            await _start(session, how, "touch made", **options)
    with pytest.raises(sandbox.InvalidArgumentError, match="surrogate"):
        await _start(session, how, "touch made; echo \ud800")
    with pytest.raises(sandbox.InvalidArgumentError, match="surrogate"):
        await _start(session, how, "touch", "made\ud800", shell=False)
    with pytest.raises(sandbox.InvalidArgumentError, match="surrogate"):
        await session.read_file("made\ud800")
    with pytest.raises(sandbox.InvalidArgumentError, match="surrogate"):
        await session.write_file("made\ud800", b"x")
    assert session.pty_processes() == []
    assert (await session.exec("ls")).stdout.split().count(b"made") == 0


async def test_lone_surrogate_keystrokes_are_invalid_arguments(session: BaseSandboxSession) -> None:
    update = await session.pty_exec_start("cat", tty=True, yield_time_s=0.3)
    assert update.process_id is not None
    with pytest.raises(sandbox.InvalidArgumentError, match="surrogate"):
        await session.pty_write_stdin(update.process_id, "a\ud800b\n")
    reply = await session.pty_write_stdin(update.process_id, "still here\n", until="still here\r\n")
    assert "still here" in reply.output
    await session.pty_terminate(update.process_id)


# Every C0 control character and DEL, plus what would run a command if a line editor
# acted on it (Ctrl-U erases the line so far, CR submits it, Ctrl-C abandons it).
CONTROL_TEXT = (
    "".join(chr(code) for code in range(1, 32))
    + "\x7f"
    + " \x15touch pwned-u #"
    + " \rtouch pwned-r #"
    + " \x03touch pwned-c #"
    + " \x17\x16\x7f;touch pwned-w;"
    + " \u00e9\u20ac"
)
# A directory name holds no '/' (nor NUL); the rest of the text is kept.
CONTROL_DIR = "d" + CONTROL_TEXT.replace("/", "")


@needs("files")
@pytest.mark.parametrize("how", START_WAYS)
@pytest.mark.parametrize("shell", [True, False], ids=["shell", "argv"])
async def test_control_characters_are_data(
    session: BaseSandboxSession, how: str, shell: bool
) -> None:
    await session.exec("mkdir", CONTROL_DIR, shell=False)
    # What the process sees is written to files (a terminal would echo and translate it).
    script = 'printf %s "$V" > ../env.out; printf %s "$1" > ../arg.out; pwd > ../cwd.out'
    if shell:
        # The caller's own script holds the controls too (in a quoted word).
        command: tuple[str, ...] = (f"set -- {shlex.quote(CONTROL_TEXT)}; {script}",)
    else:
        command = ("sh", "-c", script, "sh", CONTROL_TEXT)
    options: dict[str, Any] = {"env": {"V": CONTROL_TEXT}, "cwd": CONTROL_DIR, "shell": shell}
    if how == "exec":
        result = await session.exec(*command, **options)
        assert result.exit_code == 0, result
    else:
        update = await session.pty_exec_start(
            *command, tty=how == "tty", yield_time_s=20, **options
        )
        assert update.exit_code == 0, update
    expected = CONTROL_TEXT.encode()
    assert await session.read_file("env.out") == expected
    assert await session.read_file("arg.out") == expected
    assert (await session.read_file("cwd.out")).endswith(b"/" + CONTROL_DIR.encode() + b"\n")
    # Nothing else ran: no line editor turned a part of the data into a command.
    listing = await session.exec("sh", "-c", 'ls -a; ls -a "$1"', "sh", CONTROL_DIR, shell=False)
    names = listing.stdout.split(b"\n")
    assert [name for name in names if name.startswith(b"pwned")] == [], listing


# ---- rendered screens ---------------------------------------------------------------


async def test_screen_renders_tty_output_and_until_screen(session: BaseSandboxSession) -> None:
    started = time.monotonic()
    update = await session.pty_exec_start(
        "printf 'hello\\nworld\\n'; sleep 0.3; printf 'ready'; exec sleep 30",
        tty=True,
        until_screen=re.compile(r"world\nready"),
        yield_time_s=20,
    )
    assert time.monotonic() - started < 10, "until_screen must end the window early"
    pid = update.process_id
    assert pid is not None and update.screen is not None
    snap = await session.pty_screen(pid)
    assert snap.lines[:3] == ("hello", "world", "ready")
    assert (snap.cursor_row, snap.cursor_col) == (2, 5)
    assert not snap.alternate_screen
    assert [i.has_screen for i in session.pty_processes()] == [True]


# ---- streamed one-shot commands (`exec_stream`) -------------------------------------------

STREAM_WAIT_S = 60.0  # a stream that never delivers fails here instead of hanging


async def _stream_until(
    stream: sandbox.ExecStream, seen: dict[str, bytearray], stream_name: str, text: bytes
) -> None:
    """Take chunks into `seen` until `stream_name` holds `text`."""
    if text in seen[stream_name]:
        return  # came already, before what the last call waited for
    async with asyncio.timeout(STREAM_WAIT_S):
        async for chunk in stream:
            seen[chunk.stream] += chunk.data
            assert not chunk.omitted
            if text in seen[stream_name]:
                return
    raise AssertionError(f"the stream ended before {text!r} came: {seen}")


async def test_exec_stream_delivers_output_while_the_command_runs(
    session: BaseSandboxSession, backend_under_test: Backend
) -> None:
    if backend_under_test.exec_output_at_end:
        pytest.skip(f"{backend_under_test.name} hands over a command's output at its end")
    # The command prints, then waits on a FIFO only this test writes to: what it printed
    # must arrive while it waits, stdout and stderr apart.
    await session.exec("mkfifo gate")
    seen: dict[str, bytearray] = {"stdout": bytearray(), "stderr": bytearray()}
    script = (
        "echo first; echo err-first >&2; read x < gate; echo second; echo err-second >&2; exit 5"
    )
    async with session.exec_stream(script) as stream:
        await _stream_until(stream, seen, "stdout", b"first\n")
        await _stream_until(stream, seen, "stderr", b"err-first\n")
        assert stream.exit_code is None
        await session.exec("echo go > gate")
        async with asyncio.timeout(STREAM_WAIT_S):
            async for chunk in stream:
                seen[chunk.stream] += chunk.data
    assert seen == {"stdout": b"first\nsecond\n", "stderr": b"err-first\nerr-second\n"}
    assert stream.exit_code == 5


async def test_exec_stream_keeps_each_stream_in_order(session: BaseSandboxSession) -> None:
    lines = 3000
    script = f"i=0; while [ $i -lt {lines} ]; do i=$((i+1)); echo o$i; echo e$i >&2; done"
    seen: dict[str, bytearray] = {"stdout": bytearray(), "stderr": bytearray()}
    async with session.exec_stream(script) as stream:
        async for chunk in stream:
            assert chunk.data and not chunk.omitted
            seen[chunk.stream] += chunk.data
    for name, prefix in (("stdout", "o"), ("stderr", "e")):
        expected = "".join(f"{prefix}{i}\n" for i in range(1, lines + 1)).encode()
        assert bytes(seen[name]) == expected, name
    assert stream.exit_code == 0
    assert (stream.stdout_omitted, stream.stderr_omitted) == (0, 0)


async def test_exec_stream_timeout_kills_the_tree(
    session: BaseSandboxSession, processes_with_arg: ProcessLister
) -> None:
    marker = unique_seconds()
    got = bytearray()
    with pytest.raises(sandbox.ExecTimeoutError) as info:
        async with session.exec_stream(
            f"echo before; sleep {marker} & sleep {marker}; wait", timeout=1.5
        ) as stream:
            async for chunk in stream:
                got += chunk.data
    assert got == b"before\n"
    assert info.value.stdout == b""  # yielded already, not repeated
    assert await eventually(lambda: not processes_with_arg(marker))
    assert (await session.exec("echo still-here")).stdout == b"still-here\n"


async def test_exec_stream_left_early_kills_the_tree(
    session: BaseSandboxSession, processes_with_arg: ProcessLister
) -> None:
    marker = unique_seconds()
    async with session.exec_stream(f"sleep {marker} & sleep {marker}; wait") as stream:
        assert await eventually(lambda: len(processes_with_arg(marker)) == 2, STREAM_WAIT_S)
    assert await eventually(lambda: not processes_with_arg(marker))
    assert stream.exit_code is None
    assert (await session.exec("echo still-here")).stdout == b"still-here\n"


async def test_exec_stream_cancelled_while_waiting_kills_the_tree(
    session: BaseSandboxSession, processes_with_arg: ProcessLister
) -> None:
    marker = unique_seconds()

    async def consume() -> None:
        async with session.exec_stream(f"sleep {marker} & sleep {marker}; wait") as stream:
            async for _ in stream:
                raise AssertionError("nothing was printed")

    task = asyncio.ensure_future(consume())
    try:
        # The command prints nothing: once it runs, the consumer waits for a chunk.
        assert await eventually(lambda: len(processes_with_arg(marker)) == 2, STREAM_WAIT_S)
        assert not task.done()
    finally:
        task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await eventually(lambda: not processes_with_arg(marker))


async def test_exec_stream_ends_with_the_session_close(
    backend_under_test: Backend, tmp_path: Path, processes_with_arg: ProcessLister
) -> None:
    marker = unique_seconds()
    async with backend_under_test.session(tmp_path) as s:
        async with s.exec_stream(f"exec sleep {marker}") as stream:
            assert await eventually(lambda: bool(processes_with_arg(marker)), STREAM_WAIT_S)
            closing = asyncio.ensure_future(s.aclose())
            with pytest.raises(sandbox.SessionClosedError):
                async for _ in stream:
                    pass
            await closing
    assert await eventually(lambda: not processes_with_arg(marker))
    with pytest.raises(sandbox.SessionClosedError):
        async with s.exec_stream("true"):
            pass


async def test_exec_stream_raises_what_cannot_start(session: BaseSandboxSession) -> None:
    await session.exec("touch a-file; mkdir -p sub")
    for options, error in (
        ({"cwd": "no-such-dir"}, sandbox.WorkdirError),
        ({"cwd": "a-file", "shell": False}, sandbox.WorkdirError),
    ):
        chunks: list[sandbox.ExecChunk] = []
        with pytest.raises(error):
            async with session.exec_stream("pwd", **options) as stream:
                chunks.extend([chunk async for chunk in stream])
        assert chunks == []  # the check's marker is never output
    with pytest.raises(sandbox.CommandNotFoundError):
        async with session.exec_stream("no-such-program-5f2a", "x", shell=False) as stream:
            chunks.extend([chunk async for chunk in stream])
    assert chunks == []
    # A check that passes leaves no trace in the output.
    got: dict[str, bytearray] = {"stdout": bytearray(), "stderr": bytearray()}
    command = ("sh", "-c", "echo err >&2; pwd; exit 4")
    async with session.exec_stream(*command, shell=False, cwd="sub") as stream:
        async for chunk in stream:
            got[chunk.stream] += chunk.data
    assert got["stderr"] == b"err\n" and got["stdout"].endswith(b"/sub\n")
    assert stream.exit_code == 4
    with pytest.raises(sandbox.InvalidArgumentError, match="max_buffered_bytes"):
        session.exec_stream("true", max_buffered_bytes=-1)


# ---- open stdin (`stdin=True`, `pty_close_stdin`) -------------------------------------


async def _start_with_stdin(
    session: BaseSandboxSession, backend: Backend, command: str
) -> int | None:
    """Start `command` with its stdin open (after it printed `ready`) and return its
    id; where the backend declares no open stdin, check that the start is refused
    before anything runs and return None."""
    if "open_stdin" not in backend.capabilities:
        before, reserved = session.pty_processes(), reserved_ids(session)
        with pytest.raises(sandbox.UnsupportedOperationError, match="stdin=True"):
            await session.pty_exec_start(command, stdin=True, yield_time_s=5)
        assert session.pty_processes() == before
        assert reserved_ids(session) == reserved
        return None
    update = await session.pty_exec_start(
        f"echo ready; {command}", stdin=True, until="ready", yield_time_s=30
    )
    assert update.process_id is not None, update
    assert update.output.replace("\r", "") == "ready\n"
    return update.process_id


async def _final(session: BaseSandboxSession, pid: int) -> tuple[str, int | None]:
    """Poll `pid` until it exits: everything it printed, and its exit code."""
    output = ""
    for _ in range(10):
        update = await session.pty_write_stdin(pid, "", yield_time_s=10)
        output += update.output
        if update.process_id is None:
            return output, update.exit_code
    raise AssertionError(f"process {pid} did not exit; it printed {output[-200:]!r}")


async def test_open_stdin_sort_gets_its_eof(
    session: BaseSandboxSession, backend_under_test: Backend
) -> None:
    pid = await _start_with_stdin(session, backend_under_test, "exec sort")
    if pid is None:
        return
    for lines in ("pear\nfig\n", "apple\n", "kiwi\nbanana\n"):
        update = await session.pty_write_stdin(pid, lines, yield_time_s=0.2)
        assert update.unwritten_bytes == 0
        assert update.output == "", "sort prints nothing before the end of its input"
    await session.pty_close_stdin(pid)
    await session.pty_close_stdin(pid)  # a second close changes nothing
    with pytest.raises(sandbox.StdinClosedError, match="pty_close_stdin"):
        await session.pty_write_stdin(pid, "late\n")
    output, code = await _final(session, pid)
    assert output.replace("\r", "") == "apple\nbanana\nfig\nkiwi\npear\n"
    assert code == 0


async def test_open_stdin_large_writes_arrive_before_the_end(
    session: BaseSandboxSession, backend_under_test: Backend
) -> None:
    # More than a pipe or a socket buffer holds, in writes that end with a marker line
    # the process echoes: every byte written before the close reaches it, in order,
    # before its end of input.
    pid = await _start_with_stdin(session, backend_under_test, "cat; echo end=$?")
    if pid is None:
        return
    blocks = [(f"{n:04d}" + "x" * 1019 + "\n") * 64 for n in range(4)]
    seen = ""
    for n, block in enumerate(blocks):
        update = await session.pty_write_stdin(
            pid, block + f"mark{n}\n", until=f"mark{n}", yield_time_s=30
        )
        assert update.unwritten_bytes == 0
        seen += update.output
    await session.pty_close_stdin(pid)
    output, code = await _final(session, pid)
    seen = (seen + output).replace("\r", "")
    expected = "".join(block + f"mark{n}\n" for n, block in enumerate(blocks)) + "end=0\n"
    assert seen == expected
    assert code == 0


async def test_close_stdin_errors(session: BaseSandboxSession, backend_under_test: Backend) -> None:
    tty = await session.pty_exec_start("echo ready; exec cat", tty=True, until="ready")
    assert tty.process_id is not None
    with pytest.raises(sandbox.InvalidArgumentError, match="terminal"):
        await session.pty_close_stdin(tty.process_id)
    # A tty process is the same with stdin=True: a terminal always takes input.
    also_tty = await session.pty_exec_start(
        "echo ready; exec cat", tty=True, stdin=True, until="ready"
    )
    assert also_tty.process_id is not None
    with pytest.raises(sandbox.InvalidArgumentError, match="terminal"):
        await session.pty_close_stdin(also_tty.process_id)
    marker = unique_seconds()
    pipes = await session.pty_exec_start(f"echo ready; exec sleep {marker}", until="ready")
    assert pipes.process_id is not None
    with pytest.raises(sandbox.StdinClosedError, match="stdin=True"):
        await session.pty_close_stdin(pipes.process_id)
    with pytest.raises(sandbox.StdinClosedError, match="stdin=True"):
        await session.pty_write_stdin(pipes.process_id, "x")
    pid = await _start_with_stdin(session, backend_under_test, f"{WAIT_FOR_GO}; echo bye")
    if pid is None:
        return
    await session.exec("touch go")
    output, code = await _final(session, pid)
    assert (output.replace("\r", ""), code) == ("bye\n", 0)
    with pytest.raises(sandbox.PtyProcessNotFoundError):
        await session.pty_close_stdin(pid)
    # Exited but not yet collected: the close says it exited.
    wait = WAIT_FOR_GO.replace("go", "go2")
    pid = await _start_with_stdin(session, backend_under_test, f"{wait}; exit 3")
    assert pid is not None
    await session.exec("touch go2")
    assert await eventually(lambda: _exited(session, pid), timeout=15)
    with pytest.raises(sandbox.ProcessExitedError):
        await session.pty_close_stdin(pid)


def _exited(session: BaseSandboxSession, pid: int) -> bool:
    return any(i.process_id == pid and i.exit_code is not None for i in session.pty_processes())


async def test_close_stdin_cancelled_while_the_hook_is_blocked(
    session: BaseSandboxSession, backend_under_test: Backend
) -> None:
    pid = await _start_with_stdin(session, backend_under_test, "exec sort")
    if pid is None:
        return
    await session.pty_write_stdin(pid, "b\na\n", yield_time_s=0.1)
    gate = park_calls(session, "_close_stdin")
    closing = asyncio.ensure_future(session.pty_close_stdin(pid))
    await gate.reached.wait()
    closing.cancel()
    with pytest.raises(asyncio.CancelledError):
        await closing
    assert gate.abandoned.is_set()
    _registry_consistent(session)
    assert [i.process_id for i in session.pty_processes()] == [pid]
    # The end of input was asked: no more writes; a second close does the work.
    with pytest.raises(sandbox.StdinClosedError):
        await session.pty_write_stdin(pid, "c\n")
    gate.release()
    await session.pty_close_stdin(pid)
    output, code = await _final(session, pid)
    assert (output.replace("\r", ""), code) == ("a\nb\n", 0)
    assert reserved_ids(session) == set()


async def test_close_stdin_raced_by_a_terminate(
    session: BaseSandboxSession,
    backend_under_test: Backend,
    processes_with_arg: ProcessLister,
) -> None:
    marker = unique_seconds()
    pid = await _start_with_stdin(session, backend_under_test, f"cat; exec sleep {marker}")
    if pid is None:
        return
    gate = park_calls(session, "_close_stdin")
    closing = asyncio.ensure_future(session.pty_close_stdin(pid))
    await gate.reached.wait()
    # The terminate ends the blocked close first (as it ends a pending write).
    await session.pty_terminate(pid)
    with pytest.raises(sandbox.SandboxError):
        await closing
    assert gate.abandoned.is_set()
    _registry_consistent(session)
    assert session.pty_processes() == []
    assert reserved_ids(session) == set()
    assert await eventually(lambda: not processes_with_arg(marker))


async def test_close_stdin_raced_by_the_session_close(
    backend_under_test: Backend, tmp_path: Path, processes_with_arg: ProcessLister
) -> None:
    marker = unique_seconds()
    async with backend_under_test.session(tmp_path) as s:
        pid = await _start_with_stdin(s, backend_under_test, f"cat; exec sleep {marker}")
        if pid is None:
            return
        gate = park_calls(s, "_close_stdin")
        closing = asyncio.ensure_future(s.pty_close_stdin(pid))
        await gate.reached.wait()
        await s.aclose()  # ends the blocked close first, then the process
        with pytest.raises(sandbox.SessionClosedError):
            await closing
        assert gate.abandoned.is_set()
        assert s.pty_processes() == []
    assert await eventually(lambda: not processes_with_arg(marker))


mark_async_tests(globals())
