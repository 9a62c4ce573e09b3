"""Decoder for the multiplexed stream of a non-tty Docker exec.

Without a terminal the engine frames the output: an 8-byte header (byte 0 is the stream,
1 = stdout and 2 = stderr, 3 = an engine error; bytes 4-7 the big-endian payload length)
and then the payload. Reads cut the stream anywhere, including inside a header, so the
decoder keeps the partial header between reads and hands payload bytes on as soon as they
arrive (a large frame is never held back until it is complete, nor copied twice).
"""

from __future__ import annotations

from collections.abc import Callable

HEADER_SIZE = 8
STDOUT = 1
STDERR = 2
SYSTEM_ERROR = 3

PayloadCallback = Callable[[int, bytes], None]


class FrameDecoder:
    """Feed raw socket bytes with `feed()`; `on_payload(stream, data)` gets the payloads.

    `pending_bytes` tells whether the stream ended in the middle of a frame.
    """

    def __init__(self, on_payload: PayloadCallback) -> None:
        self._on_payload = on_payload
        self._header = bytearray()
        self._stream = 0
        self._remaining = 0

    @property
    def pending_bytes(self) -> int:
        """Bytes of an unfinished header, or of a frame's payload still expected."""
        return len(self._header) + self._remaining

    def feed(self, data: bytes) -> None:
        """Decode one chunk as read from the socket.

        Consecutive payload pieces of the same stream within the chunk are handed on
        together (one call, one copy), so a chunk of many small frames costs little.
        """
        view = memoryview(data)
        pos = 0
        end = len(view)
        pieces: list[memoryview] = []
        while pos < end:
            if self._remaining:
                take = min(self._remaining, end - pos)
                self._remaining -= take
                pieces.append(view[pos : pos + take])
                pos += take
                continue
            need = HEADER_SIZE - len(self._header)
            piece = view[pos : pos + need]
            self._header += piece
            pos += len(piece)
            if len(self._header) < HEADER_SIZE:
                break
            stream = self._header[0]
            if stream != self._stream and pieces:
                self._emit(pieces, data)
            self._stream = stream
            self._remaining = int.from_bytes(self._header[4:8], "big")
            self._header.clear()
        if pieces:
            self._emit(pieces, data)

    def _emit(self, pieces: list[memoryview], data: bytes) -> None:
        if len(pieces) == 1 and pieces[0].nbytes == len(data):
            payload = data  # the whole chunk is payload: hand it on as it is
        else:
            payload = b"".join(pieces)
        pieces.clear()
        self._on_payload(self._stream, payload)
