"""The fixtures the suite's tests use, built on the `conformance_backend` a user defines,
and the two looks into the session's bookkeeping the ownership rules need."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from sandbox import BaseSandboxSession
from sandbox.errors import SandboxError

from . import Backend, ProcessLister


@pytest.fixture(name="backend_under_test")
def backend_under_test_fixture(conformance_backend: Backend) -> Backend:
    """The user's `conformance_backend`, skipped when it says it cannot run here."""
    reason = conformance_backend.skip_reason()
    if reason:
        pytest.skip(f"{conformance_backend.name}: {reason}")
    return conformance_backend


@pytest_asyncio.fixture(name="session")
async def session_fixture(
    backend_under_test: Backend, tmp_path: Path, request: pytest.FixtureRequest
) -> AsyncIterator[BaseSandboxSession]:
    """A started session of the backend under test, closed (and leak-checked by the
    backend's own factory) after the test; skips a test needing what it lacks."""
    needed: frozenset[str] = getattr(request.function, "conformance_needs", frozenset())
    missing = needed - set(backend_under_test.capabilities)
    if missing:
        pytest.skip(f"{backend_under_test.name} lacks {', '.join(sorted(missing))}")
    async with backend_under_test.session(tmp_path) as s:
        yield s


@pytest.fixture(name="processes_with_arg")
def processes_with_arg_fixture(backend_under_test: Backend) -> ProcessLister:
    """The backend's process lister; without one, a lister that finds nothing (the
    looks for leftovers then pass, and tests that must see a process skip)."""
    lister = backend_under_test.processes_with_arg
    if lister is None:
        return lambda arg: []
    return lister


def need_process_lister(backend: Backend) -> None:
    """Skip a test that must see processes when the backend cannot list them."""
    if backend.processes_with_arg is None:
        pytest.skip(f"{backend.name} has no process lister")


# The ownership rules are about the session's own bookkeeping, which the public API
# shows only in part; these two looks are the suite's only reach past it.


def reserved_ids(session: BaseSandboxSession) -> set[int]:
    """The process ids the session holds (registered, or reserved by a start)."""
    return session._core.processes.reserved


def call_in_progress(session: BaseSandboxSession, process_id: int) -> bool:
    """Whether a write or poll of `process_id` holds its call lock now."""
    try:
        entry = session._core.processes.lookup(process_id)
    except SandboxError:
        return False
    return entry.call_lock.locked()


def mark_async_tests(namespace: dict[str, Any]) -> None:
    """Put pytest-asyncio's mark on every async test in `namespace`, so the suite runs
    in its strict mode too (in auto mode the mark changes nothing)."""
    for name, value in list(namespace.items()):
        if name.startswith("test_") and inspect.iscoroutinefunction(value):
            namespace[name] = pytest.mark.asyncio(value)


async def cancel_after(coro: Any, steps: int) -> BaseException | object:
    """Run `coro` as a task, cancel it after `steps` turns of the loop, and return its
    result or the exception it ended with."""
    task = asyncio.ensure_future(coro)
    for _ in range(steps):
        if task.done():
            break
        await asyncio.sleep(0)
    task.cancel()
    try:
        result: object = await task
    except BaseException as exc:
        return exc
    return result
