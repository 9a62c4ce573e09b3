"""Raw baselines: the best a Python program can do on this machine without the library.

Each function drives the OS directly (openpty / pipes, non-blocking fds read with the
event loop's reader callbacks, waitpid) so our figures can be read as ratios.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import signal
import subprocess
from collections.abc import Sequence

from sandbox.local.process import set_window_size


def _tty_setup() -> None:  # runs in the child
    import fcntl
    import termios

    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


class RawChild:
    """A child on a raw PTY or pipe, read by an event-loop reader into a bytearray."""

    def __init__(self, argv: Sequence[str], *, tty: bool, keep: bool = True) -> None:
        self.loop = asyncio.get_running_loop()
        self.data = bytearray()
        self.count = 0
        self.keep = keep
        self.eof = asyncio.Event()
        self.wake: asyncio.Future[None] | None = None
        if tty:
            self.fd, child = os.openpty()
            set_window_size(child, 24, 80)
            self.proc = subprocess.Popen(
                list(argv),
                stdin=child,
                stdout=child,
                stderr=child,
                start_new_session=True,
                preexec_fn=_tty_setup,
            )
        else:
            self.fd, child = os.pipe()
            self.proc = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=child,
                stderr=child,
                start_new_session=True,
            )
        os.close(child)
        os.set_blocking(self.fd, False)
        self.loop.add_reader(self.fd, self._readable)

    def _readable(self) -> None:
        for _ in range(8):
            try:
                chunk = os.read(self.fd, 256 * 1024)
            except BlockingIOError:
                return
            except OSError as exc:
                if exc.errno != errno.EIO:
                    raise
                chunk = b""
            if not chunk:
                self.loop.remove_reader(self.fd)
                self.eof.set()
                return
            self.count += len(chunk)
            if self.keep:
                self.data += chunk
            if self.wake is not None and not self.wake.done():
                self.wake.set_result(None)

    async def read_until(self, needle: bytes) -> None:
        while needle not in self.data:
            self.wake = self.loop.create_future()
            await self.wake

    async def write(self, data: bytes) -> None:
        os.write(self.fd, data)

    async def finish(self) -> int:
        await self.eof.wait()
        return self.proc.wait()  # EOF means the child is exiting: this returns at once

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        with contextlib.suppress(ValueError):
            self.loop.remove_reader(self.fd)
        with contextlib.suppress(OSError):
            os.close(self.fd)
