"""Recordings of a terminal session in asciicast v2, the format `asciinema play` plays.

Interface::

    recorder = AsciicastRecorder.open(
        path, rows=24, cols=80, term="xterm-256color", command="bash", record_input=False
    )                            # or AsciicastRecorder.open_in(host_directory, "name.cast", ...)
    recorder.output(data)        # raw output bytes, exactly as read from the terminal
    recorder.input(data)         # keystrokes sent to it (recorded only if record_input)
    recorder.resize(rows, cols)  # the terminal was resized
    recorder.close()             # or use it as `with AsciicastRecorder.open(...) as recorder:`

The file is the header line ``{"version": 2, "width": cols, "height": rows, "timestamp":
<UNIX seconds>, "env": {"TERM": term, "SHELL": shell}, "command"?, "title"?}`` (env
holds only the values given), then one event per line: ``[seconds, code, text]`` where
seconds is the time since `open` (monotonic clock, microseconds, never decreasing), code
is "o" (output), "i" (input) or "r" (resize, text "COLSxROWS"). Output and input are
decoded by one incremental UTF-8 decoder each (invalid bytes become U+FFFD): a character
split between two reads is written whole, in the event of the read that completes it.
A read that completes no character writes no event.

Durability: the file is opened unbuffered and every event is one complete line written
by one `write()` system call, so nothing waits in a buffer of ours: a cancelled task, an
exception or SIGKILL of the writing process leaves a file that is valid up to its last
line, and `asciinema play` reads it. (The kernel can cut a write short only if SIGKILL
lands while it copies a line that spans pages; the last line is then incomplete and the
file is valid up to the line before. No fsync: a power loss can lose recent events.)

Cost: each call writes synchronously. A write of a line to a local file is a copy into
the page cache (microseconds), acceptable on the event loop; do not record to a network
or FUSE filesystem. Nothing is bounded: the recording of a flood is as big as the flood
(JSON escaping makes control-heavy output up to six times bigger).

The file is always new, created by `sandbox.files.host` (the sandbox may be able to
write where it goes): exclusively, mode 0600 (typed input can hold secrets), its folder
reached through no symlink (`open`) or held as an fd (`open_in`). Anything already at
its name is refused with `HostPathError` and left untouched, never replaced.

Errors: if a write fails (disk full...), the file is cut back to its last complete line,
the recorder closes itself, `error` keeps the exception and later calls do nothing: the
process being recorded must not fail because its recording did.
"""

from __future__ import annotations

import codecs
import json
import logging
import os
import time
from types import TracebackType
from typing import Any, Self

from ..files.host import HostDirectory, create_new_file
from .size import check_terminal_size

logger = logging.getLogger("sandbox")


class AsciicastRecorder:
    """Writes one asciicast v2 file, an event per line (see the module docstring).

    Create it with `AsciicastRecorder.open`. Not thread-safe: call it from one thread.
    """

    def __init__(self, fd: int, path: str, *, record_input: bool) -> None:
        """Use `AsciicastRecorder.open`."""
        self.path = path
        self.record_input = record_input
        self.error: OSError | None = None
        self._fd: int | None = fd
        self._size = 0
        self._start = time.monotonic()
        self._last = 0.0
        self._output_decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._input_decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str],
        *,
        rows: int,
        cols: int,
        term: str | None = None,
        command: str | None = None,
        record_input: bool = False,
        title: str | None = None,
        shell: str | None = None,
    ) -> AsciicastRecorder:
        """Create the file at `path` (new: `files.host.create_new_file`, no symlink
        followed) and write the header; times start now.

        `term` and `shell` go to the header's env (TERM, SHELL), `command` and `title` to
        its fields of those names; each is left out when None. Input events are written
        only if `record_input`. A path that cannot be created new is a `HostPathError`;
        a failed header write raises its `OSError`.
        """
        check_terminal_size(rows, cols)
        fd = create_new_file(path, what="record to")
        name = os.fspath(path)
        return cls._begin(fd, name, rows, cols, term, command, record_input, title, shell)

    @classmethod
    def open_in(
        cls,
        directory: HostDirectory,
        name: str,
        *,
        rows: int,
        cols: int,
        term: str | None = None,
        command: str | None = None,
        record_input: bool = False,
        title: str | None = None,
        shell: str | None = None,
    ) -> AsciicastRecorder:
        """Like `open`, for a new file `name` created relative to `directory`'s fd."""
        check_terminal_size(rows, cols)
        fd = directory.create_file(name, what="record to")
        shown = os.path.join(directory.path, name)
        return cls._begin(fd, shown, rows, cols, term, command, record_input, title, shell)

    @classmethod
    def _begin(
        cls,
        fd: int,
        path: str,
        rows: int,
        cols: int,
        term: str | None,
        command: str | None,
        record_input: bool,
        title: str | None,
        shell: str | None,
    ) -> AsciicastRecorder:
        """A recorder owning `fd`, its header written (the fd is closed if that fails)."""
        header: dict[str, Any] = {
            "version": 2,
            "width": cols,
            "height": rows,
            "timestamp": int(time.time()),
            "env": {name: value for name, value in (("TERM", term), ("SHELL", shell)) if value},
        }
        if command is not None:
            header["command"] = command
        if title is not None:
            header["title"] = title
        recorder = cls(fd, path, record_input=bool(record_input))
        recorder._write_line(header)
        if recorder.error is not None:
            raise recorder.error
        return recorder

    @property
    def closed(self) -> bool:
        """True once `close()` was called (or a write failed)."""
        return self._fd is None

    def output(self, data: bytes | bytearray | memoryview) -> None:
        """Record output bytes read from the terminal (an "o" event)."""
        if self._fd is None:
            return
        text = self._output_decoder.decode(data)
        if text:
            self._event("o", text)

    def input(self, data: bytes | bytearray | memoryview) -> None:
        """Record bytes written to the terminal (an "i" event), if `record_input`."""
        if self._fd is None or not self.record_input:
            return
        text = self._input_decoder.decode(data)
        if text:
            self._event("i", text)

    def resize(self, rows: int, cols: int) -> None:
        """Record a terminal resize (an "r" event, text "COLSxROWS")."""
        check_terminal_size(rows, cols)
        if self._fd is not None:
            self._event("r", f"{cols}x{rows}")

    def close(self) -> None:
        """Write what the decoders still hold (an incomplete character becomes U+FFFD)
        and close the file. Idempotent."""
        if self._fd is None:
            return
        rest = self._output_decoder.decode(b"", True)
        if rest:
            self._event("o", rest)
        if self.record_input:
            rest = self._input_decoder.decode(b"", True)
            if rest:
                self._event("i", rest)
        self._close_fd()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._fd is None else "open"
        return f"<AsciicastRecorder {self.path!r} {state}>"

    # ---- internals ------------------------------------------------------------------

    def _event(self, code: str, text: str) -> None:
        # Rounded to microseconds like asciinema; max() keeps times from going back
        # after rounding.
        elapsed = max(self._last, round(time.monotonic() - self._start, 6))
        self._last = elapsed
        self._write_line([elapsed, code, text])

    def _write_line(self, value: object) -> None:
        if self._fd is None:
            return
        line = (json.dumps(value, ensure_ascii=False) + "\n").encode("utf-8")
        view = memoryview(line)
        try:
            while view:  # one write() for a whole line but on a short write
                written = os.write(self._fd, view)
                view = view[written:]
        except OSError as exc:
            self._fail(exc)
            return
        self._size += len(line)

    def _fail(self, exc: OSError) -> None:
        self.error = exc
        logger.warning("recording %s stopped: %s", self.path, exc)
        if self._fd is not None:
            try:
                os.ftruncate(self._fd, self._size)  # drop a partly written line
            except OSError:
                pass
        self._close_fd()

    def _close_fd(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            try:
                os.close(fd)
            except OSError as exc:
                self.error = self.error or exc
