"""What a provider's file API does with a FIFO or a device: it opens it and waits for
the other end forever. The stand-ins in `sandbox.testing` do the same, without holding
a thread (the caller's timeout or cancellation ends the wait)."""

from __future__ import annotations

import asyncio
import os
import stat


async def wait_forever_on_special_file(path: str) -> None:
    """Return at once for a regular file, a directory or nothing at `path`; never return
    (until cancelled) for anything else, as the real server's blocking open would."""
    try:
        mode = (await asyncio.to_thread(os.stat, path)).st_mode
    except OSError:
        return
    if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
        await asyncio.Event().wait()


__all__ = [
    "wait_forever_on_special_file",
]
