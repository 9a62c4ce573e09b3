"""Token truncation (sandbox.output.truncation): budgets, boundaries and the marker, exactly."""

from __future__ import annotations

import pytest

from sandbox.output.truncation import BYTES_PER_TOKEN, approx_token_count, truncate_to_tokens


def test_four_bytes_make_a_token_rounding_up() -> None:
    assert BYTES_PER_TOKEN == 4
    assert [approx_token_count(n) for n in range(10)] == [0, 1, 1, 1, 1, 2, 2, 2, 2, 3]


def test_no_budget_and_text_within_it_are_left_alone() -> None:
    text = "x" * 1000
    assert truncate_to_tokens(text, None) == (truncate_to_tokens(text, None))
    for result in (truncate_to_tokens(text, None), truncate_to_tokens(text, 250)):
        assert result.text is text
        assert result.original_token_count is None


def test_the_budget_counts_bytes_not_characters() -> None:
    # 100 two-byte characters: 200 bytes, over a 40-token (160-byte) budget although
    # the character count (100) is under it.
    text = "é" * 100
    assert truncate_to_tokens(text, 50).original_token_count is None  # exactly 200 bytes
    cut = truncate_to_tokens(text, 40)
    assert cut.original_token_count == 50
    assert len(cut.text.encode()) <= 160 + len("…10 tokens truncated…".encode())


def test_exactly_at_the_budget_is_kept() -> None:
    assert truncate_to_tokens("x" * 40, 10).original_token_count is None
    assert truncate_to_tokens("x" * 41, 10).original_token_count == 11


def test_short_text_skips_encoding_only_when_it_surely_fits() -> None:
    # 10 characters under a budget of 40 bytes: each could be 4 bytes, still fits.
    text = "\U0001f600" * 10  # 40 bytes
    assert truncate_to_tokens(text, 10).original_token_count is None
    text = "\U0001f600" * 11  # 44 bytes, 11 characters: must be measured
    assert truncate_to_tokens(text, 10).original_token_count == 11


def test_the_result_is_exact_head_marker_tail_with_a_line_count() -> None:
    text = "".join(f"{i:04d}\n" for i in range(100))  # 500 bytes, 100 lines + 1
    result = truncate_to_tokens(text, 50)  # 200 bytes
    prefix = "Total output lines: 101\n\n"
    budget = 200 - len(prefix)
    head = text[: budget // 2]
    tail = text[len(text) - (budget - budget // 2) :]
    removed = approx_token_count(500 - len(head) - len(tail))
    assert result.text == f"{prefix}{head}…{removed} tokens truncated…{tail}"
    assert result.original_token_count == 125


def test_the_line_count_is_dropped_when_it_would_take_half_the_budget() -> None:
    text = "y" * 400
    prefix = "Total output lines: 1\n\n"  # 23 characters
    small = (len(prefix) * 2) // BYTES_PER_TOKEN  # budget 44 bytes: 46 >= 44, dropped
    result = truncate_to_tokens(text, small)
    assert not result.text.startswith("Total")
    budget = small * BYTES_PER_TOKEN
    assert result.text.startswith("y" * (budget // 2) + "…")
    assert result.text.endswith("…" + "y" * (budget - budget // 2))
    # A budget of exactly twice the prefix is not enough either; one token more is.
    exact = truncate_to_tokens(text, 12)  # 48 bytes vs 46: kept
    assert exact.text.startswith(prefix)
    edge = "z" * 400
    at = truncate_to_tokens(edge, 46 // 4 + 0)  # 44 bytes
    assert not at.text.startswith("Total")


def test_the_line_count_kept_when_twice_it_is_just_under_the_budget() -> None:
    prefix = "Total output lines: 1\n\n"
    # budget 48 > 46: prefix kept; make the budget 47 impossible (a multiple of 4), so
    # check 2*len(prefix) < budget on both sides with a prefix of other length.
    text = "q" * 300 + "\n"  # 2 lines: prefix 23 characters as well
    assert truncate_to_tokens(text, 12).text.startswith("Total output lines: 2\n\n")
    assert not truncate_to_tokens(text, 11).text.startswith("Total")
    assert len(prefix) == 23


@pytest.mark.parametrize("offset", range(4))
def test_cuts_land_on_character_boundaries(offset: int) -> None:
    text = "a" * offset + "\U0001f600" * 100 + "b" * offset
    result = truncate_to_tokens(text, 20)
    assert "\ufffd" not in result.text
    body = result.text.split("\n\n", 1)[1]
    head, rest = body.split("…", 1)
    tail = rest.split("…", 1)[1]
    assert text.startswith(head)
    assert text.endswith(tail)
    budget = 20 * BYTES_PER_TOKEN - len("Total output lines: 1\n\n")
    # The head is the longest whole-character prefix within half the budget.
    half = budget // 2
    assert len(head.encode()) <= half < len(head.encode()) + 4
    assert len(tail.encode()) <= budget - half < len(tail.encode()) + 4


def test_a_head_cut_backs_off_to_the_lead_byte_and_a_tail_cut_moves_on() -> None:
    text = "\u00e9" * 200  # 2-byte characters
    result = truncate_to_tokens(text, 30)
    body = result.text.split("\n\n", 1)[1]
    head = body.split("…", 1)[0]
    tail = body.rsplit("…", 1)[1]
    budget = 120 - len("Total output lines: 1\n\n")  # 97
    assert len(head.encode()) == (budget // 2) // 2 * 2  # 48 -> 48 bytes, 24 characters
    assert len(tail.encode()) == (budget - budget // 2) // 2 * 2  # 49 -> 48 bytes
    assert set(head + tail) == {"\u00e9"}


def test_lone_surrogates_survive_truncation() -> None:
    text = "\udc80" * 100
    result = truncate_to_tokens(text, 20)
    assert result.original_token_count == approx_token_count(300)
    assert "\udc80" in result.text


def test_a_budget_smaller_than_one_character() -> None:
    result = truncate_to_tokens("\U0001f600" * 10, 1)
    assert result.text == "…10 tokens truncated…"
    assert result.original_token_count == 10


@pytest.mark.parametrize("char", ["\u00bf", "\uffff", "\u0080"])
def test_every_continuation_byte_value_is_a_cut_to_avoid(char: str) -> None:
    # ¿ is C2 BF, U+FFFF is EF BF BF, U+0080 is C2 80: the highest and lowest
    # continuation bytes must both count as the middle of a character.
    text = char * 300
    result = truncate_to_tokens(text, 25)
    body = result.text.split("\n\n", 1)[1]
    head, _, rest = body.partition("…")
    tail = rest.partition("…")[2]
    assert set(head) == {char} and set(tail) == {char}


def test_the_line_count_is_dropped_at_exactly_half_the_budget() -> None:
    # "Total output lines: 10\n\n" is 24 characters: twice that is a budget of exactly
    # 12 tokens (48 bytes), which drops it; 13 tokens keep it.
    text = "w" * 100 + "\n" * 9
    prefix = "Total output lines: 10\n\n"
    assert len(prefix) * 2 == 12 * BYTES_PER_TOKEN
    at = truncate_to_tokens(text, 12)
    assert at.text.startswith("w" * 24 + "…")
    assert truncate_to_tokens(text, 13).text.startswith(prefix + "w" * 14 + "…")


@pytest.mark.parametrize("char", ["\x7f", "\u0080", "\u2000", "\U00010000"])
def test_bytes_that_start_a_character_or_are_ascii_are_cut_points(char: str) -> None:
    # Only continuation bytes (0x80..0xBF) move a cut: ASCII (0x7F, DEL, the highest)
    # and lead bytes (0xC2, 0xE2, 0xF0 here) are where a character starts.
    text = "a" * 8 + char * 20 + "b" * 8
    result = truncate_to_tokens(text, 4)  # 16 bytes: 8 of head, 8 of tail
    head, _, tail = result.text.partition("…")
    assert head == "a" * 8  # cut right before the character, not before its lead byte
    assert tail.endswith("b" * 8)
