"""ASCII output kept as text (sandbox.output.ascii_text) and the buffer's text path.

The C type is checked on its own (what it keeps, refuses, hands over, and that it leaks
nothing), then `BoundedOutput(text=True)` against the bytes path operation by operation
on random input (tests/output/test_buffer.py pins the bytes path itself), then whole
windows of a real session.
"""

from __future__ import annotations

import asyncio
import os
import random
import subprocess
import sys
import tracemalloc
from pathlib import Path

import pytest

import sandbox
from sandbox import native
from sandbox.output import ascii_text
from sandbox.output.buffer import BoundedOutput
from sandbox.output.decoding import StreamDecoder
from tests.conftest import skip_or_fail
from tests.helpers import SlowCompiler, eventually


@pytest.fixture
def make() -> ascii_text.AsciiTextFactory:
    factory = ascii_text.loaded()
    if factory is None:
        skip_or_fail(f"AsciiText is not built here: {ascii_text.reason()}")
    assert factory is not None
    return factory


def test_it_keeps_ascii_and_refuses_the_rest_whole(make: ascii_text.AsciiTextFactory) -> None:
    text = make(10)
    assert text.append(b"abc") is True
    assert text.append(b"d\xc3\xa9") is False, "a non-ASCII byte refuses the whole chunk"
    assert text.append(bytearray(b"\x80")) is False
    assert text.append(b"12345678") is False, "3 + 8 passes the bound of 10"
    assert len(text) == 3
    assert text.append(memoryview(b"defghij")) is True  # exactly the bound
    assert text.append(b"") is True and len(text) == 10
    assert text.append(b"k") is False
    assert text.bytes_from(0) == b"abcdefghij"
    assert text.bytes_from(7) == b"hij"
    assert text.bytes_from(-5) == b"abcdefghij"
    assert text.bytes_from(10) == b"" and text.bytes_from(99) == b""
    assert text.take() == "abcdefghij"
    assert len(text) == 0 and text.take() == "", "take empties it"


def test_what_it_hands_over_is_an_ordinary_str(make: ascii_text.AsciiTextFactory) -> None:
    text = make(1 << 24)
    rng = random.Random(7)
    expected = []
    for _ in range(3000):  # many growths, each a realloc of the private str
        chunk = bytes(rng.randrange(0, 128) for _ in range(rng.randrange(0, 600)))
        assert text.append(chunk)
        expected.append(chunk)
    out = text.take()
    want = b"".join(expected).decode("ascii")
    assert type(out) is str and out == want and len(out) == len(want)
    assert hash(out) == hash(want) and out.isascii()
    assert sys.getrefcount(out) == 2, "nothing else holds it"
    assert (out + "!")[-2:] == want[-1:] + "!"
    assert {out: 1}[want] == 1


def test_take_bytearray_hands_over_bytes_and_starts_again(
    make: ascii_text.AsciiTextFactory,
) -> None:
    text = make(100)
    assert text.take_bytearray() == bytearray()
    text.append(b"hello")
    got = text.take_bytearray()
    assert type(got) is bytearray and got == b"hello"
    assert len(text) == 0
    assert text.append(b"again") and text.take() == "again"


def test_bad_arguments_are_refused(make: ascii_text.AsciiTextFactory) -> None:
    with pytest.raises(ValueError, match="negative"):
        make(-1)
    with pytest.raises(TypeError):
        make(10).append("not bytes")  # type: ignore[arg-type]
    zero = make(0)
    assert zero.append(b"") is True and zero.append(b"a") is False
    assert zero.take() == ""


def test_nothing_it_held_is_leaked(make: ascii_text.AsciiTextFactory) -> None:
    chunk = b"0123456789abcdef" * 4096  # 64 KiB
    tracemalloc.start()
    try:
        before, _ = tracemalloc.get_traced_memory()
        for round_ in range(40):
            text = make(1 << 22)
            for _ in range(16):
                text.append(chunk)
            # Each way out: handed over as text, as bytes, or dropped while holding 1 MiB.
            if round_ % 3 == 0:
                assert len(text.take()) == 16 * len(chunk)
            elif round_ % 3 == 1:
                assert len(text.take_bytearray()) == 16 * len(chunk)
            del text
        after, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert after - before < 256 * 1024, f"{after - before} bytes still held"


# ---- the buffer: text path against bytes path ------------------------------------------


def _chunk(rng: random.Random) -> bytes:
    kind = rng.random()
    size = rng.choice([0, 1, 2, 3, 5, 17, 64, 300, 2000])
    if kind < 0.6:
        return bytes(rng.randrange(32, 127) for _ in range(size))
    if kind < 0.8:  # UTF-8 cut anywhere, so characters split across chunks
        return "é€😀 a".encode()[rng.randrange(0, 4) :][: size or 1]
    return bytes(rng.randrange(0, 256) for _ in range(size))


@pytest.mark.parametrize("seed", range(40))
def test_the_text_path_behaves_as_the_bytes_path(
    make: ascii_text.AsciiTextFactory, seed: int
) -> None:
    rng = random.Random(seed)
    limit = rng.choice([0, 1, 4, 10, 64, 1000, 5000])
    text, plain = BoundedOutput(limit, text=True), BoundedOutput(limit, text=False)
    text_decoder, plain_decoder = StreamDecoder(), StreamDecoder()
    text_windows = 0
    for _ in range(300):
        action = rng.random()
        if action < 0.7:
            chunk = _chunk(rng)
            text.append(chunk)
            plain.append(chunk)
        elif action < 0.85:
            pos = rng.randrange(0, plain.end_pos + 3)
            assert text.since(pos) == [bytes(s) for s in plain.since(pos)]
        else:
            final = rng.random() < 0.2
            drained_text, drained_plain = text.drain(), plain.drain()
            assert drained_text.size == drained_plain.size
            text_windows += isinstance(drained_text.head, str)
            got = text_decoder.decode_drained(drained_text, final=final)
            want = plain_decoder.decode_drained(drained_plain, final=final)
            assert got == want
            assert text_decoder.pending == plain_decoder.pending
        assert (text.start_pos, text.end_pos, len(text)) == (
            plain.start_pos,
            plain.end_pos,
            len(plain),
        )
        assert (text.retained, text.omitted) == (plain.retained, plain.omitted)
    if limit >= 64:
        assert text_windows, "some windows went the text way"


def test_an_ascii_window_is_handed_over_without_a_copy(make: ascii_text.AsciiTextFactory) -> None:
    buffer = BoundedOutput(1 << 20)
    for _ in range(100):
        buffer.append(b"x" * 1000)
    drained = buffer.drain()
    assert isinstance(drained.head, str) and len(drained.head) == 100_000
    assert StreamDecoder().decode_drained(drained) is drained.head


def test_a_window_after_a_non_ascii_one_is_text_again(make: ascii_text.AsciiTextFactory) -> None:
    buffer = BoundedOutput(100)
    buffer.append(b"ab")
    buffer.append("é".encode())
    first = buffer.drain()
    assert isinstance(first.head, bytearray) and first.head == "abé".encode()
    buffer.append(b"cd")
    assert buffer.drain().head == "cd"


def test_a_character_cut_at_a_window_end_then_ascii(make: ascii_text.AsciiTextFactory) -> None:
    buffer, decoder = BoundedOutput(100), StreamDecoder()
    buffer.append("x€".encode()[:2])  # "x" and the first byte of "€"
    assert decoder.decode_drained(buffer.drain()) == "x"
    buffer.append(b"yz")  # ASCII cannot finish the character: it was cut
    assert decoder.decode_drained(buffer.drain()) == "\ufffdyz"


# ---- building and switching off ------------------------------------------------------


def _prepare_in_a_child(env: dict[str, str]) -> str:
    code = (
        "from sandbox.output import ascii_text as a\n"
        "print('loaded' if a.prepare() else 'not loaded:', a.reason())\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    return done.stdout.strip()


def test_it_is_built_once_into_a_private_cache(make: object, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    assert _prepare_in_a_child({native.CACHE_VARIABLE: str(cache)}) == "loaded"
    built = [p.name for p in cache.iterdir()]
    assert len(built) == 1 and built[0].startswith("ascii-text-"), "no build leftovers"
    assert not (cache / built[0]).stat().st_mode & 0o022
    stamp = (cache / built[0]).stat().st_mtime_ns
    assert _prepare_in_a_child({native.CACHE_VARIABLE: str(cache), "CC": "/no/such-cc"}) == (
        "loaded"
    ), "the cached build is loaded without a compiler"
    assert (cache / built[0]).stat().st_mtime_ns == stamp


def test_without_a_compiler_or_switched_off_windows_decode_bytes(tmp_path: Path) -> None:
    cache = str(tmp_path / "cache")
    out = _prepare_in_a_child({native.CACHE_VARIABLE: cache, "CC": str(tmp_path / "no-cc")})
    assert out.startswith("not loaded:") and "no-cc" in out
    out = _prepare_in_a_child({native.CACHE_VARIABLE: cache, ascii_text.DISABLE_VARIABLE: "0"})
    assert out == f"not loaded: {ascii_text.DISABLE_VARIABLE}=0"


# ---- whole windows -----------------------------------------------------------------


async def test_a_big_ascii_window_comes_back_whole(
    make: ascii_text.AsciiTextFactory, tmp_path: Path
) -> None:
    size = 6_000_000
    payload = tmp_path / "payload"
    payload.write_bytes(bytes(range(32, 127)) * (size // 95) + b"end\n")
    want = payload.read_text()
    async with sandbox.open_session(
        "unix_local", workspace=tmp_path / "ws", output_limit_bytes=size + 1024
    ) as s:
        for tty in (False, True):
            update = await s.pty_exec_start(f"cat {payload}", tty=tty, yield_time_s=10)
            parts = [update.output]
            while update.process_id is not None:
                update = await s.pty_write_stdin(update.process_id, "", yield_time_s=5)
                parts.append(update.output)
            got = "".join(parts)
            assert got == (want.replace("\n", "\r\n") if tty else want)
            assert update.exit_code == 0


async def test_ascii_then_utf8_and_until_in_one_window(
    make: ascii_text.AsciiTextFactory, tmp_path: Path
) -> None:
    async with sandbox.open_session("unix_local", workspace=tmp_path / "ws") as s:
        script = (
            "printf 'plain '; printf 'caf\\303'; printf '\\251 done\\n'; printf 'MARK'; sleep 5"
        )
        update = await s.pty_exec_start(script, until="MARK", yield_time_s=10)
        assert update.output == "plain café done\nMARK"
        assert update.process_id is not None
        await s.pty_terminate_all()


async def test_a_start_cancelled_while_it_builds_leaves_nothing(
    make: object, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    compiler = SlowCompiler.make(tmp_path)
    monkeypatch.setenv("CC", str(compiler.path))
    monkeypatch.setenv(native.CACHE_VARIABLE, str(tmp_path / "cache"))
    part = ascii_text._PART
    saved = (part.tried, part.value, part.why)
    part.tried, part.value, part.why = False, None, "not built yet"
    try:
        workspace = tmp_path / "ws"
        session = sandbox.open_session("unix_local", workspace=workspace)
        task = asyncio.create_task(session.start())
        # The gate: the build is under way and the start waits on it.
        assert await eventually(compiler.started.exists, timeout=30)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert session.state is sandbox.SessionState.NEW
        assert not workspace.exists(), "the start made nothing before the build"
        compiler.release()
        assert await eventually(
            lambda: not part.lock.locked() and part.why != "not built yet", timeout=30
        )
        assert ascii_text.loaded() is None and "failed" in ascii_text.reason()
        # The session starts again, and its windows decode bytes.
        async with session:
            update = await session.pty_exec_start("echo plain", yield_time_s=5)
            assert update.output == "plain\n" and update.exit_code == 0
            assert session._processes.reserved == set()
    finally:
        with part.lock:
            part.tried, part.value, part.why = saved
