"""A bounded byte buffer that keeps a head and a rolling tail.

A process that nobody reads (or that prints faster than it is read) must never make the
library's memory grow without bound. `BoundedOutput` keeps the first `limit // 2` bytes,
then a rolling tail of the last `limit - limit // 2` bytes, and counts the bytes dropped
in between. Positions are absolute (bytes ever appended), so a reader can ask for what
arrived since a position it saw earlier. Until something has to be dropped, all of it is
held as one piece (the head), which a drain hands over without a copy.
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_OUTPUT_LIMIT = 1024 * 1024


@dataclass(frozen=True, slots=True)
class DrainedOutput:
    """The bytes taken out of a `BoundedOutput`: `head`, then `omitted` dropped bytes,
    then `tail`. With `omitted == 0` the two parts are contiguous."""

    head: bytes | bytearray
    omitted: int
    tail: bytes | bytearray

    @property
    def size(self) -> int:
        """Bytes that were appended in the drained span (kept plus omitted)."""
        return len(self.head) + self.omitted + len(self.tail)


class BoundedOutput:
    """Bytes appended since the last `drain()`, bounded to `limit` bytes retained."""

    __slots__ = (
        "_head",
        "_head_limit",
        "_omitted",
        "_start",
        "_tail",
        "_tail_limit",
    )

    def __init__(self, limit: int = DEFAULT_OUTPUT_LIMIT) -> None:
        if limit < 0:
            raise ValueError("output limit must not be negative")
        self._head_limit = limit // 2
        self._tail_limit = limit - self._head_limit
        self._head = bytearray()
        self._tail = bytearray()
        self._omitted = 0
        self._start = 0  # absolute position of the first undrained byte

    @property
    def start_pos(self) -> int:
        """Absolute position of the first byte not yet drained."""
        return self._start

    @property
    def end_pos(self) -> int:
        """Absolute position just past the last byte appended."""
        return self._start + len(self._head) + self._omitted + len(self._tail)

    @property
    def retained(self) -> int:
        """Bytes currently held in memory."""
        return len(self._head) + len(self._tail)

    @property
    def omitted(self) -> int:
        """Bytes dropped from the middle since the last drain."""
        return self._omitted

    def __len__(self) -> int:
        return self.end_pos - self._start

    def append(self, data: bytes | bytearray | memoryview) -> None:
        """Append bytes; anything beyond the bound is dropped from the middle."""
        if not data:
            return
        head = self._head
        if not self._tail and not self._omitted:
            # Nothing dropped yet: all of it stays in the head, one piece, however far
            # past `limit // 2` (a drain then hands it over without a join, and `since`
            # slices it once). It splits into head and tail only when the bound is hit.
            if len(head) + len(data) <= self._head_limit + self._tail_limit:
                head += data
                return
            spill = len(head) - self._head_limit
            if spill > 0:
                if len(data) < self._tail_limit:
                    self._tail = head[self._head_limit :]  # the start of the tail
                else:
                    self._omitted = spill  # the chunk alone fills the tail
                del head[self._head_limit :]
            else:
                room = -spill
                head += memoryview(data)[:room]
                data = memoryview(data)[room:]
        view = memoryview(data)
        if len(view) >= self._tail_limit:
            self._omitted += len(self._tail) + len(view) - self._tail_limit
            self._tail = bytearray(view[len(view) - self._tail_limit :])
            return
        self._tail += view
        excess = len(self._tail) - self._tail_limit
        if excess > 0:
            # CPython deletes from the front of a bytearray in O(1) (it moves ob_start).
            del self._tail[:excess]
            self._omitted += excess

    def since(self, pos: int) -> list[bytes]:
        """Retained bytes at absolute positions >= `pos`, as contiguous segments.

        A new segment starts after a gap of dropped bytes, so a matcher can tell that
        the text is not continuous there. When bytes from `pos` on were dropped before
        the first retained one (the tail rolled past `pos`), the first segment is empty:
        what follows does not go on from `pos`.
        """
        if not self._omitted:  # nothing dropped: all of it is in the head, one piece
            offset = pos - self._start
            if offset >= len(self._head):
                return []
            return [bytes(self._head[max(0, offset) :])]
        segments: list[bytes] = []
        head_end = self._start + len(self._head)
        tail_start = self.end_pos - len(self._tail)
        if pos < head_end:
            segments.append(bytes(self._head[max(0, pos - self._start) :]))
        elif self._tail and pos < tail_start:
            segments.append(b"")  # dropped from `pos` on: a gap before the tail
        if self._tail and pos < self.end_pos:
            segments.append(bytes(self._tail[max(0, pos - tail_start) :]))
        return segments

    def drain(self) -> DrainedOutput:
        """Take everything appended since the last drain and reset the buffer."""
        end = self.end_pos
        # The buffers are handed over, not copied: fresh ones replace them below. Without
        # a drop, everything is in the head (see `append`) and the tail is empty.
        out = DrainedOutput(self._head, self._omitted, self._tail)
        self._start = end
        self._head = bytearray()
        self._tail = bytearray()
        self._omitted = 0
        return out
