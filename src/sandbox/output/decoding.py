"""Incremental UTF-8 decoding that never corrupts a character split across reads.

Each process owns one `StreamDecoder`: bytes are decoded as they are collected, and an
incomplete character at the end of a window is held back until the next window brings
its remaining bytes. When the bounded buffer dropped bytes from the middle, the head is
cut back to a character boundary and the tail starts on one, so the gap never produces
replacement characters, and the marker counts every byte that was not shown.
"""

from __future__ import annotations

import codecs

from .buffer import DrainedOutput


def omission_marker(omitted: int) -> str:
    """The line inserted where `omitted` bytes were dropped from a process's output."""
    return f"\n[... {omitted} bytes of output omitted ...]\n"


def _incomplete_suffix_len(data: bytes | bytearray) -> int:
    """Length of a trailing, not yet complete UTF-8 sequence at the end of `data`."""
    n = len(data)
    for back in range(1, min(4, n) + 1):
        byte = data[n - back]
        if byte < 0x80:
            return 0
        if byte >= 0xC0:  # a lead byte: is its sequence complete?
            need = 2 if byte < 0xE0 else 3 if byte < 0xF0 else 4
            return back if back < need else 0
    return 0


def continues(byte: int) -> bool:
    """Whether `byte` is a UTF-8 continuation byte (10xxxxxx): it never starts a
    character, so no cut may land before it."""
    return byte & 0xC0 == 0x80


def leading_continuation_len(data: bytes | bytearray) -> int:
    """Count of continuation bytes (10xxxxxx) at the start of `data`, at most 3."""
    n = 0
    while n < min(3, len(data)) and continues(data[n]):
        n += 1
    return n


class StreamDecoder:
    """A per-process incremental UTF-8 decoder (invalid bytes become U+FFFD)."""

    __slots__ = ("_decoder",)

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def snapshot(self) -> StreamDecoder:
        """A copy with the same pending partial character, for look-ahead decoding."""
        twin = StreamDecoder()
        twin._decoder.setstate(self._decoder.getstate())
        return twin

    def decode(self, data: bytes, *, final: bool = False) -> str:
        """Decode the next bytes of the stream."""
        return self._decoder.decode(data, final)

    def reset(self) -> None:
        """Forget any pending partial character (the stream was cut)."""
        self._decoder.reset()

    def decode_drained(self, drained: DrainedOutput, *, final: bool = False) -> str:
        """Decode one window's drained output, inserting the omission marker if needed."""
        if not drained.omitted:
            return self._decoder.decode(drained.head, final)
        cut = _incomplete_suffix_len(drained.head)
        head = drained.head[: len(drained.head) - cut] if cut else drained.head
        skip = leading_continuation_len(drained.tail)
        text = self._decoder.decode(head, True)
        self._decoder.reset()
        marker = omission_marker(drained.omitted + cut + skip)
        return text + marker + self._decoder.decode(drained.tail[skip:], final)
