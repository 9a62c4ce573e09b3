"""Incremental UTF-8 decoding that never corrupts a character split across reads.

Each process owns one `StreamDecoder`: bytes are decoded as they are collected, and an
incomplete character at the end of a window is held back until the next window brings
its remaining bytes. When the bounded buffer dropped bytes from the middle, the head is
cut back to a character boundary and the tail starts on one, so the gap never produces
replacement characters, and the marker counts every byte that was not shown.
"""

from __future__ import annotations

from codecs import utf_8_decode as _utf_8_decode

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


# Bytes a held-back partial character may still need: a sequence is at most 4 bytes, and
# at least its lead byte is held back.
_COMPLETION = 3


class StreamDecoder:
    """A per-process incremental UTF-8 decoder (invalid bytes become U+FFFD).

    It decodes the caller's buffer in place (`codecs.utf_8_decode` reads a bytearray or
    memoryview as it is), where the standard incremental decoder first copies its input
    onto the bytes it held back: for a window of 50 MB that copy cost as much as the
    decoding itself. Only the partial character at the end of an input (at most 3
    bytes) is kept, as `_pending`.
    """

    __slots__ = ("_pending",)

    def __init__(self) -> None:
        self._pending = b""

    @property
    def pending(self) -> bytes:
        """The partial character held back for the next input (at most 3 bytes)."""
        return self._pending

    def snapshot(self) -> StreamDecoder:
        """A copy with the same pending partial character, for look-ahead decoding."""
        twin = StreamDecoder()
        twin._pending = self._pending
        return twin

    def decode(self, data: bytes | bytearray | memoryview, *, final: bool = False) -> str:
        """Decode the next bytes of the stream."""
        pending = self._pending
        if not pending:
            text, used = _utf_8_decode(data, "replace", final)
            self._pending = bytes(data[used:])  # nothing, or a partial character
            return text
        # Finish the held-back character from the first bytes of `data`: it started
        # with a lead byte and was valid so far, so it ends (complete or not) within the
        # next `_COMPLETION` bytes, and the decoder stops past it. Where it stops is a
        # character boundary of `data` itself, from which the rest decodes in place.
        joined = pending + bytes(data[:_COMPLETION])
        if len(data) <= _COMPLETION:
            text, used = _utf_8_decode(joined, "replace", final)
            self._pending = joined[used:]
            return text
        first, used = _utf_8_decode(joined, "replace", False)
        self._pending = b""
        return first + self.decode(memoryview(data)[used - len(pending) :], final=final)

    def reset(self) -> None:
        """Forget any pending partial character (the stream was cut)."""
        self._pending = b""

    def decode_drained(self, drained: DrainedOutput, *, final: bool = False) -> str:
        """Decode one window's drained output, inserting the omission marker if needed."""
        head = drained.head
        if not drained.omitted:
            return self.decode(head, final=final)
        cut = _incomplete_suffix_len(head)
        skip = leading_continuation_len(drained.tail)
        text = self.decode(memoryview(head)[: len(head) - cut], final=True)
        marker = omission_marker(drained.omitted + cut + skip)
        return text + marker + self.decode(memoryview(drained.tail)[skip:], final=final)
