"""Bounded output, incremental UTF-8 decoding, token truncation and `until` matching."""

from __future__ import annotations

import re

import pytest

from sandbox.output.buffer import BoundedOutput
from sandbox.output.decoding import StreamDecoder, omission_marker
from sandbox.output.truncation import truncate_to_tokens
from sandbox.output.until import UntilMatcher, check_until


def test_buffer_keeps_everything_under_the_limit() -> None:
    buf = BoundedOutput(16)
    buf.append(b"hello ")
    buf.append(b"world")
    assert buf.since(0) == [b"hello world"]
    drained = buf.drain()
    assert (drained.head, drained.omitted, drained.tail) == (b"hello world", 0, b"")
    assert buf.start_pos == 11 and len(buf) == 0


def test_buffer_keeps_head_and_rolling_tail() -> None:
    buf = BoundedOutput(10)
    data = bytes(range(100))
    for i in range(0, 100, 7):
        buf.append(data[i : i + 7])
    assert buf.retained == 10
    drained = buf.drain()
    assert drained.head == data[:5]
    assert drained.tail == data[-5:]
    assert drained.omitted == 90
    assert drained.size == 100


def test_buffer_one_huge_chunk() -> None:
    buf = BoundedOutput(10)
    buf.append(b"a" * 3 + b"x" * 1000 + b"b" * 5)
    drained = buf.drain()
    assert drained.head == b"aaaxx" and drained.tail == b"bbbbb"
    assert drained.omitted == 1008 - 10


def test_buffer_since_reports_gaps_as_segments() -> None:
    buf = BoundedOutput(10)
    buf.append(b"01234")
    buf.append(b"56789")
    assert buf.since(3) == [b"3456789"]
    buf.append(b"abcdefgh")
    assert buf.since(0) == [b"01234", b"defgh"]
    assert buf.since(buf.end_pos - 2) == [b"gh"]


def test_buffer_memory_is_bounded_for_a_flood() -> None:
    buf = BoundedOutput(1024 * 1024)
    chunk = b"y\n" * 32768
    for _ in range(2000):  # 128 MiB
        buf.append(chunk)
    assert buf.retained == 1024 * 1024
    assert buf.omitted == 2000 * len(chunk) - 1024 * 1024


def test_decoder_keeps_split_character_for_next_window() -> None:
    decoder = StreamDecoder()
    buf = BoundedOutput(64)
    encoded = "€uro".encode()
    buf.append(encoded[:1])
    assert decoder.decode_drained(buf.drain()) == ""
    buf.append(encoded[1:])
    assert decoder.decode_drained(buf.drain()) == "€uro"


@pytest.mark.parametrize("offset", range(8))
def test_omission_never_produces_replacement_characters(offset: int) -> None:
    text = ("é€😀" * 100)[offset:]
    data = text.encode()
    buf = BoundedOutput(40)
    buf.append(data)
    out = StreamDecoder().decode_drained(buf.drain())
    assert "\ufffd" not in out
    head, _, rest = out.partition("\n[... ")
    count, _, tail = rest.partition(" bytes of output omitted ...]\n")
    assert text.startswith(head) and text.endswith(tail)
    assert len(head.encode()) + int(count) + len(tail.encode()) == len(data)
    assert out == head + omission_marker(int(count)) + tail


def test_truncation_keeps_head_and_tail_on_boundaries() -> None:
    text = "".join(f"line {i} é\n" for i in range(1000))
    result = truncate_to_tokens(text, 50)
    assert result.original_token_count == (len(text.encode()) + 3) // 4
    assert result.text.startswith("Total output lines: 1001\n\nline 0 é\n")
    assert result.text.endswith("line 999 é\n")
    assert "tokens truncated…" in result.text
    assert len(result.text.encode()) <= 50 * 4 + 30
    assert "\ufffd" not in result.text


def test_truncation_leaves_short_text_alone() -> None:
    assert truncate_to_tokens("short", 10).original_token_count is None
    assert truncate_to_tokens("x" * 40, 10).text == "x" * 40
    assert truncate_to_tokens("x" * 41, 10).original_token_count == 11
    assert truncate_to_tokens("anything", None).text == "anything"


def test_until_substring_across_chunks() -> None:
    matcher = UntilMatcher(">>> ", StreamDecoder())
    assert not matcher.feed([b"Python\r\n>"])
    assert not matcher.feed([b">"])
    assert matcher.feed([b"> "])


def test_until_regex_and_split_multibyte() -> None:
    matcher = UntilMatcher(re.compile(r"done: \d+ é"), StreamDecoder())
    payload = "work... done: 42 é".encode()
    assert not matcher.feed([payload[:-1]])
    assert matcher.feed([payload[-1:]])


def test_until_does_not_match_across_a_gap() -> None:
    matcher = UntilMatcher("ab", StreamDecoder())
    assert not matcher.feed([b"xxa", b"bxx"])
    assert matcher.feed([b"ab"])


@pytest.mark.parametrize("bad", ["", b"bytes", 5, re.compile(b"x")])
def test_until_rejects_bad_patterns(bad: object) -> None:
    from sandbox import InvalidArgumentError

    with pytest.raises(InvalidArgumentError):
        check_until(bad)
