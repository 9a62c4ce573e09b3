"""A wheel built from the sources (`python -m build --wheel`, what `pip install .` runs
too) carries the runner binary that setup.py's `build_runner` compiled with cargo, and
`SANDBOX_NO_RUNNER=1` builds the same wheel without it.

The tree is copied first (its tracked files only: what a fresh clone builds, so no
binary `make runner` left in src/). Cargo's target folder is this tree's `runner/target`
(`CARGO_TARGET_DIR`): cargo's fingerprints do not depend on where the crate sits, so once
warm a build from the copy compiles nothing and the test takes a few seconds (a cold one
about 15 s on two cores). The build is isolated, so it needs the package index
(setuptools>=77; this venv's is older). Like tests/meta/test_packaging.py, this is not
in `make test-fast` (which runs the unit folders only).
"""

from __future__ import annotations

import hashlib
import json
import platform
import shutil
import stat
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from sandbox.runner import binary, frames
from tests.conftest import skip_or_fail
from tests.meta.test_packaging import ROOT, _clean_env, _index_reachable, _tracked_files

SWITCH = "SANDBOX_NO_RUNNER"
NAME = binary.binary_name()
MEMBER = f"sandbox/runner/bin/{NAME}"
NOTE = f"sandbox/runner/bin/{binary.NOT_BUILT_NOTE}"
CRATE_VERSION = tomllib.loads((ROOT / "runner" / "Cargo.toml").read_text())["package"]["version"]

# Run with the unpacked wheel first on the path: what binary.py finds there.
FIND = """
import json
from sandbox.runner import binary
found = binary.runner_binary()
print(json.dumps({
    "module": binary.__file__,
    "path": None if found is None else str(found.path),
    "sha256": None if found is None else found.sha256,
    "reason": binary.unavailable_reason(),
}))
"""


def _build_wheel(tmp_path: Path, **env: str) -> tuple[Path, str]:
    """The wheel built from a copy of the tree with `env` added, and the build's output."""
    why = _index_reachable()
    if why:
        skip_or_fail(why)
    tree = tmp_path / "tree"
    for name in _tracked_files():
        (tree / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, tree / name)
    dist = tmp_path / "dist"
    environ = _clean_env(CARGO_TARGET_DIR=str(ROOT / "runner" / "target"))
    environ.pop(SWITCH, None)
    environ.update(env)
    built = subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--outdir", str(dist), str(tree)],
        capture_output=True,
        text=True,
        timeout=280,
        env=environ,
    )
    output = built.stdout + built.stderr
    assert built.returncode == 0, output[-4000:]
    wheels = list(dist.glob("*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0], output


def _unpack_and_find(wheel: Path, into: Path) -> dict[str, str | None]:
    """What sandbox.runner.binary reports when imported from the unpacked wheel."""
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(into)
        # zipfile drops the permission bits; put back the ones the wheel records.
        for info in archive.infolist():
            mode = info.external_attr >> 16
            if mode:
                (into / info.filename).chmod(stat.S_IMODE(mode))
    found = subprocess.run(
        [sys.executable, "-c", FIND],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=into.parent,
        env=_clean_env(PYTHONPATH=str(into)),
    )
    assert found.returncode == 0, found.stderr
    report: dict[str, str | None] = json.loads(found.stdout)
    assert Path(str(report["module"])).is_relative_to(into), report["module"]
    return report


def _has_interpreter(elf: bytes) -> bool:
    """Whether a 64-bit little-endian ELF asks for a dynamic loader (a PT_INTERP header):
    a binary built with `+crt-static` does not."""
    assert elf[:4] == b"\x7fELF" and elf[4] == 2 and elf[5] == 1, "not a 64-bit LE ELF"
    phoff = int.from_bytes(elf[0x20:0x28], "little")
    entsize = int.from_bytes(elf[0x36:0x38], "little")
    count = int.from_bytes(elf[0x38:0x3A], "little")
    return any(
        int.from_bytes(elf[phoff + i * entsize : phoff + i * entsize + 4], "little") == 3
        for i in range(count)
    )


@pytest.mark.timeout(300)
def test_the_wheel_carries_the_runner_cargo_built(tmp_path: Path) -> None:
    if not sys.platform.startswith("linux") or NAME is None:
        pytest.skip(f"no runner build on {sys.platform} {platform.machine()}")
    if shutil.which("cargo") is None:
        skip_or_fail("cargo is not installed: setup.py builds no runner here")
    wheel, output = _build_wheel(tmp_path)
    assert "sandbox runner is not in this install" not in output, output[-4000:]

    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        assert MEMBER in names, sorted(n for n in names if "runner/" in n)
        assert NOTE not in names
        mode = archive.getinfo(MEMBER).external_attr >> 16
        shipped = archive.read(MEMBER)
    assert stat.S_ISREG(mode) and mode & 0o111 == 0o111, oct(mode)
    assert not _has_interpreter(shipped), "the runner is not statically linked"

    # Exactly what cargo made with make runner's target and flags (in the shared folder).
    triple = f"{platform.machine()}-unknown-linux-gnu"
    cargo_output = ROOT / "runner" / "target" / triple / "release" / "sandbox-runner"
    digest = hashlib.sha256(shipped).hexdigest()
    assert hashlib.sha256(cargo_output.read_bytes()).hexdigest() == digest

    unpacked = tmp_path / "unpacked"
    report = _unpack_and_find(wheel, unpacked)
    assert report["path"] == str(unpacked / MEMBER)
    assert report["sha256"] == digest
    assert report["reason"] is None

    version = subprocess.run(
        [str(unpacked / MEMBER), "version"], capture_output=True, text=True, timeout=30
    )
    assert version.returncode == 0, version.stderr
    assert version.stdout.strip() == (
        f"sandbox-runner {CRATE_VERSION} protocol {frames.PROTOCOL_VERSION}"
    )


@pytest.mark.timeout(300)
def test_with_the_switch_the_wheel_builds_without_the_runner(tmp_path: Path) -> None:
    wheel, output = _build_wheel(tmp_path, **{SWITCH: "1"})
    assert f"sandbox runner is not in this install ({SWITCH} set at install)" in output

    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        shipped = [n for n in names if n.startswith("sandbox/runner/bin/sandbox-runner")]
        assert shipped == []
        assert archive.read(NOTE).decode() == f"{SWITCH} set at install\n"
        # The rest of the package is there: the switch drops the runner only.
        assert {"sandbox/__init__.py", "sandbox/runner/binary.py"} <= names

    report = _unpack_and_find(wheel, tmp_path / "unpacked")
    assert report["path"] is None
    assert report["reason"] == f"runner: not built ({SWITCH} set at install)"
