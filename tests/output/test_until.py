"""`until` matching (sandbox.output.until): the edges of every rule, and the gap bug."""

from __future__ import annotations

import asyncio
import random
import re

import pytest

from sandbox.errors import InvalidArgumentError
from sandbox.output import until as until_module
from sandbox.output.decoding import StreamDecoder
from sandbox.output.until import (
    REGEX_LOOKBEHIND,
    REGEX_PIECE,
    UntilMatcher,
    byte_needle,
    check_until,
)


def matcher(pattern: str | re.Pattern[str]) -> UntilMatcher:
    return UntilMatcher(pattern, StreamDecoder())


class CountingPattern:
    """A compiled pattern that records the string and start of every search."""

    def __init__(self, pattern: str) -> None:
        self._inner = re.compile(pattern)
        self.pattern = pattern
        self.searches: list[tuple[str, int]] = []

    def search(self, text: str, pos: int = 0) -> re.Match[str] | None:
        self.searches.append((text, pos))
        return self._inner.search(text, pos)


def counting(pattern: str) -> tuple[UntilMatcher, CountingPattern]:
    recorder = CountingPattern(pattern)
    # The matcher tells a regex from a substring by type; this one quacks like re.Pattern.
    m = UntilMatcher.__new__(UntilMatcher)
    UntilMatcher.__init__(m, re.compile("x"), StreamDecoder())
    m._pattern = recorder  # type: ignore[assignment]
    return m, recorder


# --- check_until ---------------------------------------------------------------------


def test_check_until_passes_none_strings_and_patterns_through() -> None:
    assert check_until(None) is None
    assert check_until("$ ") == "$ "
    pattern = re.compile(r"\$ $")
    assert check_until(pattern) is pattern


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ("", "non-empty"),
        (re.compile(b"x"), "not a bytes pattern"),
        (b"x", "not bytes"),
        (3, "not int"),
    ],
)
def test_check_until_names_what_is_wrong(bad: object, message: str) -> None:
    with pytest.raises(InvalidArgumentError, match=message):
        check_until(bad)


# --- the bug: a gap of dropped bytes cuts a character ----------------------------------


def test_a_character_cut_by_a_gap_is_never_matched() -> None:
    # "é" is C3 A9: its lead byte is before the gap, its continuation after it. The
    # window shows neither half, so the pattern must not match either.
    m = matcher("é")
    assert not m.feed([b"ab\xc3", b"\xa9cd"])
    assert m.feed(["é".encode()])


def test_a_character_split_right_after_a_gap_is_matched_when_it_completes() -> None:
    m = matcher("gapé")
    assert not m.feed([b"x", b"gap\xc3"])  # the gap, then a split character
    assert m.feed([b"\xa9"])  # the next arrival completes it


def test_stray_continuation_bytes_after_a_gap_are_not_text() -> None:
    # Replacement characters would be text the window never shows.
    m = matcher("\ufffd")
    assert not m.feed([b"a", b"\xa9\xa9b"])
    assert m.feed([b"\xff"])  # a real invalid byte is shown as U+FFFD


def test_a_character_split_between_arrivals_is_joined() -> None:
    m = matcher("é!")
    assert not m.feed([b"\xc3"])
    assert m.feed([b"\xa9!"])


# --- substrings ----------------------------------------------------------------------


def test_substring_keeps_exactly_the_overlap_it_needs() -> None:
    m = matcher("abc")
    assert not m.feed([b"xxab"])
    assert m.feed([b"c"])  # the two characters before the new text were kept
    m = matcher("abcd")
    assert not m.feed([b"a"])
    assert not m.feed([b"b"])
    assert not m.feed([b"c"])
    assert m.feed([b"d"])  # the overlap carries over several arrivals


def test_substring_of_one_character_needs_no_overlap() -> None:
    m = matcher("z")
    assert not m.feed([b"yyy"])
    assert m.feed([b"z"])


def test_substring_is_not_joined_across_a_gap_even_within_one_feed() -> None:
    m = matcher("abc")
    assert not m.feed([b"ab", b"c"])
    assert not m.feed([b"xab", b"cx", b"bc"])
    assert m.feed([b"a", b"abc"])  # whole after the gap


def test_a_match_is_sticky() -> None:
    m = matcher("ok")
    assert not m.matched
    assert m.feed([b"ok"])
    assert m.matched
    assert m.feed([b""])
    assert m.feed([])


async def test_feed_async_is_sticky_after_a_match() -> None:
    loop = asyncio.get_running_loop()
    m = matcher("ok")
    assert await m.feed_async([b"ok"], loop.time() + 60)
    assert await m.feed_async([b"zz"], loop.time() - 1)  # even past a deadline


def test_nothing_fed_matches_nothing() -> None:
    assert not matcher("a").feed([])
    assert not matcher(re.compile("a*")).feed([])


# --- regular expressions --------------------------------------------------------------


def test_regex_look_behind_is_exactly_the_cap() -> None:
    span = re.compile(r"S[^E]*E")
    m = matcher(span)
    assert not m.feed([b"S" + b"x" * (REGEX_LOOKBEHIND - 1)])
    assert m.feed([b"E"])  # S is the first of the kept characters
    m = matcher(span)
    assert not m.feed([b"S" + b"x" * REGEX_LOOKBEHIND])
    assert not m.feed([b"E"])  # S is now the character before the kept text


def test_regex_sees_the_character_before_the_kept_text() -> None:
    # `\b` and a look-behind see the character before the cap, so a cut is not a start.
    word = re.compile(r"\bx")
    m = matcher(word)
    assert not m.feed([b"y" * (REGEX_LOOKBEHIND + 10)])
    assert not m.feed([b"x"])  # "yx" is not a word start
    m = matcher(word)
    assert not m.feed([b"y" * (REGEX_LOOKBEHIND + 10) + b" "])
    assert m.feed([b"x"])
    behind = re.compile(r"(?<=q)x")
    m = matcher(behind)
    assert not m.feed([b"y" * (REGEX_LOOKBEHIND + 10) + b"q"])
    assert m.feed([b"x"])


def test_regex_line_start_after_a_newline_in_the_kept_text() -> None:
    line_start = re.compile(r"^x", re.M)
    m = matcher(line_start)
    assert not m.feed([b"y" * (2 * REGEX_LOOKBEHIND) + b"\n" + b"y" * 10])
    assert not m.feed([b"x"])
    m = matcher(line_start)
    assert not m.feed([b"y" * (2 * REGEX_LOOKBEHIND) + b"\n"])
    assert m.feed([b"x"])
    assert matcher(line_start).feed([b"x"])  # the window's start is a line start


def test_regex_search_starts_after_the_kept_character() -> None:
    m, recorder = counting(r"zz")
    assert not m.feed([b"a" * (REGEX_LOOKBEHIND + 5)])
    assert not m.feed([b"b"])
    text, pos = recorder.searches[-1]
    assert pos == 1
    assert len(text) == REGEX_LOOKBEHIND + 2  # the character before, the cap, the new one
    assert text.endswith("a" * (REGEX_LOOKBEHIND - 1) + "b")


def test_regex_short_text_is_kept_whole_from_the_window_start() -> None:
    m, recorder = counting(r"zz")
    assert not m.feed([b"a" * REGEX_LOOKBEHIND])
    assert not m.feed([b"b"])
    assert recorder.searches[-1] == ("a" * REGEX_LOOKBEHIND + "b", 0)


def test_regex_text_arriving_at_once_is_searched_in_pieces() -> None:
    end = re.compile(r"x$")
    # `$` matches at the end of a piece: the x closes the first piece here...
    assert matcher(end).feed([b"a" * (REGEX_PIECE - 1) + b"xy"])
    # ...and opens the second one here.
    assert not matcher(end).feed([b"a" * REGEX_PIECE + b"xy"])
    m, recorder = counting(r"zz")
    assert not m.feed([b"a" * (2 * REGEX_PIECE + 1)])
    assert [len(text) for text, _ in recorder.searches] == [
        REGEX_PIECE,
        2 * REGEX_PIECE,
        REGEX_LOOKBEHIND + 2,
    ]


def test_regex_gap_restarts_the_window() -> None:
    m, recorder = counting(r"zz")
    assert not m.feed([b"ab", b"cd"])
    # After the gap the search starts after the stand-in for the unseen character.
    assert recorder.searches == [("ab", 0), ("\ufffdcd", 1)]
    assert not matcher(re.compile("bc")).feed([b"ab", b"cd"])


# --- budgets and deadlines ------------------------------------------------------------


def test_an_exhausted_budget_keeps_the_text_as_context() -> None:
    m = matcher("abc")
    assert not m.feed([b"xab"], budget_s=-1)
    assert m.feed([b"c"])
    m = matcher(re.compile("abc"))
    assert not m.feed([b"x" * (REGEX_LOOKBEHIND + 3) + b"ab"], budget_s=-1)
    assert m.feed([b"c"])


def test_an_exhausted_budget_still_restarts_at_a_gap() -> None:
    m = matcher("abc")
    assert not m.feed([b"a", b"b"], budget_s=-1)
    assert not m.feed([b"c"])  # "a" was before the gap
    m = matcher(re.compile("abc"))
    assert not m.feed([b"a", b"b"], budget_s=-1)
    assert not m.feed([b"c"])


def test_a_budget_left_searches_everything() -> None:
    m = matcher("ready")
    assert m.feed([b"server ready"], budget_s=60)


async def test_feed_async_past_its_deadline_keeps_context_and_gaps() -> None:
    loop = asyncio.get_running_loop()
    m = matcher("abc")
    assert await m.feed_async([b"xab"], loop.time() - 1) is False  # a bool, not falsy
    assert await m.feed_async([b"c"], loop.time() + 60)
    m = matcher("abc")
    assert not await m.feed_async([b"a", b"b"], loop.time() - 1)
    assert not await m.feed_async([b"c"], loop.time() + 60)


def test_the_documented_bounds() -> None:
    assert (REGEX_LOOKBEHIND, REGEX_PIECE) == (4096, 4096)


def test_text_skipped_for_the_budget_is_context_not_searched() -> None:
    # Out of budget, "abc" is only kept as look-behind ("bc"), never searched whole.
    m = matcher("abc")
    assert not m.feed([b"abc"], budget_s=-1)
    assert not m.feed([b"x"])


def test_a_substring_matcher_keeps_only_its_overlap() -> None:
    m = matcher("abc")
    assert not m.feed([b"x" * 10_000])
    assert m._bytes == b"xx"  # memory stays bounded by the pattern, not the output
    assert m._window == ""  # and nothing was decoded for it
    m = matcher("a\ufffdc")  # searched in the text: its overlap is characters
    assert not m.feed([b"x" * 10_000])
    assert m._window == "xx"


# --- line and window starts after a gap ------------------------------------------------


@pytest.mark.parametrize("pattern", [r"^x", r"\Ax", r"(?m)^x", r"(?<![^\n])x"])
def test_a_gap_is_neither_a_line_nor_a_window_start(pattern: str) -> None:
    m = matcher(re.compile(pattern))
    assert not m.feed([b"a", b"x"])  # the text after the gap goes on mid-line
    assert not m.feed([b"y", b"x"])  # a later gap in the same window: the same
    assert not m.feed([b"q" * (REGEX_LOOKBEHIND + 10), b"x"])  # whatever came before


def test_a_gap_before_the_first_arrival_is_still_no_start() -> None:
    m = matcher(re.compile(r"\Ax"))
    assert not m.feed([b"", b"x"])


def test_after_a_gap_a_real_line_start_still_matches() -> None:
    m = matcher(re.compile(r"(?m)^x"))
    assert not m.feed([b"a", b"x"])
    assert m.feed([b"\nx"])
    m = matcher(re.compile(r"(?m)^x"))
    assert m.feed([b"a", b"yy\nx"])  # within the segment after the gap


def test_a_word_starts_after_a_gap() -> None:
    # The character before the gap's text is unknown, taken as no word character.
    assert matcher(re.compile(r"\bx")).feed([b"a", b"x"])


def test_the_window_start_is_still_a_line_and_window_start() -> None:
    for pattern in (r"^x", r"\Ax", r"(?m)^x"):
        m = matcher(re.compile(pattern))
        assert not m.feed([b""])  # nothing yet: the start has not moved
        assert m.feed([b"x"])


def test_the_stand_in_before_a_gap_is_never_matched_itself() -> None:
    # Only text that was printed matches: the unknown character is context, not text.
    assert not matcher(re.compile(r"\W")).feed([b"a", b"x"])
    assert not matcher(re.compile(".x")).feed([b"a", b"x"])
    assert not matcher("\ufffdx").feed([b"a", b"x"])  # a substring neither
    assert not matcher("\ufffd").feed([b"a", b"x"])


def test_the_first_character_after_a_gap_is_searched() -> None:
    assert matcher(re.compile("x")).feed([b"a", b"x"])
    assert matcher(re.compile(r"x\Z")).feed([b"a", b"x"])
    assert matcher("x").feed([b"a", b"x"])


def test_a_lead_byte_before_a_gap_never_joins_what_comes_later() -> None:
    # "é" was cut by the gap (its C3 before, its A9 dropped with the rest); a later
    # stray A9 must not complete it into a character that was never printed.
    m = matcher("é")
    assert not m.feed([b"a\xc3", b"\xa9"])
    assert not m.feed([b"\xa9"])


async def test_a_deadline_that_passes_while_others_run_stops_the_search(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Every search yields first (no slice left); while it yields, another task runs
    # until the deadline has passed: the matcher must look at the clock again before
    # it searches, and search nothing.
    monkeypatch.setattr(until_module, "SLICE_S", 0.0)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 0.2

    async def busy_until_the_deadline() -> None:
        while loop.time() < deadline:
            pass  # holds the loop: the matcher's task cannot run meanwhile

    busy = asyncio.ensure_future(busy_until_the_deadline())
    m = matcher("ready")
    assert await m.feed_async([b"ready"], deadline) is False
    await busy


# --- substrings searched as bytes ------------------------------------------------------


def test_which_substrings_are_searched_as_bytes() -> None:
    assert byte_needle("é$ ") == "é$ ".encode()
    assert byte_needle(re.compile("x")) is None
    assert byte_needle("a\ufffd") is None  # U+FFFD also stands for invalid bytes
    assert byte_needle("a\ud800") is None  # a lone surrogate has no bytes


def test_a_needle_split_inside_a_character_is_found() -> None:
    m = matcher("é!")
    assert not m.feed([b"x\xc3"])
    assert m.feed([b"\xa9!"])


def test_a_needle_may_start_in_the_partial_character_held_back() -> None:
    # The last window ended inside 漢 (E6 BC A2): this window's text starts with it.
    decoder = StreamDecoder()
    assert decoder.decode(b"a\xe6\xbc") == "a"
    m = UntilMatcher("漢x", decoder.snapshot())
    assert m.feed([b"\xa2x"])
    # After a gap the held-back bytes are not the text before: no match.
    m = UntilMatcher("漢x", decoder.snapshot())
    assert not m.feed([b"", b"\xa2x"])


def test_invalid_bytes_before_a_needle_do_not_hide_it() -> None:
    m = matcher("ab")
    assert m.feed([b"\xe6ab"])  # the lead byte becomes U+FFFD, then "ab"
    m = matcher("\u00e9")
    assert not m.feed([b"\xc3\xc3"])  # two lead bytes: no é
    assert m.feed([b"\xa9"])  # the second one completes it


def _text_matches(decoder: StreamDecoder, arrivals: list[list[bytes]], pattern: str) -> int:
    """The first arrival after which `pattern` is in the window's text, read as the
    decoder shows it (a gap ends a text and skips the continuation bytes after it);
    -1 for none."""
    texts = [""]
    for index, segments in enumerate(arrivals):
        for position, chunk in enumerate(segments):
            if position:
                texts.append("")
                decoder.reset()
                chunk = chunk[len(chunk) - len(chunk.lstrip(bytes(range(0x80, 0xC0)))) :]
            texts[-1] += decoder.decode(chunk)
        if any(pattern in text for text in texts):
            return index
    return -1


@pytest.mark.parametrize("seed", range(80))
def test_a_needle_matches_where_the_text_does(seed: int) -> None:
    rng = random.Random(seed)
    alphabet = ["a", "b", "é", "漢", "\U0001f600", "\n"]
    pattern = "".join(rng.choice(alphabet) for _ in range(rng.randrange(1, 4)))
    stream = "".join(rng.choice(alphabet) for _ in range(30)).encode()
    # Sprinkle invalid bytes: lone leads and continuations.
    noisy = bytearray()
    for byte in stream:
        if rng.random() < 0.1:
            noisy.append(rng.choice((0x80, 0xBF, 0xC3, 0xE6, 0xF0, 0xFF)))
        noisy.append(byte)
    cuts = sorted(rng.sample(range(1, len(noisy)), 8))
    chunks = [bytes(noisy[a:b]) for a, b in zip([0, *cuts], [*cuts, len(noisy)], strict=True)]
    arrivals: list[list[bytes]] = []
    for chunk in chunks:
        if arrivals and rng.random() < 0.25:
            arrivals[-1].append(chunk)  # after a gap of dropped bytes
        else:
            arrivals.append([chunk])
    start = StreamDecoder()
    start.decode(rng.choice((b"", b"\xc3", b"\xe6\xbc", b"\xf0\x9f")))  # held back
    want = _text_matches(start.snapshot(), arrivals, pattern)
    m = UntilMatcher(pattern, start.snapshot())
    got = next((i for i, segments in enumerate(arrivals) if m.feed(segments)), -1)
    assert got == want


# --- substrings searched in the text (they hold U+FFFD) ------------------------------


def test_a_text_substring_is_not_matched_across_a_gap() -> None:
    m = matcher("\ufffdb")
    assert not m.feed([b"a\xff", b"b"])  # U+FFFD before the gap, "b" after it
    assert m.feed([b"\xffb"])


def test_a_character_cut_by_a_gap_leaves_nothing_for_the_text_after_it() -> None:
    # The lead byte of "é" before the gap must not make U+FFFD with what comes later.
    m = matcher("\ufffdx")
    assert not m.feed([b"a\xc3", b"\xa9"])
    assert not m.feed([b"x"])


@pytest.mark.parametrize("pattern", ["\ufffd", re.compile("ok")])
def test_a_text_or_regex_match_is_sticky(pattern: str | re.Pattern[str]) -> None:
    m = matcher(pattern)
    assert m.feed([b"\xffok"])
    assert m.feed([b"", b"zz"])  # even where the text after a gap would not match


def test_text_skipped_for_the_budget_is_cut_to_the_overlap() -> None:
    m = matcher("\ufffdbc")
    assert not m.feed([b"\xffbc"], budget_s=-1)  # kept as look-behind, not searched
    assert not m.feed([b"x"])  # ... and only "bc" of it: no late match
