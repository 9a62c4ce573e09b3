"""Small helpers shared by the test modules (no mocks of our own code here)."""

from __future__ import annotations

import asyncio
import os
import secrets
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import sandbox


def unique_seconds() -> str:
    """A `sleep` argument unlikely to be used by anything else on the machine, so the
    processes of one test can be found in /proc by their command line."""
    return str(600_000 + secrets.randbelow(300_000))


def host_pids_with_arg(arg: str) -> list[int]:
    """Live (non-zombie) processes on this host whose argv contains `arg` exactly.

    Processes in containers and behind the fakes are on this kernel too, so this finds
    what any backend left behind.
    """
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as handle:
                argv = handle.read().split(b"\0")
            with open(f"/proc/{name}/stat", "rb") as handle:
                state = handle.read().rsplit(b")", 1)[1].split()[0]
        except OSError:
            continue
        if state != b"Z" and arg.encode() in argv:
            found.append(int(name))
    return found


async def eventually(predicate: Callable[[], bool], timeout: float = 5.0) -> bool:
    """Poll `predicate` until it holds (for state only observable by looking, such as a
    process table); returns its final value."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.01)
    return True


def describe_pids(pids: list[int]) -> str:
    """`pid state argv` for each pid (for assertion messages about leftover processes)."""
    lines = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as handle:
                argv = handle.read().replace(b"\0", b" ").decode(errors="replace").strip()
            with open(f"/proc/{pid}/stat", "rb") as handle:
                state = handle.read().rsplit(b")", 1)[1].split()[0].decode()
        except OSError:
            argv, state = "(gone)", "-"
        lines.append(f"{pid} {state} {argv}")
    return "\n".join(lines) or "(none)"


def open_fds() -> int:
    """Number of fds this process has open."""
    return len(os.listdir("/proc/self/fd"))


def children_of_me() -> set[int]:
    """Direct children of this test process, zombies included."""
    me = str(os.getpid())
    kids = set()
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat", "rb") as handle:
                    fields = handle.read().rsplit(b")", 1)[1].split()
            except OSError:
                continue
            if fields[1].decode() == me:
                kids.add(int(name))
    return kids


@asynccontextmanager
async def maybe_started(
    session: sandbox.BaseSandboxSession, start: bool
) -> AsyncIterator[sandbox.BaseSandboxSession]:
    """`async with session` when `start`; else hand it over unstarted and close it at
    the end (a test that races its start and close owns the starting)."""
    if start:
        async with session:
            yield session
        return
    try:
        yield session
    finally:
        await session.aclose()


class HookGate:
    """Parks every call of one backend hook of one session until released: `reached` is
    set when a call arrives. With `after=True` the real hook runs first and the call
    parks before returning (what it made exists; its caller does not know yet).

    A deterministic interleaving point for races the base session must win (a close
    against a start, a spawn or an exec): the real hook still does all the work.
    """

    def __init__(self, session: sandbox.BaseSandboxSession, hook: str, *, after: bool = False):
        self.reached = asyncio.Event()
        self._released = asyncio.Event()
        original = getattr(session, hook)

        async def gated(*args: object, **kwargs: object) -> object:
            if not after:
                self.reached.set()
                await self._released.wait()
            result = await original(*args, **kwargs)
            if after:
                self.reached.set()
                await self._released.wait()
            return result

        setattr(session, hook, gated)

    def release(self) -> None:
        """Let parked and later calls through."""
        self._released.set()
