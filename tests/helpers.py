"""Small helpers shared by the test modules (no mocks of our own code here).

The /proc reads are `sandbox.testing.procfs`, the gates `sandbox.testing.faults`, and
`eventually`/`unique_seconds`/`maybe_started` come from `sandbox.testing.conformance`:
these names are the short spellings the tests use.
"""

from __future__ import annotations

from typing import Any

import sandbox
from sandbox.testing import procfs
from sandbox.testing.conformance import eventually, maybe_started, unique_seconds
from sandbox.testing.faults import Gate, park_calls

__all__ = [
    "DeadlineCount",
    "HookGate",
    "PeakRss",
    "children_of_me",
    "describe_pids",
    "eventually",
    "host_pids_with_arg",
    "maybe_started",
    "open_fds",
    "unique_seconds",
]


def host_pids_with_arg(arg: str) -> list[int]:
    """Live (non-zombie) processes on this host whose argv contains `arg` exactly.

    Processes in containers and behind the fakes are on this kernel too, so this finds
    what any backend left behind.
    """
    return procfs.pids_with_arg(arg)


def describe_pids(pids: list[int]) -> str:
    """`pid state argv` for each pid (for assertion messages about leftover processes)."""
    return procfs.describe(pids)


def open_fds() -> int:
    """Number of fds this process has open."""
    return len(procfs.open_fds())


def children_of_me() -> set[int]:
    """Direct children of this test process, zombies included."""
    return procfs.children()


def runner_pid(session: Any) -> int:
    """The pid of the runner a session with the runner is connected to (its HELLO)."""
    runner = session._runner
    assert runner is not None and runner.client.hello is not None
    return int(runner.client.hello.pid)


def require_runner(what: str) -> None:
    """Skip (or, with SANDBOX_REQUIRE_ALL, fail) `what` where this install has no runner."""
    from sandbox.runner import unavailable_reason
    from tests.conftest import skip_or_fail

    reason = unavailable_reason()
    if reason:
        skip_or_fail(f"{what}: {reason}")


def HookGate(session: sandbox.BaseSandboxSession, hook: str, *, after: bool = False) -> Gate:
    """Park every call of one backend hook of one session (`sandbox.testing.faults.
    park_calls`): `reached` is set when a call arrives; with `after=True` the real hook
    runs first and the call parks before returning (what it made exists; its caller
    does not know yet); `release()` lets them through, `fail(exc)` makes them raise.

    A deterministic interleaving point for races the base session must win (a close
    against a start, a spawn or an exec): the real hook still does all the work.
    `hook` is a hook of the session (`"_spawn_process"`) or a method of one of its
    capability objects (`"durability.resume"`): the session calls both at each use.
    """
    if "." in hook:
        capability, method = hook.split(".")
        return park_calls(getattr(session._core.capabilities, capability), method, after=after)
    return park_calls(session, hook, after=after)


class DeadlineCount:
    """Counts the windows of one session that ran to their deadline.

    The deadline is the only way a window reaches the backend's `_final_drain` hook, so
    this wraps that hook on the session (the real one still runs): a test that expects
    `until`, `until_screen`, an exit or a preemption to end its windows asserts
    `count == 0` afterwards, with no clock read. `close()` puts the hook back.
    """

    def __init__(self, session: sandbox.BaseSandboxSession) -> None:
        self.count = 0
        self._session = session
        self._previous = vars(session).get("_final_drain")
        real = session._final_drain

        async def counted(entry: Any) -> None:
            self.count += 1
            await real(entry)

        session._final_drain = counted  # type: ignore[method-assign]

    def close(self) -> None:
        """Stop counting: the session's own hook again."""
        if self._previous is None:
            del self._session._final_drain
        else:
            self._session._final_drain = self._previous  # type: ignore[method-assign]


class PeakRss:
    """The growth of this process's RSS while a stream of bytes passes through it: a
    test feeds it each chunk's size (`passed`) and reads `growth` (bytes) at the end.

    RSS is read once per `every` bytes, not once per chunk: a read of smaps_rollup costs
    milliseconds, and once per chunk of a 400 MiB stream the reads took longer than the
    stream. What a stream keeps stays resident, so a look per MiB still sees it grow.
    """

    def __init__(self, every: int = 1 << 20) -> None:
        self.before = self.peak = procfs.rss_bytes()
        self._every = every
        self._seen = 0
        self._next = every

    def passed(self, size: int) -> None:
        """`size` more bytes went through; RSS is read when another `every` did."""
        self._seen += size
        if self._seen >= self._next:
            self._next = self._seen + self._every
            self.peak = max(self.peak, procfs.rss_bytes())

    @property
    def growth(self) -> int:
        """The peak RSS seen (the last look included) minus the RSS at the start."""
        self.peak = max(self.peak, procfs.rss_bytes())
        return self.peak - self.before
