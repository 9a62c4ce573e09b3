"""An incremental decoder for server-sent events (the Worker's one-shot exec stream).

The stream arrives in network chunks that cut anywhere: in the middle of a field, of an
event, or between the CR and the LF of a CRLF. Lines may end in CR, LF or CRLF, mixed
in one stream. `SseDecoder.feed()` takes chunks as they come and returns the events that
are complete; a CR at the very end of a chunk is remembered, so an LF starting the next
chunk is not mistaken for an empty line (which would end an event early).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ...errors import ProviderError
from .bounds import MAX_SSE_EVENT, MAX_SSE_LINE

_LINE_END = re.compile(rb"\r\n|\r|\n")


@dataclass(frozen=True, slots=True)
class SseEvent:
    """One dispatched event: its `event` name ("message" when none was given) and its
    `data` (several `data:` lines joined with LF)."""

    event: str
    data: str
    id: str | None = None


class SseDecoder:
    """Turns chunks of an event stream into `SseEvent`s, keeping partial lines and
    partial events between calls.

    A line longer than `max_line` bytes, or an event whose `data` lines add up to more
    than `max_event` bytes, is not something the Worker sends: `ProviderError`, rather
    than a buffer without bound.
    """

    def __init__(self, *, max_line: int = MAX_SSE_LINE, max_event: int = MAX_SSE_EVENT) -> None:
        self._buffer = bytearray()
        self._after_cr = False
        self._event: str | None = None
        self._data: list[str] = []
        self._data_bytes = 0
        self._id: str | None = None
        self.max_line = max_line
        self.max_event = max_event

    def feed(self, chunk: bytes) -> list[SseEvent]:
        """Add one network chunk; return the events it completed."""
        if self._after_cr and chunk:
            # The previous chunk ended in CR: an LF here is the second half of CRLF.
            self._after_cr = False
            if chunk[:1] == b"\n":
                chunk = chunk[1:]
        # What is held holds no line end: the search starts at the new bytes, so a long
        # line arriving in many chunks is scanned once, not once per chunk.
        scan = len(self._buffer)
        self._buffer += chunk
        events: list[SseEvent] = []
        start = 0
        buffer = self._buffer
        while True:
            match = _LINE_END.search(buffer, max(start, scan))
            if match is None:
                break
            if match.start() - start > self.max_line:
                break  # refused below, before it is copied
            self._line(bytes(buffer[start : match.start()]), events)
            start = match.end()
            if match.group() == b"\r" and start == len(buffer):
                self._after_cr = True
        del buffer[:start]
        if len(buffer) > self.max_line:
            buffer.clear()  # released now, not when the traceback goes
            raise ProviderError(
                f"the Worker's event stream sent a line longer than {self.max_line} bytes",
                retryable=False,
            )
        return events

    def finish(self) -> list[SseEvent]:
        """At the end of the stream: the last event, if the server ended the stream
        without the blank line that should follow it (lenient: nothing is dropped)."""
        events: list[SseEvent] = []
        if self._buffer:
            self._line(bytes(self._buffer), events)
            self._buffer.clear()
        self._line(b"", events)
        return events

    def _line(self, raw: bytes, events: list[SseEvent]) -> None:
        if not raw:
            if self._data or self._event is not None:
                events.append(SseEvent(self._event or "message", "\n".join(self._data), self._id))
            self._event = None
            self._data = []
            self._data_bytes = 0
            return
        line = raw.decode("utf-8", "replace")
        if line.startswith(":"):
            return  # a comment (keep-alive)
        name, colon, value = line.partition(":")
        if colon and value.startswith(" "):
            value = value[1:]
        if name == "event":
            self._event = value
        elif name == "data":
            self._data_bytes += len(raw)
            if self._data_bytes > self.max_event:
                self._data = []  # released now, not when the traceback goes
                raise ProviderError(
                    f"the Worker's event stream sent an event larger than {self.max_event} bytes",
                    retryable=False,
                )
            self._data.append(value)
        elif name == "id":
            self._id = value
        # `retry` and unknown fields are ignored, as the SSE specification says.
