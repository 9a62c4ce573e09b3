"""Small helpers shared by the test modules (no mocks of our own code here)."""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import sandbox
from sandbox.testing import procfs
from sandbox.testing.faults import Gate, park_calls


def unique_seconds() -> str:
    """A `sleep` argument unlikely to be used by anything else on the machine, so the
    processes of one test can be found in /proc by their command line."""
    return str(600_000 + secrets.randbelow(300_000))


def host_pids_with_arg(arg: str) -> list[int]:
    """Live (non-zombie) processes on this host whose argv contains `arg` exactly.

    Processes in containers and behind the fakes are on this kernel too, so this finds
    what any backend left behind.
    """
    return procfs.pids_with_arg(arg)


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
    return procfs.describe(pids)


def open_fds() -> int:
    """Number of fds this process has open."""
    return len(procfs.open_fds())


def children_of_me() -> set[int]:
    """Direct children of this test process, zombies included."""
    return procfs.children()


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


def HookGate(session: sandbox.BaseSandboxSession, hook: str, *, after: bool = False) -> Gate:
    """Park every call of one backend hook of one session (`sandbox.testing.faults.
    park_calls`): `reached` is set when a call arrives; with `after=True` the real hook
    runs first and the call parks before returning (what it made exists; its caller
    does not know yet); `release()` lets them through, `fail(exc)` makes them raise.

    A deterministic interleaving point for races the base session must win (a close
    against a start, a spawn or an exec): the real hook still does all the work.
    """
    return park_calls(session, hook, after=after)
