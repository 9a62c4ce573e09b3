"""Shared fixtures: the backends of tests/backend_fixtures/ and the cross-backend
`session` fixture (what `sandbox.testing.conformance`'s suite runs on in-tree)."""

from __future__ import annotations

import importlib
import os
import pkgutil
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

import sandbox
from sandbox.testing import conformance
from tests import backend_fixtures


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
