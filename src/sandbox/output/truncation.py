"""Token truncation of a window's text to `max_output_tokens`.

A token is counted as about 4 bytes of UTF-8. When the text is over budget, the result
keeps a head and a tail of equal byte budgets, each cut on a character boundary, joined
by a marker giving the number of tokens removed, and prefixed with the total line count
when that prefix fits in the budget. The work is linear in the size of the text.
"""

from __future__ import annotations

from dataclasses import dataclass

from .decoding import continues

BYTES_PER_TOKEN = 4


def approx_token_count(byte_len: int) -> int:
    """Tokens in `byte_len` bytes of text, rounding up."""
    return (byte_len + BYTES_PER_TOKEN - 1) // BYTES_PER_TOKEN


@dataclass(frozen=True, slots=True)
class Truncated:
    """The truncated text and, when something was cut, the original token count."""

    text: str
    original_token_count: int | None


def _head_on_boundary(data: bytes, budget: int) -> bytes:
    # Called with a budget below len(data): data[end] is the first byte left out. The
    # text's first byte never continues a character, so the loop stops by 0.
    end = budget
    while end and continues(data[end]):
        end -= 1
    return data[:end]


def _tail_on_boundary(data: bytes, budget: int) -> bytes:
    # Called with a budget below len(data), so the tail starts inside it.
    start = len(data) - budget
    while start < len(data) and continues(data[start]):
        start += 1
    return data[start:]


def truncate_to_tokens(text: str, max_tokens: int | None) -> Truncated:
    """Fit `text` into `max_tokens` tokens, keeping its head and tail."""
    if max_tokens is None:
        return Truncated(text, None)
    budget = max_tokens * BYTES_PER_TOKEN
    if len(text) <= budget // 4:  # even at 4 bytes a character it fits: skip encoding
        return Truncated(text, None)
    data = text.encode("utf-8", "surrogatepass")
    if len(data) <= budget:
        return Truncated(text, None)
    original = approx_token_count(len(data))
    prefix = f"Total output lines: {text.count(chr(10)) + 1}\n\n"
    if len(prefix) * 2 < budget:
        budget -= len(prefix)
    else:
        prefix = ""
    head = _head_on_boundary(data, budget // 2)
    tail = _tail_on_boundary(data, budget - budget // 2)
    removed = approx_token_count(len(data) - len(head) - len(tail))
    marker = f"…{removed} tokens truncated…"
    body = head.decode("utf-8", "surrogatepass") + marker + tail.decode("utf-8", "surrogatepass")
    return Truncated(prefix + body, original)
