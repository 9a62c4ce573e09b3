"""Which start path a process selects: the C extension `sandbox._native._spawn` (built
at install time) when it is there, the pure-Python `Popen` path when
`SANDBOX_NO_EXTENSIONS` is set or the import fails, with the same results either way.

Each case runs in a fresh interpreter: the choice is made once, when
`sandbox.local.spawn_helper` is imported. The extension's `spawn` is wrapped there by a
counter that calls it (the real start runs), so the test sees which path started the
processes.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

from tests.conftest import skip_or_fail

BUILT = importlib.util.find_spec("sandbox._native._spawn") is not None


@pytest.fixture
def built() -> None:
    """Skips where the install did not build the extension (fails in CI, which builds it)."""
    if not BUILT:
        skip_or_fail("the extension was not built at install time (no C compiler?)")


SCRIPT = """
import asyncio, json, os, sys

calls = []
if sys.argv[1] == "import-fails":
    sys.modules["sandbox._native._spawn"] = None  # the next import raises ImportError
else:
    try:
        from sandbox._native import _spawn
    except ImportError:
        pass
    else:
        real = _spawn.spawn
        def counted(*args):
            calls.append(1)
            return real(*args)
        _spawn.spawn = counted

import sandbox
from sandbox.local import spawn_helper

async def main():
    async with sandbox.open_session("unix_local") as session:
        pty = await session.pty_exec_start(
            "test -t 0 && echo tty; printf '%s|' \\"$0\\" \\"$SANDBOX_NATIVE_PROBE\\"",
            tty=True, yield_time_s=5, env={"SANDBOX_NATIVE_PROBE": "é x"},
        )
        piped = await session.exec("echo out; echo err >&2; exit 3")
        return pty, piped

pty, piped = asyncio.run(main())
print(json.dumps({
    "helper": spawn_helper.loaded() is not None,
    "reason": spawn_helper.reason(),
    "calls": len(calls),
    "pty": [pty.output, pty.exit_code],
    "piped": [piped.stdout.decode(), piped.stderr.decode(), piped.exit_code],
}))
"""

SAME_RESULTS = {
    "pty": ["tty\r\nsh|é x|", 0],
    "piped": ["out\n", "err\n", 3],
}


def _run(mode: str, switch: str | None) -> dict[str, object]:
    env = {key: value for key, value in os.environ.items() if key != "SANDBOX_NO_EXTENSIONS"}
    if switch is not None:
        env["SANDBOX_NO_EXTENSIONS"] = switch
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, mode],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert out.returncode == 0, out.stderr
    report: dict[str, object] = json.loads(out.stdout)
    for key, expected in SAME_RESULTS.items():
        assert report[key] == expected, (key, report)
    return report


@pytest.mark.parametrize("switch", [None, "", "0"])
def test_the_built_extension_starts_every_process(built: None, switch: str | None) -> None:
    report = _run("normal", switch)
    assert report["helper"] is True and report["reason"] == ""
    assert report["calls"] == 2, "the PTY start and the exec both went through it"


@pytest.mark.parametrize("switch", ["1", "yes"])
def test_the_switch_selects_the_pure_path_with_the_same_results(switch: str) -> None:
    report = _run("normal", switch)
    assert report["helper"] is False
    assert report["reason"] == "SANDBOX_NO_EXTENSIONS is set"
    assert report["calls"] == 0


def test_an_extension_that_fails_to_import_selects_the_pure_path() -> None:
    report = _run("import-fails", None)
    assert report["helper"] is False
    assert str(report["reason"]).startswith("not built at install time: "), report["reason"]
    assert report["calls"] == 0


def test_the_extension_refuses_a_block_holding_fewer_strings_than_its_count(built: None) -> None:
    from sandbox._native import _spawn

    # The C side walks `n` strings of a block: a count past its NULs is refused, not read.
    with pytest.raises(ValueError, match="fewer strings"):
        _spawn.spawn(b"/bin/true\0", 1, b"true\0", 2, b"\0", 0, None, -1, 1, 2, 0, -1, ())
    with pytest.raises(ValueError, match="cwd"):
        _spawn.spawn(b"/bin/true\0", 1, b"true\0", 1, b"", 0, b"a\0b", -1, 1, 2, 0, -1, ())
    with pytest.raises(TypeError, match="13 arguments"):
        _spawn.spawn(b"/bin/true\0")  # type: ignore[call-arg]
