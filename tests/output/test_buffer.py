"""The bounded buffer (sandbox.output.buffer): limits, positions, segments and drains."""

from __future__ import annotations

import random

import pytest

from sandbox.output.buffer import DEFAULT_OUTPUT_LIMIT, BoundedOutput, DrainedOutput


def filled(limit: int, *chunks: bytes) -> BoundedOutput:
    buffer = BoundedOutput(limit)
    for chunk in chunks:
        buffer.append(chunk)
    return buffer


def test_the_default_limit_is_one_mebibyte() -> None:
    assert DEFAULT_OUTPUT_LIMIT == 1024 * 1024
    buffer = BoundedOutput()
    buffer.append(b"x" * (DEFAULT_OUTPUT_LIMIT + 1))
    assert buffer.retained == DEFAULT_OUTPUT_LIMIT
    assert buffer.omitted == 1


def test_a_negative_limit_is_refused_and_zero_keeps_nothing() -> None:
    with pytest.raises(ValueError, match="negative"):
        BoundedOutput(-1)
    buffer = filled(0, b"abc", b"de")
    assert buffer.retained == 0
    assert buffer.omitted == 5
    assert len(buffer) == 5
    assert buffer.since(0) == []
    assert buffer.drain() == DrainedOutput(b"", 5, b"")


def test_exactly_the_limit_is_kept_whole() -> None:
    buffer = filled(10, b"0123456789")
    assert buffer.omitted == 0
    assert buffer.retained == 10
    assert buffer.drain() == DrainedOutput(b"0123456789", 0, b"")


def test_one_byte_over_drops_the_first_tail_byte() -> None:
    buffer = filled(10, b"0123456789", b"A")
    assert buffer.omitted == 1
    assert buffer.drain() == DrainedOutput(b"01234", 1, b"6789A")


def test_an_odd_limit_gives_the_extra_byte_to_the_tail() -> None:
    buffer = filled(5, b"abcdefgh")
    assert buffer.drain() == DrainedOutput(b"ab", 3, b"fgh")


def test_a_chunk_exactly_the_tail_size_replaces_the_tail() -> None:
    buffer = filled(10, b"01234", b"abcde", b"VWXYZ")
    assert buffer.drain() == DrainedOutput(b"01234", 5, b"VWXYZ")


def test_a_chunk_one_short_of_the_tail_rolls_it() -> None:
    buffer = filled(10, b"01234", b"abcde", b"WXYZ")
    assert buffer.drain() == DrainedOutput(b"01234", 4, b"eWXYZ")


def test_small_appends_fill_the_head_then_roll_the_tail() -> None:
    buffer = BoundedOutput(6)
    for byte in b"abcdefghij":
        buffer.append(bytes([byte]))
    assert buffer.retained == 6
    assert buffer.omitted == 4
    assert buffer.drain() == DrainedOutput(b"abc", 4, b"hij")


def test_the_head_never_grows_once_bytes_went_to_the_tail() -> None:
    buffer = filled(10, b"0123", b"456789", b"A")  # head 5: "01234", then "56789A"...
    drained = buffer.drain()
    assert drained.head == b"01234"
    assert drained.tail == b"6789A"
    buffer = filled(10, b"01234", b"5")  # the head is full: "5" is tail
    buffer.append(b"")
    assert buffer.drain() == DrainedOutput(b"012345", 0, b"")


def test_empty_appends_change_nothing() -> None:
    buffer = BoundedOutput(4)
    buffer.append(b"")
    buffer.append(bytearray())
    buffer.append(memoryview(b""))
    assert len(buffer) == 0
    assert buffer.end_pos == 0
    assert buffer.since(0) == []


def test_bytearray_and_memoryview_are_appended() -> None:
    buffer = filled(100, bytearray(b"ab"), memoryview(b"cd"))  # type: ignore[arg-type]
    assert bytes(buffer.drain().head) == b"abcd"


def test_positions_are_absolute_across_drains() -> None:
    buffer = filled(4, b"abcdef")
    assert (buffer.start_pos, buffer.end_pos, len(buffer)) == (0, 6, 6)
    buffer.drain()
    assert (buffer.start_pos, buffer.end_pos, len(buffer)) == (6, 6, 0)
    buffer.append(b"gh")
    assert (buffer.start_pos, buffer.end_pos, len(buffer)) == (6, 8, 2)


def test_drain_resets_the_omitted_count_and_the_head() -> None:
    buffer = filled(4, b"abcdefgh")
    assert buffer.omitted == 4
    assert buffer.drain() == DrainedOutput(b"ab", 4, b"gh")
    assert buffer.omitted == 0
    assert buffer.retained == 0
    buffer.append(b"XYZ")  # a fresh head again
    assert buffer.drain() == DrainedOutput(b"XYZ", 0, b"")
    assert buffer.drain() == DrainedOutput(b"", 0, b"")


def test_drained_size_counts_kept_and_omitted() -> None:
    assert DrainedOutput(b"ab", 3, b"cde").size == 8
    assert filled(4, b"abcdefgh").drain().size == 8


def test_since_without_a_gap_is_one_segment() -> None:
    buffer = filled(10, b"0123", b"456")  # head full at 5, "56" in the tail
    assert buffer.since(0) == [b"0123456"]
    assert buffer.since(3) == [b"3456"]
    assert buffer.since(5) == [b"56"]
    assert buffer.since(6) == [b"6"]
    assert buffer.since(7) == []
    assert buffer.since(-5) == [b"0123456"]  # before the start: everything


def test_since_with_a_gap_gives_head_and_tail_apart() -> None:
    buffer = filled(6, b"abcdefghij")  # head "abc", omitted 4, tail "hij"
    assert buffer.since(0) == [b"abc", b"hij"]
    assert buffer.since(1) == [b"bc", b"hij"]
    assert buffer.since(2) == [b"c", b"hij"]
    # The head is behind and bytes from there on were dropped: an empty first segment
    # says the tail does not go on from `pos`.
    assert buffer.since(3) == [b"", b"hij"]
    assert buffer.since(5) == [b"", b"hij"]  # inside the gap: the same
    assert buffer.since(6) == [b"", b"hij"]
    assert buffer.since(7) == [b"hij"]  # the tail's first byte: nothing dropped after it
    assert buffer.since(8) == [b"ij"]
    assert buffer.since(9) == [b"j"]
    assert buffer.since(10) == []
    assert buffer.since(11) == []


def test_since_counts_from_the_start_after_a_drain() -> None:
    buffer = filled(6, b"abc")
    buffer.drain()
    buffer.append(b"defghijk")  # head "def", omitted 2, tail "ijk"
    assert buffer.since(3) == [b"def", b"ijk"]
    assert buffer.since(4) == [b"ef", b"ijk"]
    assert buffer.since(9) == [b"jk"]
    assert buffer.since(10) == [b"k"]
    # A position before the buffer's start (bytes drained already) gives all it holds.
    assert buffer.since(0) == [b"def", b"ijk"]


def test_since_with_only_a_tail() -> None:
    buffer = filled(1, b"abc")  # head 0 bytes, tail 1
    assert buffer.since(0) == [b"", b"c"]  # "ab" was dropped: a gap before "c"
    assert buffer.since(1) == [b"", b"c"]
    assert buffer.since(2) == [b"c"]
    assert buffer.since(3) == []


def test_a_flood_keeps_memory_bounded() -> None:
    buffer = BoundedOutput(1000)
    for _ in range(1000):
        buffer.append(b"y" * 997)
    assert buffer.retained == 1000
    assert buffer.omitted == 997 * 1000 - 1000
    assert len(buffer) == 997 * 1000


def test_since_marks_a_gap_when_the_tail_rolled_past_the_position() -> None:
    # A reader that scanned up to the end, then more arrived than the tail keeps: the
    # bytes it had not seen yet were partly dropped, and `since` says so.
    buffer = BoundedOutput(6)  # 3 of head, 3 of tail
    buffer.append(b"abcdef")
    scanned = buffer.end_pos
    assert buffer.since(scanned) == []
    buffer.append(b"ghij")  # "defg" leaves the tail: "g" was never seen
    assert buffer.since(scanned) == [b"", b"hij"]
    buffer.append(b"k")
    assert buffer.since(buffer.end_pos - 1) == [b"k"]  # still in the tail: no gap


def test_since_of_a_buffer_that_keeps_nothing_is_empty() -> None:
    buffer = BoundedOutput(0)
    buffer.append(b"xyz")
    assert buffer.omitted == 3
    assert buffer.since(0) == []
    assert buffer.since(2) == []


def _model(limit: int, chunks: list[bytes]) -> DrainedOutput:
    """What the bound keeps, from the whole stream at once: the first `limit // 2`
    bytes and the last `limit - limit // 2`, or everything when it fits."""
    data = b"".join(chunks)
    if len(data) <= limit:
        return DrainedOutput(data, 0, b"")
    head, tail = limit // 2, limit - limit // 2
    return DrainedOutput(data[:head], len(data) - limit, data[len(data) - tail :])


@pytest.mark.parametrize("seed", range(60))
def test_any_sequence_of_appends_keeps_what_the_bound_says(seed: int) -> None:
    # Chunks of every size around the bound and its halves, so the one-piece head
    # splits at every point: before, at and after `limit // 2`, by small and huge chunks.
    rng = random.Random(seed)
    limit = rng.randrange(0, 24)
    chunks = [
        bytes(rng.randrange(256) for _ in range(rng.choice((0, 1, 2, limit // 2, limit, 30))))
        for _ in range(rng.randrange(1, 8))
    ]
    buffer = BoundedOutput(limit)
    for index, chunk in enumerate(chunks):
        buffer.append((bytes, bytearray, memoryview)[index % 3](chunk))
    want = _model(limit, chunks)
    assert buffer.retained == len(want.head) + len(want.tail)
    assert buffer.omitted == want.omitted
    segments = buffer.since(0)
    if want.omitted:
        # Head and tail apart; an empty head still stands for the bytes before the gap.
        kept = [want.head] if want.head or want.tail else []
        assert segments == kept + ([want.tail] if want.tail else [])
    else:
        assert b"".join(segments) == want.head
    drained = buffer.drain()
    assert (bytes(drained.head), drained.omitted, bytes(drained.tail)) == (
        want.head,
        want.omitted,
        want.tail,
    )


def test_under_the_bound_the_head_is_one_piece_past_its_half() -> None:
    # No split at `limit // 2` until something must be dropped: the drain hands over
    # one buffer (no join) and `since` gives one segment.
    buffer = filled(10, b"0123", b"4567", b"89")
    assert buffer.since(3) == [b"3456789"]
    drained = buffer.drain()
    assert drained == DrainedOutput(b"0123456789", 0, b"")
    assert isinstance(drained.head, bytearray) and drained.tail == b""


def test_a_one_piece_head_splits_when_the_bound_is_passed() -> None:
    # The head is 8 bytes (past its half of 5) when a 3-byte chunk overflows: its bytes
    # past 5 become the start of the tail, which then rolls.
    buffer = filled(10, b"01234567", b"abc")
    assert buffer.since(0) == [b"01234", b"67abc"]
    assert buffer.drain() == DrainedOutput(b"01234", 1, b"67abc")
    # A chunk as big as the tail drops the spilled bytes and takes the tail alone.
    buffer = filled(10, b"01234567", b"VWXYZ")
    assert buffer.drain() == DrainedOutput(b"01234", 3, b"VWXYZ")
    # A head still short of its half takes its share of the overflowing chunk first.
    buffer = filled(10, b"012", b"abcdefghij")
    assert buffer.drain() == DrainedOutput(b"012ab", 3, b"fghij")
