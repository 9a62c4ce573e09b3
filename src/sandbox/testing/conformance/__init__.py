"""The cross-backend conformance suite, as a checker a backend runs against itself.

Every in-tree backend passes these tests, and so must yours: they are the contract of
docs/contract.md (one-shot exec, files, processes on terminals and pipes, windows and
`until`, bounded output, the errors of what cannot start, cancellation at every step,
one owner for every resource when a close races a creation), written once against the
public API. They are pytest tests: each needs a fresh session, many are parametrized,
and a report that names every failing rule is worth more than a first AssertionError.
You need pytest and pytest-asyncio (`asyncio_mode = "auto"`, or the marks this package
puts on each test).

Use it in three steps, in one test module of yours::

    import pytest
    from contextlib import asynccontextmanager

    from sandbox.testing import conformance
    from sandbox.testing.conformance.ownership import *  # noqa: F403 (the tests)
    from sandbox.testing.conformance.suite import *  # noqa: F403

    @asynccontextmanager
    async def my_environment(tmp_path):
        # Whatever your backend needs around a session (a server, a fake provider)...
        yield MySession(workdir=str(tmp_path / "ws"))  # NOT started: the suite starts it
        # ...and, once the suite closed the session, your own leak checks.

    @pytest.fixture
    def conformance_backend() -> conformance.Backend:
        return conformance.Backend(
            name="mine",
            session=conformance.fixture_session(my_environment),
            capabilities={"files", "resize", "signals"},
        )

The star imports bring the test functions and their fixtures (`session`,
`processes`) into your module, where pytest collects them; `conformance_backend` is the
one fixture you write. Parametrize it to run the suite over several configurations.

What the suite assumes, and how to say otherwise (`Backend`'s fields):

- the commands run by a POSIX `sh` with coreutils-like tools (`sleep`, `seq`, `printf`,
  `stty`, `mkfifo`), in a working directory that starts empty for each session;
- `capabilities`: `"files"` (the file calls work: tests that need them skip without
  it), `"resize"` (`pty_resize` works; without it the suite expects
  `UnsupportedOperationError`), `"signals"` (a death by signal N reports 128+N),
  `"open_stdin"` (`pty_exec_start(stdin=True)` and `pty_close_stdin` work; without it
  the suite expects `stdin=True` to be refused at start with `UnsupportedOperationError`);
- `processes_with_arg`: how to find the live processes whose argv holds an argument,
  to check that nothing outlived a timeout, a terminate or a close. The default reads
  this host's /proc (right for local processes, containers and stand-ins on this
  kernel); a remote backend passes its own lister, or None to skip those looks;
- `waits_for_processes`: True when closing returns only once the processes are gone
  (local backends), so leftovers are checked at once rather than within moments;
- `exec_output_at_end`: True when the provider hands over a one-shot command's output
  only once it ended (`exec_stream` then delivers it all at the end): the check that
  output arrives while the command runs is skipped.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import AsyncIterator, Callable, Collection, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, TypeVar

from sandbox import BaseSandboxSession

from .. import procfs

__all__ = [
    "CAPABILITIES",
    "Backend",
    "Environment",
    "ProcessLister",
    "SessionFactory",
    "eventually",
    "fixture_session",
    "maybe_started",
    "needs",
    "unique_seconds",
]

# What a backend may declare it supports (see `Backend.capabilities`).
CAPABILITIES = frozenset({"files", "open_stdin", "resize", "signals"})

# How a backend lists its live processes whose argv holds an argument (`processes_with_arg`),
# and what `fixture_session` takes: a folder -> an async context manager yielding an
# unstarted session, whose exit runs the backend's own leak checks.
ProcessLister = Callable[[str], Sequence[object]]
Environment = Callable[[Path], AbstractAsyncContextManager[BaseSandboxSession]]


class SessionFactory(Protocol):
    """`factory(tmp_path, start=True)`: an async context manager yielding a session
    (started unless `start=False`, when the test starts it), closed and checked for
    leaks on exit."""

    def __call__(
        self, tmp_path: Path, *, start: bool = True
    ) -> AbstractAsyncContextManager[BaseSandboxSession]: ...


@dataclass(frozen=True)
class Backend:
    """A backend under test: its name, how to open a session, what it supports.

    `skip_reason` says why it cannot run here (None: it can); the other fields are
    described in the package docstring.
    """

    name: str
    session: SessionFactory
    capabilities: Collection[str] = CAPABILITIES
    skip_reason: Callable[[], str | None] = lambda: None
    processes_with_arg: ProcessLister | None = procfs.pids_with_arg
    waits_for_processes: bool = False
    exec_output_at_end: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "capabilities", frozenset(self.capabilities))
        unknown = set(self.capabilities) - CAPABILITIES
        if unknown:
            known = ", ".join(sorted(CAPABILITIES))
            raise ValueError(f"unknown capabilities {sorted(unknown)}; known: {known}")


def fixture_session(environment: Environment) -> SessionFactory:
    """The session factory of a `Backend`, from the backend-specific part.

    `environment(tmp_path)` is an async context manager that sets up what the backend
    needs (a server, a fake provider), yields an UNSTARTED session, and after the
    yield (the session is closed by then) runs its own leak checks and tears down. The
    factory starts the session when asked, closes it, and lets the checks run.
    """

    @asynccontextmanager
    async def session(tmp_path: Path, *, start: bool = True) -> AsyncIterator[BaseSandboxSession]:
        async with environment(tmp_path) as s, maybe_started(s, start):
            yield s

    return session


_Session = TypeVar("_Session", bound=BaseSandboxSession)


@asynccontextmanager
async def maybe_started(session: _Session, start: bool) -> AsyncIterator[_Session]:
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


def needs(*capabilities: str) -> Callable[[_F], _F]:
    """Mark a conformance test as needing `capabilities`: the suite's `session` fixture
    skips it for a backend that lacks one."""
    unknown = set(capabilities) - CAPABILITIES
    if unknown:
        raise ValueError(f"unknown capabilities {sorted(unknown)}")

    def mark(test: _F) -> _F:
        test.conformance_needs = frozenset(capabilities)  # type: ignore[attr-defined]
        return test

    return mark


_F = TypeVar("_F", bound=Callable[..., object])


def unique_seconds() -> str:
    """A `sleep` argument unlikely to be used by anything else on the machine, so the
    processes of one test can be found by their command line."""
    return str(600_000 + secrets.randbelow(300_000))


async def eventually(predicate: Callable[[], bool], timeout: float = 15.0) -> bool:
    """Poll `predicate` until it holds (for state only observable by looking, such as a
    process table); returns its final value. The timeout is only a ceiling (a passing
    check returns as soon as it holds): 15 s, as a kill script's exec plus the kill's
    grace on a loaded two-core machine took more than 5."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.01)
    return True
