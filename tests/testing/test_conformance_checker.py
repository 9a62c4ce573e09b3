"""`sandbox.testing.conformance` as an out-of-tree author uses it.

The example backend of docs/architecture.md (`HereSession`, written against
`sandbox.backend` only) is run through the whole suite by a pytest of its own, in a
directory outside this repository with a test module written the way the package
docstring says; then a broken copy of it must fail exactly where it is broken.
"""

from __future__ import annotations

import re
import subprocess
import sys
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

import sandbox
from sandbox.testing import conformance
from tests.meta.test_docs import _example_backend

ROOT = Path(__file__).resolve().parents[2]

AUTHOR_TESTS = """
from contextlib import asynccontextmanager

import pytest

from here_backend import HereSession
from sandbox.testing import conformance
from sandbox.testing.conformance.ownership import *  # noqa: F403
from sandbox.testing.conformance.suite import *  # noqa: F403

{extra}


@asynccontextmanager
async def here(tmp_path):
    yield {session_class}(workdir=str(tmp_path / "ws"))


@pytest.fixture
def conformance_backend():
    return conformance.Backend(
        name="here",
        session=conformance.fixture_session(here),
        capabilities={{"resize", "signals"}},
    )
"""

# A copy of the example that claims `resize` but ignores it.
BROKEN = """
class NoResize(HereSession):
    async def _resize(self, entry, rows, cols):
        pass
"""


def _run_author_suite(tmp_path: Path, *args: str, extra: str = "", cls: str = "HereSession") -> str:
    (tmp_path / "here_backend.py").write_text(_example_backend())
    (tmp_path / "test_here.py").write_text(AUTHOR_TESTS.format(extra=extra, session_class=cls))
    # Strict asyncio mode (pytest-asyncio's default): the suite marks its own tests.
    (tmp_path / "pytest.ini").write_text(
        "[pytest]\nasyncio_mode = strict\nasyncio_default_fixture_loop_scope = function\n"
    )
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rfs", "-p", "no:cacheprovider", *args],
        cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": f"{ROOT / 'src'}:{tmp_path}"},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    return f"rc={result.returncode}\n{result.stdout}\n{result.stderr}"


def test_the_example_backend_passes_the_whole_suite(tmp_path: Path) -> None:
    report = _run_author_suite(tmp_path, "test_here.py")
    assert report.startswith("rc=0\n"), report
    summary = re.search(r"(\d+) passed, (\d+) skipped", report)
    assert summary, report
    passed, skipped = int(summary[1]), int(summary[2])
    assert passed >= 60, report
    # The example has no file calls: exactly the tests needing them skip, and say why.
    skips = re.findall(r"SKIPPED \[\d+\] .*", report)
    assert sum(int(re.search(r"\[(\d+)\]", s)[1]) for s in skips) == skipped  # type: ignore[index]
    assert skips and all(s.endswith("here lacks files") for s in skips), skips


def test_the_checker_fails_a_backend_where_it_breaks_the_contract(tmp_path: Path) -> None:
    report = _run_author_suite(tmp_path, "test_here.py", "-k", "size", extra=BROKEN, cls="NoResize")
    assert report.startswith("rc=1\n"), report
    assert re.findall(r"FAILED \S+", report) == ["FAILED test_here.py::test_resize_is_seen_by_stty"]
    assert re.search(r"1 failed, 1 passed", report), report  # the initial size still works


def test_backend_refuses_unknown_capabilities() -> None:
    factory = conformance.fixture_session(_unix_local)
    with pytest.raises(ValueError, match=r"unknown capabilities \['resise'\]; known: files"):
        conformance.Backend(name="x", session=factory, capabilities={"resise"})
    with pytest.raises(ValueError, match="unknown capabilities"):
        conformance.needs("file")
    assert set(conformance.Backend(name="x", session=factory).capabilities) == {
        "files",
        "open_stdin",
        "resize",
        "signals",
    }


@asynccontextmanager
async def _unix_local(tmp_path: Path) -> Any:
    session = sandbox.open_session("unix_local", workdir=tmp_path / "ws")
    yield session
    assert session.state is sandbox.SessionState.CLOSED  # the factory closed it first


async def test_fixture_session_starts_or_hands_over_and_always_closes(tmp_path: Path) -> None:
    factory = conformance.fixture_session(_unix_local)
    async with factory(tmp_path / "a") as started:
        assert started.state is sandbox.SessionState.RUNNING
        assert (await started.exec("echo up")).stdout == b"up\n"
    async with factory(tmp_path / "b", start=False) as fresh:
        assert fresh.state is sandbox.SessionState.NEW
        await fresh.start()
    assert fresh.state is sandbox.SessionState.CLOSED
    with pytest.raises(RuntimeError, match="boom"):
        async with factory(tmp_path / "c") as failing:
            raise RuntimeError("boom")
    assert failing.state is sandbox.SessionState.CLOSED
