"""`sandbox shell`: attach the user's terminal to a PTY in the sandbox.

The local terminal is put in raw mode (restored on any exit), its size is sent at start
and on every SIGWINCH, keystrokes are written as they are typed, and output is streamed
by polls that end as soon as anything arrives. The remote exit code is passed through.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import signal
import sys
import termios
import tty
from collections.abc import Iterator

from ..backends.toolkit import options as cli_options
from ..errors import ProcessExitedError, PtyProcessNotFoundError, UnsupportedOperationError
from ..session import BaseSandboxSession
from ..terminal.size import MAX_TERMINAL_SIDE
from ..types import PtyUpdate
from .durable import cli_session
from .session import ANY_OUTPUT, record_path
from .std_streams import write_all

ANY_OUTPUT_WINDOW_S = 30.0
# bash where there is one (job control works in a confined jail; dash's does not), else sh.
DEFAULT_SHELL = "if command -v bash >/dev/null 2>&1; then exec bash -i; else exec sh -i; fi"


def _terminal_size() -> tuple[int, int]:
    """The user's terminal size, at most the largest a process's terminal may have (a
    bigger window gets a terminal of that size in its top left corner, not an error)."""
    rows, cols = _local_terminal_size()
    return min(rows, MAX_TERMINAL_SIDE), min(cols, MAX_TERMINAL_SIDE)


def _local_terminal_size() -> tuple[int, int]:
    # Ask the terminal itself: COLUMNS/LINES in the environment go stale on resize.
    for stream in (sys.stdin, sys.stdout):
        try:
            size = os.get_terminal_size(stream.fileno())
        except (OSError, ValueError):
            continue
        if size.lines and size.columns:
            return size.lines, size.columns
    fallback = shutil.get_terminal_size((80, 24))
    return fallback.lines, fallback.columns


@contextlib.contextmanager
def _raw_terminal(fd: int) -> Iterator[None]:
    if not os.isatty(fd):
        yield
        return
    saved = termios.tcgetattr(fd)
    try:
        tty.setraw(fd, termios.TCSANOW)  # keep keys typed ahead of the attach
        yield
    finally:
        # After a hangup (SIGHUP: the terminal was closed) there is no terminal left to
        # restore, and the session must still be closed: that failure is not an error.
        with contextlib.suppress(termios.error, OSError):
            termios.tcsetattr(fd, termios.TCSAFLUSH, saved)


class _Attachment:
    """Moves bytes between the local terminal and one sandbox process."""

    def __init__(self, session: BaseSandboxSession, process_id: int) -> None:
        self.session = session
        self.process_id = process_id
        self.exit_code: int | None = None
        self.done = asyncio.Event()
        self._out = sys.stdout.buffer
        self.resizes: set[asyncio.Task[None]] = set()

    def show(self, update: PtyUpdate) -> None:
        if update.output:
            write_all(self._out, update.output.encode("utf-8", "surrogateescape"))
        if update.process_id is None:
            self.exit_code = update.exit_code
            self.done.set()

    async def pump_output(self) -> None:
        while not self.done.is_set():
            try:
                update = await self.session.pty_write_stdin(
                    self.process_id, "", until=ANY_OUTPUT, yield_time_s=ANY_OUTPUT_WINDOW_S
                )
            except PtyProcessNotFoundError:
                self.done.set()
                return
            self.show(update)
        # done: the input pump may still wait for keys; nothing more to show.

    async def pump_input(self, fd: int) -> None:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[bytes] = asyncio.Queue()

        def readable() -> None:
            try:
                data = os.read(fd, 4096)
            except OSError:
                data = b""
            queue.put_nowait(data)
            if not data:
                loop.remove_reader(fd)

        try:
            loop.add_reader(fd, readable)
        except PermissionError:
            # A regular file or /dev/null (a closed stdin is plugged with it): epoll
            # refuses those, and they are always readable, so read them straight.
            await self._send_file(fd)
            return
        try:
            while not self.done.is_set():
                data = await queue.get()
                if not data or not await self._send(data):
                    return  # local stdin closed: keep showing output until the exit
        finally:
            loop.remove_reader(fd)

    async def _send_file(self, fd: int) -> None:
        while not self.done.is_set():
            try:
                data = os.read(fd, 4096)
            except OSError:
                return
            if not data or not await self._send(data):
                return

    async def _send(self, data: bytes) -> bool:
        """Type `data`; False once the process is gone."""
        try:
            update = await self.session.pty_write_stdin(self.process_id, data, until=ANY_OUTPUT)
        except (PtyProcessNotFoundError, ProcessExitedError):
            return False
        self.show(update)
        return True

    def resize_soon(self) -> None:
        rows, cols = _terminal_size()

        async def resize() -> None:
            with contextlib.suppress(
                UnsupportedOperationError, PtyProcessNotFoundError, ProcessExitedError
            ):
                await self.session.pty_resize(self.process_id, rows=rows, cols=cols)

        task = asyncio.ensure_future(resize())
        self.resizes.add(task)
        task.add_done_callback(self.resizes.discard)


async def attach_shell(args: argparse.Namespace, command: list[str]) -> int:
    """Run `command` (default `sh`) on a sandbox PTY attached to this terminal; return
    its exit code."""
    backend, options = cli_options.options_from_args(args)
    record = record_path(args.record)
    rows, cols = _terminal_size()
    stdin_fd = sys.stdin.fileno()
    loop = asyncio.get_running_loop()
    async with cli_session(backend, options, getattr(args, "session", None)) as session:
        with _raw_terminal(stdin_fd):
            # No screen: the user's own terminal renders the output.
            first = await session.pty_exec_start(
                *(command or [DEFAULT_SHELL]),
                tty=True,
                rows=rows,
                cols=cols,
                yield_time_s=0.25,
                screen=False,
                record=record,
            )
            if first.process_id is None:
                write_all(sys.stdout.buffer, first.output.encode("utf-8", "surrogateescape"))
                return first.exit_code if first.exit_code is not None else 1
            attachment = _Attachment(session, first.process_id)
            attachment.show(first)
            loop.add_signal_handler(signal.SIGWINCH, attachment.resize_soon)
            pumps = [
                asyncio.ensure_future(attachment.pump_output()),
                asyncio.ensure_future(attachment.pump_input(stdin_fd)),
            ]
            try:
                # The output pump ends when the process does; if either pump fails, the
                # error surfaces here instead of leaving the terminal attached forever.
                output_pump = pumps[0]
                while not output_pump.done():
                    finished, _ = await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
                    for pump in finished:
                        pump.result()  # raises the pump's error, if any
                output_pump.result()
            finally:
                loop.remove_signal_handler(signal.SIGWINCH)
                for pump in pumps:
                    pump.cancel()
                await asyncio.gather(*pumps, return_exceptions=True)
                await asyncio.gather(*attachment.resizes, return_exceptions=True)
    return attachment.exit_code if attachment.exit_code is not None else 1
