"""`sandbox.runner.text_link`, the runner's protocol over a text-only stream (`connect
--text`, docs/runner.md): the codec at its edges (lines split anywhere, CRLF, empty
lines, invalid base64, over-long lines, a last line without its newline), a seeded fuzz
of chunkings, the writer's order and its refusal to cut a send, and the real binary's
`connect --text --start` carrying a `RunnerClient` end to end (every byte value).
"""

from __future__ import annotations

import asyncio
import binascii
import contextlib
import os
import random
import shlex
import shutil
import signal
import subprocess
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import cast

import pytest

from sandbox.runner import binary as runner_binary_module
from sandbox.runner.client import RunnerClient
from sandbox.runner.errors import RunnerProtocolError
from sandbox.runner.frames import Stream
from sandbox.runner.text_link import (
    END_LINE,
    LINE_DATA,
    MAX_BEFORE_READY,
    MAX_LINE,
    LineDecoder,
    TextLink,
    TextLinkError,
    encode_lines,
)
from sandbox.testing import procfs
from sandbox.testing.conformance import eventually
from tests.conftest import skip_or_fail

REPO = Path(__file__).resolve().parents[2]


def decode_all(chunks: list[str]) -> bytes:
    decoder = LineDecoder()
    out = b"".join(decoder.feed(chunk) for chunk in chunks)
    return out + decoder.finish()


# ---- the codec -------------------------------------------------------------------------


def test_lines_are_bounded_and_decode_back() -> None:
    data = bytes(range(256)) * (LINE_DATA // 128)  # two full lines and a bit
    text = encode_lines(data)
    lines = text.split("\n")
    assert lines[-1] == "" and all(len(line) + 2 <= MAX_LINE for line in lines)
    assert len(lines) - 1 == -(-len(data) // LINE_DATA)
    assert decode_all([text]) == data
    assert encode_lines(b"") == ""


def test_a_line_split_at_every_place_and_crlf() -> None:
    text = encode_lines(b"hello") + encode_lines(b"world").replace("\n", "\r\n") + "\n\n"
    for cut in range(len(text) + 1):
        assert decode_all([text[:cut], text[cut:]]) == b"helloworld", cut
    assert decode_all(list(text)) == b"helloworld"  # one character at a time


def test_a_last_line_without_newline_counts_at_the_end_only() -> None:
    decoder = LineDecoder()
    assert decoder.feed("Zm9v") == b""
    assert decoder.finish() == b"foo"
    assert decoder.finish() == b""


@pytest.mark.parametrize(
    "bad", ["Zg=\n", "Zg===\n", "Zm9v!mFy\n", "Zg==Zm8=\n", "Zm 9v\n", "=Zm9\n", "Zm9vé\n"]
)
def test_what_is_not_base64_is_refused(bad: str) -> None:
    with pytest.raises(TextLinkError, match="not base64"):
        LineDecoder().feed(bad)


def test_an_over_long_line_is_refused_without_waiting_for_its_end() -> None:
    decoder = LineDecoder()
    decoder.feed("A" * (MAX_LINE - 1))
    with pytest.raises(TextLinkError, match="longer than"):
        decoder.feed("AAAA")  # no newline yet: refused anyway, memory stays bounded
    with pytest.raises(TextLinkError, match="at most"):
        LineDecoder().feed("A" * (MAX_LINE + 2) + "\n")
    # The longest line the runner sends is accepted, also with CRLF.
    longest = encode_lines(bytes(LINE_DATA)).replace("\n", "\r\n")
    assert decode_all([longest]) == bytes(LINE_DATA)


def test_fuzz_random_data_in_random_chunks() -> None:
    rng = random.Random(20261206)
    for _ in range(200):
        data = rng.randbytes(rng.randrange(0, 3 * LINE_DATA // 2))
        text = encode_lines(data)
        if rng.random() < 0.3:
            text = text.replace("\n", "\r\n")
        cuts = sorted(rng.randrange(0, len(text) + 1) for _ in range(rng.randrange(0, 8)))
        chunks = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
        assert decode_all(chunks) == data


def test_fuzz_garbage_is_refused_or_decoded_never_raises_otherwise() -> None:
    rng = random.Random(7)
    alphabet = "ABCZabz09+/=\r\n!é "
    for _ in range(500):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 200)))
        decoder = LineDecoder(max_line=64)
        try:
            decoder.feed(text)
            decoder.finish()
        except TextLinkError:
            pass


# ---- the link -------------------------------------------------------------------------


async def test_the_reader_gets_the_bytes_and_a_bad_line_ends_it_with_a_protocol_error() -> None:
    sent: list[str] = []

    async def send(text: str) -> None:
        sent.append(text)

    async def end_input() -> None:
        pass

    link = TextLink(send, end_input)
    text = encode_lines(b"\x00\xff frames")
    link.feed_text(text[:3])
    link.feed_text(text[3:])
    assert await link.reader.readexactly(9) == b"\x00\xff frames"
    link.feed_text("%%%\n")
    with pytest.raises(RunnerProtocolError, match="not base64"):
        await link.reader.read(1)
    assert link.ended and link.writer.is_closing()
    link.feed_text(encode_lines(b"late"))  # ignored once ended


async def test_sends_keep_their_order_and_a_cancelled_drain_never_cuts_one() -> None:
    received: list[str] = []
    gate = asyncio.Event()

    async def send(text: str) -> None:
        await gate.wait()
        received.append(text)

    ended = asyncio.Event()

    async def end_input() -> None:
        ended.set()

    link = TextLink(send, end_input)
    writer = link.writer
    writer.write(b"first")
    drain = asyncio.ensure_future(writer.drain())
    await asyncio.sleep(0)
    drain.cancel()  # the send in flight goes on
    with pytest.raises(asyncio.CancelledError):
        await drain
    writer.write(b"second")
    second = asyncio.ensure_future(writer.drain())
    await asyncio.sleep(0)
    assert received == []
    gate.set()
    await second
    assert [binascii.a2b_base64(t) for t in received] == [b"first", b"second"]
    writer.close()
    await writer.wait_closed()
    assert ended.is_set()
    with pytest.raises(ConnectionResetError):
        writer.write(b"after")


async def test_a_failed_send_breaks_the_link_for_good() -> None:
    async def send(text: str) -> None:
        raise OSError("gone")

    async def end_input() -> None:
        pass

    link = TextLink(send, end_input)
    link.writer.write(b"x")
    with pytest.raises(ConnectionResetError, match="OSError"):
        await link.writer.drain()
    with pytest.raises(ConnectionResetError):
        link.writer.write(b"y")
    with pytest.raises(RunnerProtocolError):
        await link.reader.read(1)


# ---- the real binary ----------------------------------------------------------------------


@pytest.fixture
async def text_bridge() -> AsyncIterator[tuple[TextLink, asyncio.subprocess.Process]]:
    """`sandbox-runner connect --text --start` as a local process: its stdout is read as
    text (as a provider's SDK hands it over), its stdin takes the link's lines."""
    found = runner_binary_module.runner_binary()
    if found is None:
        if shutil.which("cargo") is None:
            skip_or_fail(f"{runner_binary_module.unavailable_reason()}; cargo is not installed")
        subprocess.run(["make", "runner"], cwd=REPO, check=False, timeout=900)
        found = runner_binary_module.runner_binary()
        assert found is not None, runner_binary_module.unavailable_reason()
    folder = tempfile.mkdtemp(prefix="rtl-", dir="/tmp")
    sock = f"{folder}/r.sock"
    bridge = await asyncio.create_subprocess_exec(
        str(found.path),
        *("connect", "--text", "--start", "--socket", sock, "--orphan-timeout", "30"),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    assert bridge.stdin is not None and bridge.stdout is not None
    stdin, stdout = bridge.stdin, bridge.stdout

    async def send(text: str) -> None:
        stdin.write(text.encode("ascii"))
        await stdin.drain()

    async def end_input() -> None:
        stdin.close()

    link = TextLink(send, end_input)

    async def pump() -> None:
        while chunk := await stdout.read(7000):  # chunks that split lines anywhere
            link.feed_text(chunk.decode("utf-8", "replace"))
        link.feed_eof()

    reader = asyncio.ensure_future(pump())
    try:
        yield link, bridge
    finally:
        if bridge.returncode is None:
            bridge.kill()
        await bridge.wait()
        await asyncio.wait([reader])
        # The daemon it started (`serve --socket SOCK`): SIGTERM ends it with all it keeps.
        for pid in procfs.pids_with_arg(sock):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        assert await eventually(lambda: procfs.pids_with_arg(sock) == [])
        shutil.rmtree(folder, ignore_errors=True)


class Collect:
    def __init__(self) -> None:
        self.out = bytearray()
        self.code: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    def feed(self, data: bytes, stream: Stream) -> None:
        self.out += data

    def gap(self, start: int, end: int, stream: Stream) -> None:
        raise AssertionError("no gap expected")

    def exited(self, code: int) -> None:
        self.code.set_result(code)

    def lost(self, reason: str) -> None:
        if not self.code.done():
            self.code.set_exception(AssertionError(reason))


async def test_the_runner_through_connect_text_carries_every_byte(
    text_bridge: tuple[TextLink, asyncio.subprocess.Process],
) -> None:
    link, bridge = text_bridge
    client = await RunnerClient.open(
        link.reader, cast(asyncio.StreamWriter, link.writer), timeout=10
    )
    try:
        data = bytes(range(256)) * 1000  # several lines each way
        sink = Collect()
        await client.spawn(1, ["cat"], env={"PATH": "/usr/bin:/bin"}, sink=sink, stdin_open=True)
        await client.write(1, data)
        await client.close_stdin(1)
        assert await asyncio.wait_for(sink.code, 10) == 0
        assert bytes(sink.out) == data
    finally:
        await client.aclose()
    # Ending the link's input ends the bridge (exit 0); the runner stays.
    assert await asyncio.wait_for(bridge.wait(), 10) == 0


@pytest.mark.parametrize(
    ("bad", "said"),
    [(b"not base64!\n", "base64"), (b"A" * (MAX_LINE + 10), "longer than")],
    ids=["invalid", "over-long"],
)
async def test_bad_input_ends_the_bridge_with_a_message(
    text_bridge: tuple[TextLink, asyncio.subprocess.Process], bad: bytes, said: str
) -> None:
    link, bridge = text_bridge
    assert bridge.stdin is not None and bridge.stderr is not None
    bridge.stdin.write(bad)  # the over-long one has no newline: refused all the same
    await bridge.stdin.drain()
    assert await asyncio.wait_for(bridge.wait(), 10) == 1
    message = (await bridge.stderr.read()).decode()
    assert "bad input" in message and said in message
    assert await asyncio.wait_for(link.reader.read(), 10) == b""  # the link's end


# ---- over a terminal: the bridge typed into a shell (Blaxel's and Cloudflare's sockets) ----


def test_text_before_the_ready_line_is_dropped_and_bounded() -> None:
    async def body() -> None:
        async def send(text: str) -> None:
            sent.append(text)

        async def end_input() -> None:
            pass

        sent: list[str] = []
        link = TextLink(send, end_input, ready="tok1")
        # The echo of the typed line holds the token, never the phrase.
        link.feed_text("$ exec runner connect --text --ready tok1\r\n")
        link.feed_text("sandbox-runner-re")
        writer = cast(asyncio.StreamWriter, link.writer)
        writer.write(b"hi")
        drain = asyncio.ensure_future(writer.drain())
        await asyncio.sleep(0)
        assert sent == [] and not drain.done()  # nothing is typed before the ready line
        link.feed_text("ady tok1\n" + encode_lines(b"after"))
        await asyncio.wait_for(drain, 5)
        assert sent == [encode_lines(b"hi")]
        assert await link.reader.readexactly(5) == b"after"

        flooded = TextLink(send, end_input, ready="tok2")
        flooded.feed_text("x" * (MAX_BEFORE_READY + 1))
        with pytest.raises(RunnerProtocolError, match="no ready line"):
            await flooded.reader.read(1)
        with pytest.raises(ConnectionResetError):
            await flooded.wait_ready()

        gone = TextLink(send, end_input, ready="tok3")
        gone.feed_text("sh: 1: /tmp/r: Permission denied\x1b[0m\r\n")
        gone.feed_eof()
        with pytest.raises(RunnerProtocolError, match="Permission denied"):
            await gone.reader.read(1)

    asyncio.run(body())


@pytest.fixture
async def terminal_bridge() -> AsyncIterator[tuple[TextLink, asyncio.subprocess.Process]]:
    """An interactive `sh` on a real terminal with the bridge typed into it (`exec ...
    connect --text --start --ready TOKEN`), as a provider's terminal socket gives it:
    the terminal's output is read as text, our lines are typed into it."""
    found = runner_binary_module.runner_binary()
    if found is None:
        skip_or_fail(runner_binary_module.unavailable_reason())
    assert found is not None
    folder = tempfile.mkdtemp(prefix="rtt-", dir="/tmp")
    sock = f"{folder}/r.sock"
    master, slave = os.openpty()
    shell = await asyncio.create_subprocess_exec(
        "sh",
        "-i",
        stdin=slave,
        stdout=slave,
        stderr=slave,
        start_new_session=True,
        env={"PATH": "/usr/bin:/bin", "PS1": "$ ", "HOME": folder},
    )
    os.close(slave)
    os.set_blocking(master, False)
    loop = asyncio.get_running_loop()

    async def send(text: str) -> None:
        data = memoryview(text.encode("ascii"))
        while data:
            try:
                data = data[os.write(master, data) :]
            except BlockingIOError:
                writable = loop.create_future()
                loop.add_writer(master, writable.set_result, None)
                try:
                    await writable
                finally:
                    loop.remove_writer(master)

    async def end_input() -> None:
        await send(END_LINE)

    link = TextLink(send, end_input, ready="t0k3n")

    def readable() -> None:
        try:
            chunk = os.read(master, 65536)
        except OSError:
            chunk = b""
        if chunk:
            link.feed_text(chunk.decode("utf-8", "replace"))
        else:
            loop.remove_reader(master)
            link.feed_eof()

    loop.add_reader(master, readable)
    line = shlex.join(
        [str(found.path), "connect", "--text", "--start", "--ready", "t0k3n", "--socket", sock]
    )
    os.write(master, f"exec {line}\n".encode())
    try:
        yield link, shell
    finally:
        loop.remove_reader(master)
        if shell.returncode is None:
            shell.kill()
        await shell.wait()
        os.close(master)
        for pid in procfs.pids_with_arg(sock):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        assert await eventually(lambda: procfs.pids_with_arg(sock) == [])
        shutil.rmtree(folder, ignore_errors=True)


async def test_the_bridge_typed_into_a_shell_carries_every_byte_raw(
    terminal_bridge: tuple[TextLink, asyncio.subprocess.Process],
) -> None:
    """The terminal is raw once the ready line shows: nothing typed is echoed (an echo
    would come back as lines the decoder refuses or as bytes the client cannot frame),
    no byte is translated, and the end line ends the bridge (exit 0) while the runner
    it started stays."""
    link, shell = terminal_bridge
    client = await RunnerClient.open(
        link.reader, cast(asyncio.StreamWriter, link.writer), timeout=10
    )
    try:
        data = bytes(range(256)) * 600
        sink = Collect()
        await client.spawn(1, ["cat"], env={"PATH": "/usr/bin:/bin"}, sink=sink, stdin_open=True)
        await client.write(1, data)
        await client.close_stdin(1)
        assert await asyncio.wait_for(sink.code, 10) == 0
        assert bytes(sink.out) == data
    finally:
        await client.aclose()
    assert await asyncio.wait_for(shell.wait(), 10) == 0
    assert link.error is None
