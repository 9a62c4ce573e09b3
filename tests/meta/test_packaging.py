"""`python -m build` makes an sdist and a wheel that install and work in a fresh venv.

The tree is copied first (its tracked files only: what a fresh clone builds), so the
build's scratch folders never meet the work tree. The wheel is installed into a new venv
with its dependencies from the package index, then used from outside the tree: the
`sandbox` command, a unix_local `exec`, and the optional C extension
(`sandbox._native._spawn`): its source ships in the sdist, the wheel carries it built,
and the installed copy uses it (where this machine builds it: a C compiler).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tomllib
import urllib.request
import venv
import zipfile
from pathlib import Path

import pytest

from tests.conftest import skip_or_fail

ROOT = Path(__file__).resolve().parents[2]
_PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
NAME = f"{_PROJECT['name'].replace('-', '_')}-{_PROJECT['version']}"
# Whether the extension was built in this tree's install (then the wheel's build can too).
BUILT_HERE = importlib.util.find_spec("sandbox._native._spawn") is not None

# Run by the fresh venv's interpreter, from a folder outside the tree.
SMOKE = """
import asyncio, json, sys
import sandbox
from sandbox.local import spawn_helper

async def main():
    async with sandbox.open_session("unix_local") as session:
        return await session.exec("echo hi")

result = asyncio.run(main())
print(json.dumps({
    "file": sandbox.__file__,
    "stdout": result.stdout.decode(),
    "exit_code": result.exit_code,
    "spawn_helper": spawn_helper.reason(),
}))
"""


def _tracked_files() -> list[str]:
    listed = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
    ).stdout.decode()
    # A tracked file deleted in the work tree (someone's edit in progress) is not built.
    return [name for name in listed.split("\0") if name and (ROOT / name).is_file()]


def _index_reachable() -> str:
    """'' when the package index answers, else why not (the build and the install need
    it: setuptools for the isolated build, pyte for the install)."""
    index = os.environ.get("PIP_INDEX_URL", "https://pypi.org/simple/").rstrip("/")
    try:
        with urllib.request.urlopen(f"{index}/pyte/", timeout=15):
            return ""
    except OSError as exc:
        return f"the package index is unreachable ({type(exc).__name__})"


def _clean_env(**extra: str) -> dict[str, str]:
    # Nothing of this venv or of the tree may leak into the fresh one's imports.
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith("PYTHON") and key not in ("VIRTUAL_ENV", "SANDBOX_NO_EXTENSIONS")
    }
    env.update(extra)
    return env


@pytest.mark.timeout(600)
def test_the_built_sdist_and_wheel_install_and_run_in_a_fresh_venv(tmp_path: Path) -> None:
    why = _index_reachable()
    if why:
        skip_or_fail(why)
    tracked = _tracked_files()
    tree = tmp_path / "tree"
    for name in tracked:
        (tree / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, tree / name)
    dist = tmp_path / "dist"
    built = subprocess.run(
        [sys.executable, "-m", "build", "--outdir", str(dist), str(tree)],
        capture_output=True,
        text=True,
        timeout=300,
        env=_clean_env(),
    )
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    # A wheel with an extension module is tagged for this interpreter and platform.
    wheels = [p for p in dist.iterdir() if p.name.endswith(".whl")]
    assert len(wheels) == 1 and wheels[0].name.startswith(f"{NAME}-cp3"), wheels
    assert sorted(p.name for p in dist.iterdir()) == sorted([wheels[0].name, f"{NAME}.tar.gz"])

    package_sources = {n for n in tracked if n.startswith("src/sandbox/")}
    assert "src/sandbox/_native/spawn.c" in package_sources  # the extension's C

    with tarfile.open(dist / f"{NAME}.tar.gz") as sdist:
        in_sdist = {m.name.removeprefix(f"{NAME}/") for m in sdist.getmembers() if m.isfile()}
        pkg_info = sdist.extractfile(f"{NAME}/PKG-INFO")
        assert pkg_info is not None
        sdist_metadata = pkg_info.read().decode()
    missing = package_sources - in_sdist
    assert not missing, f"not in the sdist: {sorted(missing)}"
    assert {"LICENSE", "README.md", "pyproject.toml", "setup.py", "constraints.txt"} <= in_sdist
    assert not [n for n in in_sdist if n.endswith(".so")], "nothing built in the sdist"
    assert not [n for n in in_sdist if n.startswith("tests/") or "__pycache__" in n]
    assert "License-Expression: MIT" in sdist_metadata

    with zipfile.ZipFile(wheels[0]) as wheel:
        in_wheel = set(wheel.namelist())
        metadata = wheel.read(f"{NAME}.dist-info/METADATA").decode()
    # The C source is built into the wheel, not shipped in it.
    expected = {n.removeprefix("src/") for n in package_sources if not n.endswith(".c")}
    missing = expected - in_wheel
    assert not missing, f"not in the wheel: {sorted(missing)}"
    assert f"{NAME}.dist-info/licenses/LICENSE" in in_wheel
    assert "Requires-Dist: pyte" in metadata
    built = [n for n in in_wheel if n.startswith("sandbox/_native/_spawn.") and n.endswith(".so")]
    assert len(built) == (1 if BUILT_HERE else 0), built

    fresh = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(fresh)
    python = str(fresh / "bin" / "python")
    wheel_path = str(wheels[0])
    installed = subprocess.run(
        [python, "-m", "pip", "install", "-q", "--disable-pip-version-check", wheel_path],
        capture_output=True,
        text=True,
        timeout=300,
        env=_clean_env(),
    )
    assert installed.returncode == 0, installed.stdout[-3000:] + installed.stderr[-3000:]

    outside = tmp_path / "elsewhere"
    outside.mkdir()
    helped = subprocess.run(
        [str(fresh / "bin" / "sandbox"), "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=outside,
        env=_clean_env(),
    )
    assert helped.returncode == 0, helped.stderr
    assert helped.stdout.startswith("usage: sandbox")

    smoke = subprocess.run(
        [python, "-c", SMOKE],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=outside,
        env=_clean_env(),
    )
    assert smoke.returncode == 0, smoke.stderr
    report = json.loads(smoke.stdout)
    assert Path(report["file"]).is_relative_to(fresh), report["file"]
    assert (report["stdout"], report["exit_code"]) == ("hi\n", 0)
    # The installed copy uses the extension the wheel carries (no build at run time).
    if BUILT_HERE:
        assert report["spawn_helper"] == "", report["spawn_helper"]
    else:
        assert report["spawn_helper"].startswith("not built at install time")
