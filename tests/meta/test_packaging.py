"""`python -m build` makes an sdist and a wheel that install and work in a fresh venv.

The tree is copied first (its tracked files only: what a fresh clone builds), so the
build's scratch folders never meet the work tree. The wheel is installed into a new venv
with its dependencies from the package index, then used from outside the tree: the
`sandbox` command, a unix_local `exec`, and the two native parts, whose C sources ship
inside their modules (`sandbox.local.spawn_helper`, `sandbox.output.ascii_text`) and are
built at first use from the installed copy.
"""

from __future__ import annotations

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

from sandbox.local import spawn_helper
from sandbox.output import ascii_text
from tests.conftest import skip_or_fail

ROOT = Path(__file__).resolve().parents[2]
_PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
NAME = f"{_PROJECT['name'].replace('-', '_')}-{_PROJECT['version']}"

# Run by the fresh venv's interpreter, from a folder outside the tree.
SMOKE = """
import asyncio, json, sys
import sandbox
from sandbox.local import spawn_helper
from sandbox.output import ascii_text

async def main():
    async with sandbox.open_session("unix_local") as session:
        return await session.exec("echo hi")

result = asyncio.run(main())
print(json.dumps({
    "file": sandbox.__file__,
    "stdout": result.stdout.decode(),
    "exit_code": result.exit_code,
    "spawn_helper": (spawn_helper.prepare(None), spawn_helper.reason())[1],
    "ascii_text": (ascii_text.prepare(None), ascii_text.reason())[1],
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
        if not key.startswith("PYTHON") and key != "VIRTUAL_ENV"
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
    assert sorted(p.name for p in dist.iterdir()) == [
        f"{NAME}-py3-none-any.whl",
        f"{NAME}.tar.gz",
    ]

    package_sources = {n for n in tracked if n.startswith("src/sandbox/")}
    assert "src/sandbox/local/spawn_helper.py" in package_sources  # the native parts' C
    assert "src/sandbox/output/ascii_text.py" in package_sources

    with tarfile.open(dist / f"{NAME}.tar.gz") as sdist:
        in_sdist = {m.name.removeprefix(f"{NAME}/") for m in sdist.getmembers() if m.isfile()}
        pkg_info = sdist.extractfile(f"{NAME}/PKG-INFO")
        assert pkg_info is not None
        sdist_metadata = pkg_info.read().decode()
    missing = package_sources - in_sdist
    assert not missing, f"not in the sdist: {sorted(missing)}"
    assert {"LICENSE", "README.md", "pyproject.toml", "constraints.txt"} <= in_sdist
    assert not [n for n in in_sdist if n.startswith("tests/") or "__pycache__" in n]
    assert "License-Expression: MIT" in sdist_metadata

    with zipfile.ZipFile(dist / f"{NAME}-py3-none-any.whl") as wheel:
        in_wheel = set(wheel.namelist())
        metadata = wheel.read(f"{NAME}.dist-info/METADATA").decode()
    expected = {n.removeprefix("src/") for n in package_sources}
    missing = expected - in_wheel
    assert not missing, f"not in the wheel: {sorted(missing)}"
    assert f"{NAME}.dist-info/licenses/LICENSE" in in_wheel
    assert "Requires-Dist: pyte" in metadata

    fresh = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(fresh)
    python = str(fresh / "bin" / "python")
    wheel_path = str(dist / f"{NAME}-py3-none-any.whl")
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

    cache = tmp_path / "native-cache"  # an empty cache: both parts are built from source
    smoke = subprocess.run(
        [python, "-c", SMOKE],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=outside,
        env=_clean_env(SANDBOX_CACHE_DIR=str(cache)),
    )
    assert smoke.returncode == 0, smoke.stderr
    report = json.loads(smoke.stdout)
    assert Path(report["file"]).is_relative_to(fresh), report["file"]
    assert (report["stdout"], report["exit_code"]) == ("hi\n", 0)
    # Built from the installed copy wherever they build from the tree (both need a C
    # compiler; the text part also Python's headers): the same reason, or none.
    spawn_helper.prepare(None)
    ascii_text.prepare(None)
    assert report["spawn_helper"] == spawn_helper.reason()
    assert report["ascii_text"] == ascii_text.reason()
    if not spawn_helper.reason():
        assert any(cache.glob("spawn-*.so")), sorted(p.name for p in cache.iterdir())
