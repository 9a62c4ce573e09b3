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

_LINE_END = re.compile(rb"\r\n|\r|\n")

# A single line longer than this is not something the Worker sends: refuse it rather
# than buffer without bound.
MAX_LINE_BYTES = 16 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class SseEvent:
    """One dispatched event: its `event` name ("message" when none was given) and its
    `data` (several `data:` lines joined with LF)."""

    event: str
    data: str
    id: str | None = None


class SseDecoder:
    """Turns chunks of an event stream into `SseEvent`s, keeping partial lines and
    partial events between calls."""

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._after_cr = False
        self._event: str | None = None
        self._data: list[str] = []
        self._id: str | None = None

    def feed(self, chunk: bytes) -> list[SseEvent]:
        """Add one network chunk; return the events it completed."""
        if self._after_cr and chunk:
            # The previous chunk ended in CR: an LF here is the second half of CRLF.
            self._after_cr = False
            if chunk[:1] == b"\n":
                chunk = chunk[1:]
        self._buffer += chunk
        events: list[SseEvent] = []
        start = 0
        buffer = self._buffer
        while True:
            match = _LINE_END.search(buffer, start)
            if match is None:
                break
            self._line(bytes(buffer[start : match.start()]), events)
            start = match.end()
            if match.group() == b"\r" and start == len(buffer):
                self._after_cr = True
        del buffer[:start]
        if len(buffer) > MAX_LINE_BYTES:
            raise ProviderError(
                f"the event stream sent a line longer than {MAX_LINE_BYTES} bytes",
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
            self._data.append(value)
        elif name == "id":
            self._id = value
        # `retry` and unknown fields are ignored, as the SSE specification says.
