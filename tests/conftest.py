"""Shared fixtures: the cross-backend `session` fixture and leak checks."""

from __future__ import annotations

import importlib
import os
import pkgutil
from collections.abc import AsyncIterator
from pathlib import Path
from types import ModuleType

import pytest

import sandbox
from tests import backend_fixtures


def _fixture_modules() -> list[ModuleType]:
    wanted = {n for n in os.environ.get("SANDBOX_CONFORMANCE_BACKENDS", "").split(",") if n}
    modules = []
    for info in sorted(pkgutil.iter_modules(backend_fixtures.__path__), key=lambda i: i.name):
        module = importlib.import_module(f"tests.backend_fixtures.{info.name}")
        if wanted and module.NAME not in wanted:
            continue
        modules.append(module)
    return modules


BACKEND_MODULES = _fixture_modules()


def skip_or_fail(reason: str) -> None:
    """Skip with `reason`, unless CI demands every backend (then fail)."""
    if os.environ.get("SANDBOX_REQUIRE_ALL") == "1":
        pytest.fail(f"SANDBOX_REQUIRE_ALL=1 but: {reason}")
    pytest.skip(reason)


@pytest.fixture(params=BACKEND_MODULES, ids=lambda m: m.NAME)
def backend(request: pytest.FixtureRequest) -> ModuleType:
    """The backend fixture module under test (skips, or fails in CI, when unusable)."""
    module: ModuleType = request.param
    reason = module.skip_reason()
    if reason:
        skip_or_fail(f"{module.NAME}: {reason}")
    return module


@pytest.fixture
async def session(backend: ModuleType, tmp_path: Path) -> AsyncIterator[sandbox.BaseSandboxSession]:
    """A started session of each backend in turn, closed after the test."""
    async with backend.session(tmp_path) as s:
        yield s
