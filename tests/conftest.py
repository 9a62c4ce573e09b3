"""Shared fixtures: the backends of tests/backend_fixtures/ and the cross-backend
`session` fixture (what `sandbox.testing.conformance`'s suite runs on in-tree); and
what lets the suite run in parallel (`make test`: pytest-xdist, docs/testing.md).

Parallel workers are separate processes. What they could share is kept apart here or
in the tests themselves: each has its own private state folder (`SANDBOX_STATE_DIR`:
the ref key and the leases), its own shared docker container (labelled with its own
pid: tests/backend_fixtures/docker.py), its own temporary folders (`tmp_path`), and
the leak checks look only for processes with an argument of their own
(`unique_seconds`). Tests that cannot be kept apart carry
`@pytest.mark.xdist_group(...)` with a comment saying why; `--dist loadgroup` runs a
group's tests on one worker, one after the other.
"""

from __future__ import annotations

import gc
import importlib
import os
import pkgutil
import shutil
import signal
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

import sandbox
from sandbox.testing import conformance
from tests import backend_fixtures

# The state folder this suite made (so that a worker tells it from the caller's own).
_STATE_MADE = "SANDBOX_TEST_STATE_DIR_MADE"


def pytest_configure(config: pytest.Config) -> None:
    """A private state folder for this test process (each xdist worker is one), unless
    the caller chose one; and the `xdist_group` marker, known with or without xdist."""
    config.addinivalue_line(
        "markers", "xdist_group(name): run on one worker with the other tests of the group"
    )
    # An ignored signal is inherited by every child, and a shell cannot trap it: a run
    # started in the background of a script (`cmd &` ignores INT and QUIT) or under
    # `nohup` (HUP) would see the sandboxed shells live through the signals the tests
    # send them. Whatever started the run, the tests' children start with the defaults.
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    for number in (signal.SIGQUIT, signal.SIGHUP):
        if signal.getsignal(number) == signal.SIG_IGN:
            signal.signal(number, signal.SIG_DFL)
    # A local runner daemon (unix_local runner=True, `sandbox open`) stays for other
    # sessions after its last client; in the suite it ends half a minute after that, not
    # an hour (its orphan timeout), so no test leaves one behind for long.
    os.environ.setdefault("SANDBOX_RUNNER_ORPHAN_TIMEOUT_S", "30")
    chosen = os.environ.get("SANDBOX_STATE_DIR")
    # A worker inherits the folder its controller made for itself: not a choice.
    if chosen and chosen != os.environ.get(_STATE_MADE):
        return
    # The suite never touches the user's own ref key and leases, and two workers never
    # see each other's leases (a test that lists or breaks one sees only its own).
    # mkdtemp makes the folder 0700, as `sandbox.durable.seal` requires.
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    folder = tempfile.mkdtemp(prefix=f"sandbox-test-state-{worker}-")
    os.environ["SANDBOX_STATE_DIR"] = os.environ[_STATE_MADE] = folder
    config.add_cleanup(lambda: shutil.rmtree(folder, ignore_errors=True))


def pytest_collection_finish(session: pytest.Session) -> None:
    """Freeze what imports and collection made: the garbage collector never scans it again.

    The SDKs, the stand-ins and the test modules are some 350,000 objects; a full
    collection walked them all in about a second, and tests/backends/conftest.py collects
    after every test (so that a leaked socket fails the test that leaked it): most of
    those tests' time went there. What a test makes is made after this freeze, so it is
    still collected, and its leaks still fail it.
    """
    gc.collect()
    gc.freeze()


def _fixture_backends() -> list[conformance.Backend]:
    wanted = {n for n in os.environ.get("SANDBOX_CONFORMANCE_BACKENDS", "").split(",") if n}
    backends = []
    for info in sorted(pkgutil.iter_modules(backend_fixtures.__path__), key=lambda i: i.name):
        module = importlib.import_module(f"tests.backend_fixtures.{info.name}")
        backend: conformance.Backend = module.BACKEND
        if wanted and backend.name not in wanted:
            continue
        backends.append(backend)
    return backends


BACKENDS = _fixture_backends()


def skip_or_fail(reason: str) -> None:
    """Skip with `reason`, unless CI demands every backend (then fail)."""
    if os.environ.get("SANDBOX_REQUIRE_ALL") == "1":
        pytest.fail(f"SANDBOX_REQUIRE_ALL=1 but: {reason}")
    pytest.skip(reason)


@pytest.fixture(params=BACKENDS, ids=lambda b: b.name)
def backend(request: pytest.FixtureRequest) -> conformance.Backend:
    """The backend under test (skips, or fails in CI, when unusable)."""
    backend: conformance.Backend = request.param
    reason = backend.skip_reason()
    if reason:
        skip_or_fail(f"{backend.name}: {reason}")
    return backend


@pytest.fixture
def conformance_backend(backend: conformance.Backend) -> conformance.Backend:
    """What `sandbox.testing.conformance`'s suite runs on: each in-tree backend in turn."""
    return backend


@pytest.fixture
async def session(
    backend: conformance.Backend, tmp_path: Path
) -> AsyncIterator[sandbox.BaseSandboxSession]:
    """A started session of each backend in turn, closed after the test."""
    async with backend.session(tmp_path) as s:
        yield s
