"""`ReadinessHub`: the readers of many fds behind one registration with the event loop.

An `add_reader` and its `remove_reader` cost a local start about 20 us on asyncio's
selector loop (its bookkeeping is Python: a key lookup that raises, a transport check,
a handle), and a start makes three pairs (its output, its pidfd). A hub keeps an epoll
set of its own, registered once with the loop: adding or removing an fd is one
`epoll_ctl`. When the loop sees the hub's epoll readable, the hub polls its set without
waiting and calls back the fds that are ready. Level-triggered, like the loop: an fd a
callback leaves unread is reported again at the loop's next turn. A callback's error
goes to the loop's exception handler, as a reader's would, and the others still run.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import select
from collections.abc import Callable
from typing import Protocol


class Readers(Protocol):
    """What `LocalProcess` reads through: the event loop itself, or a `ReadinessHub`."""

    def add_reader(self, fd: int, callback: Callable[..., object], *args: object) -> None:
        """Call `callback(*args)` whenever `fd` is readable, until `remove_reader(fd)`."""

    def remove_reader(self, fd: int) -> bool:
        """Stop watching `fd`; whether it was watched."""


class ReadinessHub:
    """Readers of many fds on one epoll set, which the event loop watches as one fd."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._epoll = select.epoll()
        self._callbacks: dict[int, Callable[[], object]] = {}
        self._closed = False
        try:
            loop.add_reader(self._epoll.fileno(), self._dispatch)
        except BaseException:
            self._epoll.close()
            raise

    def add_reader(self, fd: int, callback: Callable[..., object], *args: object) -> None:
        """Call `callback(*args)` whenever `fd` is readable (or hung up), until
        `remove_reader(fd)`; a second call for one fd replaces its callback."""
        if self._closed:
            raise RuntimeError("the readiness hub is closed")
        handler = functools.partial(callback, *args) if args else callback
        if fd in self._callbacks:
            self._callbacks[fd] = handler
            return
        self._epoll.register(fd, select.EPOLLIN)
        self._callbacks[fd] = handler

    def remove_reader(self, fd: int) -> bool:
        """Stop watching `fd` (before it is closed: its number may be reused at once)."""
        if self._callbacks.pop(fd, None) is None:
            return False
        with contextlib.suppress(OSError):  # already closed: the kernel dropped it
            self._epoll.unregister(fd)
        return True

    def _dispatch(self) -> None:
        try:
            ready = self._epoll.poll(0)
        except InterruptedError:
            return
        for fd, _events in ready:
            # Looked up per event: an earlier callback may have removed this fd (a
            # number reused meanwhile gets a spurious call, which a non-blocking read
            # or a WNOHANG wait answers with nothing).
            handler = self._callbacks.get(fd)
            if handler is None:
                continue
            try:
                handler()
            except (SystemExit, KeyboardInterrupt):
                raise
            except BaseException as exc:
                self._loop.call_exception_handler(
                    {"message": f"exception in the reader of fd {fd}", "exception": exc}
                )

    def close(self) -> None:
        """Stop watching everything and close the epoll set. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._callbacks.clear()
        with contextlib.suppress(RuntimeError):  # the loop is closed: nothing watches
            self._loop.remove_reader(self._epoll.fileno())
        self._epoll.close()
