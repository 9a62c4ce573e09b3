"""The two front-end packages, `sandbox.cli` and `sandbox.mcp`, import cleanly.

An import cycle shows only when one of its modules is the first imported in a fresh
interpreter (afterwards the others are already in `sys.modules`), so every module is
imported first in its own interpreter, and all of them in forward and reverse order.
Also: `sandbox.mcp` never shadows the `mcp` SDK, and both commands still answer `--help`.
"""

from __future__ import annotations

import os
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

import sandbox

_PACKAGE_DIR = Path(sandbox.__file__).parent
_SCRIPT = Path(sys.executable).with_name("sandbox")


def _modules(package: str) -> list[str]:
    # Listed from the files, not imported: a new module joins the tests by existing.
    path = _PACKAGE_DIR / package.removeprefix("sandbox.")
    names = [info.name for info in pkgutil.iter_modules([str(path)]) if info.name != "__main__"]
    return [package, *(f"{package}.{name}" for name in sorted(names))]


FRONT_END_MODULES = _modules("sandbox.cli") + _modules("sandbox.mcp")


def _python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )


def test_front_end_modules_are_found() -> None:
    assert {"sandbox.cli.terminal", "sandbox.cli.app", "sandbox.mcp.server"} <= set(
        FRONT_END_MODULES
    )


@pytest.mark.parametrize("module", FRONT_END_MODULES)
def test_module_imports_first_in_a_fresh_interpreter(module: str) -> None:
    result = _python(f"import {module}")
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("order", ["forward", "reverse"])
def test_every_front_end_module_imports_in_one_interpreter(order: str) -> None:
    modules = FRONT_END_MODULES if order == "forward" else FRONT_END_MODULES[::-1]
    result = _python("; ".join(f"import {module}" for module in modules))
    assert result.returncode == 0, result.stderr


def test_sandbox_mcp_does_not_shadow_the_mcp_sdk() -> None:
    code = (
        "import sys, sandbox.mcp.server as server, mcp, mcp.types\n"
        "assert mcp.__name__ == 'mcp', mcp.__name__\n"
        "assert 'site-packages' in mcp.__file__, mcp.__file__\n"
        "assert server.types is mcp.types\n"
        "assert sys.modules['mcp'] is mcp\n"
    )
    result = _python(code)
    assert result.returncode == 0, result.stderr


def test_front_end_packages_do_not_load_the_mcp_sdk() -> None:
    # `sandbox run/shell/...` must work without the `mcp` extra, and start without it.
    code = (
        "import sys, sandbox.cli, sandbox.mcp\n"
        "loaded = sorted(m for m in sys.modules if m == 'mcp' or m.startswith('mcp.'))\n"
        "assert not loaded, loaded\n"
        "assert 'sandbox.mcp.server' not in sys.modules\n"
    )
    result = _python(code)
    assert result.returncode == 0, result.stderr


def _command(*args: str) -> list[str]:
    if _SCRIPT.exists():
        return [str(_SCRIPT), *args]
    return [sys.executable, "-m", "sandbox.cli", *args]


@pytest.mark.parametrize(
    ("command", "expected"),
    [
        (_command("--help"), "usage: sandbox"),
        (_command("mcp", "--help"), "usage: sandbox mcp"),
        ([sys.executable, "-m", "sandbox.cli", "--help"], "usage: sandbox"),
        ([sys.executable, "-m", "sandbox.mcp", "--help"], "usage: sandbox mcp"),
        ([sys.executable, "-m", "sandbox.mcp.server", "--help"], "usage: sandbox mcp"),
    ],
    ids=["script", "script-mcp", "m-cli", "m-mcp", "m-mcp-server"],
)
def test_help_answers(command: list[str], expected: str) -> None:
    env = {**os.environ, "COLUMNS": "100"}
    result = subprocess.run(
        command, capture_output=True, text=True, timeout=60, check=False, env=env
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(expected), result.stdout
    assert result.stderr == ""
