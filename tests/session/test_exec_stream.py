"""`session.exec_stream`: bounded memory whatever the volume, and never a silent loss.

The behaviour every backend shares (chunks while the command runs, streams apart and in
order, the timeout, leaving early, cancellation, the close) is in the conformance suite;
here the volume and the bound, on unix_local and on the real Docker engine, and the
queue itself (`StreamCapture`) fed directly.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

import sandbox
from sandbox import arguments
from sandbox.backends.toolkit.check import CHECK_FAILED_EXIT, CommandCheck
from sandbox.session.exec_stream import PIECE_COST, ExecChunk, StreamCapture
from sandbox.testing.procfs import rss_bytes
from tests.backend_fixtures import docker as docker_fixture

MIB = 1024 * 1024


@pytest.fixture(params=["unix_local", "docker"])
async def session(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[sandbox.BaseSandboxSession]:
    if request.param == "docker":
        reason = docker_fixture.skip_reason()
        if reason is not None:
            pytest.skip(reason)
        async with docker_fixture.BACKEND.session(tmp_path) as s:
            yield s
        return
    async with sandbox.open_session("unix_local", workdir=str(tmp_path / "ws")) as s:
        yield s


async def test_fifty_megabytes_pass_with_bounded_memory(
    session: sandbox.BaseSandboxSession,
) -> None:
    size = 50_000_000
    await session.exec("true")  # the session's own first-use allocations come first
    baseline = peak = rss_bytes()
    total = 0
    # The bound need only exceed what one turn of the event loop reads (docker: 2 MiB).
    command = f"head -c {size} /dev/zero"
    async with session.exec_stream(command, max_buffered_bytes=4 * MIB) as stream:
        async for chunk in stream:
            assert not chunk.omitted  # this consumer keeps up: nothing is dropped
            assert chunk.stream == "stdout"
            total += len(chunk.data)
            peak = max(peak, rss_bytes())
    assert total == size and stream.exit_code == 0
    assert peak - baseline < 16 * MIB, f"RSS grew by {(peak - baseline) / MIB:.1f} MiB"


async def test_a_consumer_that_falls_behind_is_told_what_it_lost(
    session: sandbox.BaseSandboxSession,
) -> None:
    size, bound = 5_000_000, 64 * 1024
    await session.exec("mkfifo done")
    chunks: list[ExecChunk] = []
    command = f"head -c {size} /dev/zero; echo > done"
    async with session.exec_stream(command, max_buffered_bytes=bound) as stream:
        # Take nothing until the command wrote everything: the event loop reads it all
        # meanwhile, and what exceeds the bound must be dropped, and said.
        await session.exec("cat done")
        chunks.extend([chunk async for chunk in stream])
    assert stream.exit_code == 0
    omissions = [c for c in chunks if c.omitted]
    assert omissions, "a consumer that fell behind was not told"
    assert all(c.data == b"" and c.stream == "stdout" for c in omissions)
    kept = b"".join(c.data for c in chunks)
    assert set(kept) == {0}
    assert len(kept) + sum(c.omitted for c in chunks) == size
    assert stream.stdout_omitted == sum(c.omitted for c in chunks)
    assert stream.stderr_omitted == 0


# ---- the queue itself ---------------------------------------------------------------------


def _capture(bound: int) -> StreamCapture:
    return StreamCapture(bound, timeout=None, wake=lambda: None)


def _drain(capture: StreamCapture) -> list[ExecChunk]:
    chunks = []
    while (chunk := capture.take()) is not None:
        chunks.append(chunk)
    return chunks


def test_tiny_chunks_of_both_streams_stay_bounded() -> None:
    bound = 4096
    capture = _capture(bound)
    for _ in range(50_000):
        capture.add_stdout(b"o")
        capture.add_stderr(b"e")
    chunks = _drain(capture)
    # Each waiting piece counts against the bound: the queue cannot grow piece by piece.
    assert len(chunks) <= bound // PIECE_COST + 2
    for name, byte in (("stdout", b"o"), ("stderr", b"e")):
        mine = [c for c in chunks if c.stream == name]
        data = b"".join(c.data for c in mine)
        assert set(data) <= set(byte)
        assert len(data) + sum(c.omitted for c in mine) == 50_000
        assert capture.omitted[name] == sum(c.omitted for c in mine) > 0


def test_a_chunk_is_copied_when_it_is_queued() -> None:
    capture = _capture(MIB)
    buffer = bytearray(b"first")
    capture.add_stdout(memoryview(buffer))
    buffer[:] = b"later"  # a backend reusing its read buffer
    assert _drain(capture) == [ExecChunk("stdout", b"first")]


def _checked() -> CommandCheck:
    spec = arguments.build_command(("pwd",), shell=True, env=None, cwd="sub")
    return CommandCheck(spec, cwd="/ws/sub")


def test_a_check_failure_marker_is_never_output() -> None:
    capture = _capture(MIB)
    check = capture.check = _checked()
    marker = check.failure_prefix + b"nocwd\x1e"
    capture.add_stderr(b"login noise\n" + marker[:3])
    assert _drain(capture) == [ExecChunk("stderr", b"login noise\n")]
    capture.add_stderr(marker[3:])
    assert _drain(capture) == []
    with pytest.raises(sandbox.WorkdirError):
        capture.result(CHECK_FAILED_EXIT)
    assert _drain(capture) == []


def test_bytes_held_as_a_possible_marker_come_out_when_they_are_not_one() -> None:
    capture = _capture(MIB)
    check = capture.check = _checked()
    capture.add_stderr(b"a\x1eF")  # may begin a marker: held
    assert _drain(capture) == [ExecChunk("stderr", b"a")]
    capture.add_stderr(b"not-the-token\n")
    assert b"".join(c.data for c in _drain(capture)) == b"\x1eFnot-the-token\n"
    capture.add_stdout(check.failure_prefix[:4])  # held until the end says otherwise
    assert _drain(capture) == []
    result = capture.result(0)
    assert result.exit_code == 0 and (result.stdout, result.stderr) == (b"", b"")
    assert _drain(capture) == [ExecChunk("stdout", check.failure_prefix[:4])]
