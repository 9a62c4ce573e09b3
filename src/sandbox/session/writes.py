"""`write_within`: keystrokes written within a window, never queued behind a full terminal;
`close_input`: the end of a pipe process's input, ordered after every write.

What the terminal takes at once goes in without a task (the handle's
`Process.try_write`); the rest is a write task of the entry's (`entry.write_task`, the
backend's `_write_stdin`), so a terminate, the close or an interrupt can end it at once,
and the window's end cancels it: the caller learns how many bytes were not written.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from ..process_entry import H, PtyEntry
from ..process_handle import Process
from ..settle import settle
from .ownership import finished


class EntryRemoved(Exception):
    """The entry was removed (terminated, pruned, the session closed) while its write or
    end of input ran; the caller says which, from the session's state (the cause, if
    any, is the backend's error)."""


async def write_within(
    entry: PtyEntry[H],
    data: bytes,
    window_end: float,
    *,
    write: Callable[[PtyEntry[H], bytes], Awaitable[None]],
) -> int:
    """Write `data` by the loop time `window_end`: what the entry's `Process` handle
    takes at once (`try_write`), then the rest with `write` (the `_write_stdin` hook);
    return how many bytes the terminal did not take. A write that fails because its
    entry was removed meanwhile raises `EntryRemoved` (from the write's error); a
    cancelled caller ends the write first."""
    entry.input_accepted = 0
    handle = entry.handle
    taken = handle.try_write(data) if isinstance(handle, Process) else 0
    if taken >= len(data):
        return 0  # the common case: the terminal had room, no task needed
    data = data[taken:]
    entry.input_accepted = taken
    task = asyncio.ensure_future(write(entry, data))
    entry.write_task = task
    try:
        timeout = max(0.0, window_end - asyncio.get_running_loop().time())
        done, _ = await asyncio.wait({task}, timeout=timeout)
        if not done:
            task.cancel()
            await asyncio.wait({task})
    except asyncio.CancelledError:
        task.cancel()
        await settle(finished(task))
        raise
    finally:
        if entry.write_task is task:
            entry.write_task = None
    if task.cancelled():
        accepted = entry.input_accepted - taken
    else:
        error = task.exception()
        if error is not None:
            if entry.removed:
                raise EntryRemoved from error
            raise error
        accepted = len(data)
    return len(data) - min(max(accepted, 0), len(data))


async def close_input(
    entry: PtyEntry[H],
    *,
    close: Callable[[PtyEntry[H]], Awaitable[None]],
) -> None:
    """End `entry`'s stdin with the backend's `_close_stdin`, run as the entry's write
    task: like a write, a terminate or the close cancels it and waits for it before the
    teardown, and a cancelled caller ends it first. The entry is marked `stdin_closed`
    only once the hook completed (a close cancelled half-way is asked again)."""
    task = asyncio.ensure_future(close(entry))
    entry.write_task = task
    try:
        await asyncio.wait({task})
    except asyncio.CancelledError:
        task.cancel()
        await settle(finished(task))
        raise
    finally:
        if entry.write_task is task:
            entry.write_task = None
    if task.cancelled():
        # Only a teardown cancels it (the caller's own cancellation raised above).
        raise EntryRemoved
    error = task.exception()
    if error is not None:
        if entry.removed:
            raise EntryRemoved from error
        raise error
    entry.stdin_closed = True
