"""The `sandbox` command's standard streams when they are closed or their reader left.

A process started with a standard descriptor closed (`sandbox run -- echo hi >&-`) gets
`sys.stdout` (or `sys.stderr`) as None from Python, and the next file it opens would
take that number: the library's own files or sockets would then receive the output.
`plug_closed_fds` puts /dev/null *opened read-only* in each closed slot, so no other
file can take the number and every write there still fails as on a closed descriptor
(EBADF), and gives `sys.stdout`/`sys.stderr` streams over them.

`output_failure` then turns a failed write to our own streams into the command's end:

- stdout closed: one `sandbox: error:` line on stderr, exit `EXIT_ERROR`;
- stderr closed: no line (there is nowhere to write it), exit `EXIT_ERROR`;
- the reader went away (EPIPE: `sandbox run ... | head -1`): quiet, exit
  `EXIT_BROKEN_PIPE` (141, what a shell reports for a tool killed by SIGPIPE).

Either way the broken stream is pointed at /dev/null afterwards, so the flush at
interpreter exit has nothing to complain about ("Exception ignored ...").
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import io
import os
import sys
from typing import BinaryIO

from .exit_codes import EXIT_BROKEN_PIPE, EXIT_ERROR

_NAMES = {0: "standard input", 1: "standard output", 2: "standard error"}


def is_open(fd: int) -> bool:
    """Whether `fd` is an open descriptor."""
    try:
        fcntl.fcntl(fd, fcntl.F_GETFD)
    except OSError:
        return False
    return True


def is_writable(fd: int) -> bool:
    """Whether `fd` is open for writing (False for a closed or plugged slot)."""
    try:
        mode = fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE
    except OSError:
        return False
    return mode in (os.O_WRONLY, os.O_RDWR)


def _text_stream(fd: int, *, write: bool) -> io.TextIOWrapper:
    raw = io.FileIO(fd, "w" if write else "r", closefd=False)
    buffered: io.BufferedWriter | io.BufferedReader = (
        io.BufferedWriter(raw) if write else io.BufferedReader(raw)
    )
    return io.TextIOWrapper(buffered, encoding="utf-8", errors="backslashreplace")


def plug_closed_fds() -> frozenset[int]:
    """Fill each closed descriptor among 0, 1 and 2 with /dev/null opened read-only and
    give Python a stream over it; returns the numbers that were closed. Idempotent."""
    closed = frozenset(fd for fd in (0, 1, 2) if not is_open(fd))
    for fd in sorted(closed):
        null = os.open(os.devnull, os.O_RDONLY)
        if null != fd:
            os.dup2(null, fd)
            os.close(null)
    if 0 in closed and sys.stdin is None:
        sys.stdin = _text_stream(0, write=False)
    if 1 in closed and sys.stdout is None:
        sys.stdout = _text_stream(1, write=True)
    if 2 in closed and sys.stderr is None:
        sys.stderr = _text_stream(2, write=True)
    return closed


def write_all(stream: BinaryIO, data: bytes) -> None:
    """Write all of `data` to `stream` and flush it. A buffered stream whose reader
    leaves mid-write reports a short count instead of raising (CPython returns what the
    pipe took), so the rest is written again until the error shows (EPIPE)."""
    view = memoryview(data)
    while view:
        written = stream.write(view)
        if not written:  # took nothing and raised nothing: do not spin
            raise OSError(errno.EIO, "the output stream took nothing")
        view = view[written:]
    stream.flush()


def error_line(exc: BaseException | str) -> str:
    """`sandbox: error: MESSAGE` on one line, whatever the message holds."""
    message = " ".join(str(exc).split()) or type(exc).__name__
    return f"sandbox: error: {message}"


def say(line: str) -> None:
    """Write `line` to stderr; a stderr that cannot take it is left alone (the exit
    code tells)."""
    try:
        print(line, file=sys.stderr, flush=True)
    except (OSError, ValueError):
        _silence(2)


def _silence(fd: int) -> None:
    """Point `fd` at /dev/null (writable) and drop what its Python stream buffered, so
    nothing is written there again and the flush at exit succeeds."""
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, fd)
    finally:
        os.close(null)
    stream = sys.stdout if fd == 1 else sys.stderr
    with contextlib.suppress(OSError, ValueError):
        stream.flush()


def flush_outputs() -> None:
    """Flush `sys.stdout` and `sys.stderr` now, so a failure shows while it can still
    be reported (not at interpreter exit)."""
    for stream in (sys.stdout, sys.stderr):
        if stream is not None:
            stream.flush()


def output_failure(exc: OSError) -> int | None:
    """The exit status for `exc` if it is a failed write to our stdout or stderr (after
    saying so where it can), else None: the error is not about our streams."""
    if exc.errno == errno.EPIPE:
        # The reader left: stop quietly, as a tool killed by SIGPIPE does. Nothing is
        # written after this, and stderr may be the same pipe (`2>&1 | head`).
        _silence(1)
        _silence(2)
        return EXIT_BROKEN_PIPE
    if exc.errno != errno.EBADF:
        return None
    dead = {fd for fd in (1, 2) if not is_writable(fd)}
    if not dead:
        return None
    if 1 in dead:
        _silence(1)
    if 2 in dead:
        _silence(2)
    else:
        say(f"sandbox: error: cannot write the output: {_NAMES[1]} is not open for writing")
    return EXIT_ERROR
