"""Fixtures for the per-backend tests."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True)
def _collect_garbage_after() -> Iterator[None]:
    """Collect after each test, so that a socket or transport a test left to the garbage
    collector fails that test (strict pytest: its ResourceWarning is an error), not
    whichever test happens to run the next collection."""
    yield
    gc.collect()
