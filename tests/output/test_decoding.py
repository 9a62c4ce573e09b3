"""Incremental decoding (sandbox.output.decoding): invalid bytes, cut characters, markers."""

from __future__ import annotations

import codecs
import random

import pytest

from sandbox.output.buffer import DrainedOutput
from sandbox.output.decoding import (
    StreamDecoder,
    _incomplete_suffix_len,
    leading_continuation_len,
    omission_marker,
)

SAMPLES = ["a", "é", "漢", "\U0001f600"]  # 1, 2, 3 and 4 bytes


def test_the_marker_names_the_count() -> None:
    assert omission_marker(7) == "\n[... 7 bytes of output omitted ...]\n"


@pytest.mark.parametrize("char", SAMPLES)
def test_a_trailing_partial_character_is_measured(char: str) -> None:
    data = char.encode()
    assert _incomplete_suffix_len(b"x" + data) == 0  # complete
    for cut in range(1, len(data)):
        assert _incomplete_suffix_len(b"x" + data[:cut]) == cut


def test_suffix_length_edges() -> None:
    assert _incomplete_suffix_len(b"") == 0
    assert _incomplete_suffix_len(b"\xc3") == 1  # a lead byte alone, at the very start
    assert _incomplete_suffix_len(b"\xe6\xbc") == 2
    assert _incomplete_suffix_len(b"\xf0\x9f\x98") == 3
    # Continuation bytes without their lead within 4 bytes: nothing to hold back.
    assert _incomplete_suffix_len(b"\x80\x80\x80\x80") == 0
    assert _incomplete_suffix_len(b"a\x80") == 0
    # 0xDF is still a 2-byte lead, 0xE0 a 3-byte one, 0xEF too, 0xF0 a 4-byte one.
    assert _incomplete_suffix_len(b"\xdf") == 1
    assert _incomplete_suffix_len(b"\xe0\xa0") == 2
    assert _incomplete_suffix_len(b"\xef\xbf") == 2
    assert _incomplete_suffix_len(b"\xf0\x9f\x98") == 3
    assert _incomplete_suffix_len(b"\xdf\xbf") == 0
    assert _incomplete_suffix_len(b"\xf4\x8f\xbf\xbf") == 0
    # 0x7F is ASCII: a complete character, even after a 4-byte lead.
    assert _incomplete_suffix_len(b"\xc3\x7f") == 0
    assert _incomplete_suffix_len(b"\xf0\x7f") == 0
    # An ASCII byte ends the look-back: the lead before it is not this sequence's.
    assert _incomplete_suffix_len(b"\xf0a\x80") == 0
    # 0x80 is the lowest continuation byte; 0xEF still leads three bytes, not four.
    assert _incomplete_suffix_len(b"\xe6\x80") == 2
    assert _incomplete_suffix_len(b"\xef\xbf\xbf") == 0
    # 0xC0 is (an invalid) lead byte: held back like one.
    assert _incomplete_suffix_len(b"\xc0") == 1
    assert _incomplete_suffix_len(b"\xbf") == 0


def test_leading_continuation_bytes_are_counted_up_to_three() -> None:
    assert leading_continuation_len(b"") == 0
    assert leading_continuation_len(b"abc") == 0
    assert leading_continuation_len(b"\x80a") == 1
    assert leading_continuation_len(b"\xbf\xbf") == 2
    assert leading_continuation_len(b"\x80\x80\x80") == 3
    assert leading_continuation_len(b"\x80\x80\x80\x80\x80") == 3
    assert leading_continuation_len(b"\x7f\x80") == 0
    assert leading_continuation_len(b"\xc0\x80") == 0


def test_invalid_utf8_becomes_replacement_characters() -> None:
    decoder = StreamDecoder()
    assert decoder.decode(b"a\xffb\xfe") == "a\ufffdb\ufffd"
    assert decoder.decode(b"\xc3(") == "\ufffd("  # a lead byte without its continuation


@pytest.mark.parametrize("char", SAMPLES[1:])
def test_a_character_split_across_reads_is_whole(char: str) -> None:
    data = char.encode()
    for cut in range(1, len(data)):
        decoder = StreamDecoder()
        assert decoder.decode(data[:cut]) == ""
        assert decoder.decode(data[cut:]) == char


def test_final_flushes_a_partial_character() -> None:
    decoder = StreamDecoder()
    assert decoder.decode(b"\xe6\xbc") == ""
    assert decoder.decode(b"", final=True) == "\ufffd"


def test_reset_forgets_the_partial_character() -> None:
    decoder = StreamDecoder()
    decoder.decode(b"\xc3")
    decoder.reset()
    assert decoder.decode(b"a") == "a"


def test_a_snapshot_continues_without_disturbing_the_original() -> None:
    decoder = StreamDecoder()
    decoder.decode(b"\xe6\xbc")
    twin = decoder.snapshot()
    assert twin.decode(b"\xa2") == "漢"
    assert twin.decode(b"\xc3") == ""
    assert decoder.decode(b"\xa2") == "漢"  # the original still holds its two bytes
    assert decoder.decode(b"x") == "x"


def test_drained_without_a_gap_decodes_the_head_and_keeps_the_partial() -> None:
    decoder = StreamDecoder()
    assert decoder.decode_drained(DrainedOutput(b"ab\xc3", 0, b"")) == "ab"
    assert decoder.decode_drained(DrainedOutput(b"\xa9", 0, b"")) == "é"
    assert decoder.decode_drained(DrainedOutput(b"\xc3", 0, b""), final=True) == "\ufffd"


def test_a_gap_cuts_the_head_back_and_the_tail_forward_and_counts_both() -> None:
    # Head ends with 2 of the 3 bytes of 漢; the tail starts with the last 2 of 😀's 4.
    head = b"ab\xe6\xbc"
    tail = b"\x98\x80cd"
    text = StreamDecoder().decode_drained(DrainedOutput(head, 10, tail))
    assert text == "ab" + omission_marker(10 + 2 + 2) + "cd"


def test_a_gap_after_whole_characters_counts_only_the_dropped_bytes() -> None:
    text = StreamDecoder().decode_drained(DrainedOutput(b"ab", 5, b"cd"))
    assert text == "ab" + omission_marker(5) + "cd"


def test_a_gap_flushes_what_was_pending_from_the_last_window() -> None:
    decoder = StreamDecoder()
    assert decoder.decode(b"\xc3") == ""
    # The head completes the pending character; then the gap.
    text = decoder.decode_drained(DrainedOutput(b"\xa9x", 3, b"y\xe6"))
    assert text == "éx" + omission_marker(3) + "y"
    assert decoder.decode(b"\xbc\xa2") == "漢"  # the tail's partial is kept for later


def test_a_gap_leaves_nothing_pending_from_before_it() -> None:
    decoder = StreamDecoder()
    decoder.decode(b"\xe6")  # a lead byte pending, then a window whose head is empty
    text = decoder.decode_drained(DrainedOutput(b"", 4, b"z"))
    assert text == "\ufffd" + omission_marker(4) + "z"


def test_a_gap_with_a_final_window_flushes_the_tail() -> None:
    text = StreamDecoder().decode_drained(DrainedOutput(b"a", 1, b"b\xc3"), final=True)
    assert text == "a" + omission_marker(1) + "b\ufffd"


# Bytes that make every UTF-8 case: ASCII, continuations, 2/3/4-byte leads (valid and
# not: 0xC0, 0xE0 needs A0.., 0xED excludes surrogates, 0xF4 caps at U+10FFFF, 0xF5..FF
# never lead), so random strings of them hit complete, cut and invalid sequences.
_ALPHABET = b"a\x80\x8f\x90\x9f\xa0\xbf\xc0\xc3\xdf\xe0\xe6\xed\xef\xf0\xf4\xf5\xff"


def _reference(pieces: list[bytes], final: bool) -> str:
    reference = codecs.getincrementaldecoder("utf-8")(errors="replace")
    out = [reference.decode(piece) for piece in pieces[:-1]]
    return "".join(out) + reference.decode(pieces[-1], final)


@pytest.mark.parametrize("seed", range(40))
def test_decoding_in_pieces_equals_the_standard_incremental_decoder(seed: int) -> None:
    # The in-place decoder must agree with codecs' own, byte for byte, however the
    # stream is cut: at every length of a held-back character and of the next input.
    rng = random.Random(seed)
    data = bytes(rng.choice(_ALPHABET) for _ in range(rng.randrange(1, 60)))
    cuts = sorted(rng.sample(range(len(data) + 1), min(len(data) + 1, rng.randrange(1, 12))))
    pieces = [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]
    for final in (False, True):
        decoder = StreamDecoder()
        kinds = (bytes, bytearray, memoryview)
        got = [decoder.decode(kinds[i % 3](p)) for i, p in enumerate(pieces[:-1])]
        got.append(decoder.decode(pieces[-1], final=final))
        assert "".join(got) == _reference(pieces, final)
    assert decoder.decode(b"") == ""  # a final decode leaves nothing pending


@pytest.mark.parametrize(
    "first", [b"\xc3", b"\xe6", b"\xe6\xbc", b"\xf0", b"\xf0\x9f", b"\xf0\x9f\x98"]
)
@pytest.mark.parametrize(
    "rest", [b"", b"\x80", b"\xa9abc", b"\x80\x80", b"\x80\x80\x80", b"\x80\x80\x80xyz", b"zz"]
)
def test_a_held_back_character_is_finished_from_the_next_input(first: bytes, rest: bytes) -> None:
    for final in (False, True):
        decoder = StreamDecoder()
        got = decoder.decode(first) + decoder.decode(rest, final=final)
        assert got == _reference([first, rest], final)
        if not final:  # what is still held back comes out on the next input
            assert got + decoder.decode(b"", final=True) == (first + rest).decode(
                "utf-8", "replace"
            )


def test_a_drained_head_is_decoded_without_being_copied() -> None:
    # A bytearray handed over by the buffer is read in place: decoding exports a view,
    # so a resize of the buffer while the text is made would fail; after it, none is held.
    head = bytearray(b"abc\xc3")
    assert StreamDecoder().decode_drained(DrainedOutput(head, 2, bytearray(b"\xa9d"))) == (
        "abc" + omission_marker(2 + 1 + 1) + "d"
    )
    head += b"more"  # no view of it is left behind
    assert bytes(head) == b"abc\xc3more"
