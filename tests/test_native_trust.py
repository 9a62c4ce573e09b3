"""What `sandbox.native` trusts: the folders above the cache, the very file it loads,
and a compiler that hangs or leaves something behind (issue 33, item 5).

Real folders, real ownership (made with `os.chown`, so those tests need root), the
host's real C compiler for the libraries, and shell scripts standing in for a compiler
that misbehaves.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import ctypes
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sandbox import native
from sandbox.backends.unix_local import UnixLocalSession
from sandbox.local import spawn_helper
from tests.helpers import eventually, host_pids_with_arg

OTHER_UID = 4242
NEEDS_ROOT = pytest.mark.skipif(
    os.geteuid() != 0, reason="needs root: it makes folders owned by another uid (os.chown)"
)
NEEDS_CC = pytest.mark.skipif(
    shutil.which("cc") is None and shutil.which("gcc") is None,
    reason="needs a C compiler (cc or gcc) to build the test libraries",
)
PARTS: list[native.NativePart[Any]] = [spawn_helper._PART]


def _answer_source(value: int) -> str:
    return f"int answer(void) {{ return {value}; }}\n"


@contextlib.contextmanager
def _fresh(*parts: native.NativePart[Any]) -> Iterator[None]:
    """The parts as if this process had never prepared them; their own state after."""
    saved = []
    for part in parts:
        with part.lock:
            saved.append((part.tried, part.value, part.why))
            part.tried, part.value, part.why = False, None, "not built yet"
    try:
        yield
    finally:
        for part, state in zip(parts, saved, strict=True):
            if part.tried:
                part.prepare()  # the build this test started has ended (it has a deadline)
            with part.lock:
                part.tried, part.value, part.why = state


# ---- the folders above the cache ----------------------------------------------------


@NEEDS_ROOT
def test_a_cache_below_a_folder_another_user_owns_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o755)
    os.chown(theirs, OTHER_UID, OTHER_UID)
    cache = theirs / "cache"
    monkeypatch.setenv(native.CACHE_VARIABLE, str(cache))
    with _fresh(spawn_helper._PART):
        # They could rename `cache` away and put a folder of their own library in its
        # place between our check and our load: the helper stays unused, and says why.
        assert spawn_helper.prepare() is None
        reason = spawn_helper.reason()
    assert str(theirs) in reason and f"uid {OTHER_UID}" in reason, reason
    assert not cache.exists(), "nothing was made below their folder"


@NEEDS_ROOT
def test_an_existing_cache_below_their_folder_is_refused_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The cache itself is ours and private: only the folder above it is theirs.
    theirs = tmp_path / "theirs"
    cache = theirs / "deeper" / "cache"
    cache.mkdir(mode=0o700, parents=True)
    os.chown(theirs, OTHER_UID, OTHER_UID)
    monkeypatch.setenv(native.CACHE_VARIABLE, str(cache))
    with pytest.raises(native.Unusable, match=f"{theirs}, above the cache, is owned by uid"):
        native.open_cache_directory()


def test_a_folder_others_can_write_above_the_cache_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o775)  # group-writable, not sticky: the group can swap what is below
    (shared / "cache").mkdir(mode=0o700)
    monkeypatch.setenv(native.CACHE_VARIABLE, str(shared / "cache"))
    with pytest.raises(native.Unusable, match=f"{shared}, above the cache, is writable"):
        native.open_cache_directory()


def test_a_sticky_shared_folder_is_fine_below_it_our_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shared = tmp_path / "like-tmp"
    shared.mkdir()
    shared.chmod(0o1777)
    monkeypatch.setenv(native.CACHE_VARIABLE, str(shared / "mine" / "cache"))
    fd, where = native.open_cache_directory()
    os.close(fd)
    assert where == str(shared / "mine" / "cache") and (shared / "mine" / "cache").is_dir()


@NEEDS_ROOT
def test_below_a_sticky_shared_folder_a_folder_of_theirs_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shared = tmp_path / "like-tmp"
    shared.mkdir()
    shared.chmod(0o1777)
    theirs = shared / "theirs"
    theirs.mkdir(mode=0o755)
    os.chown(theirs, OTHER_UID, OTHER_UID)
    monkeypatch.setenv(native.CACHE_VARIABLE, str(theirs / "cache"))
    with pytest.raises(native.Unusable, match=f"owned by uid {OTHER_UID}"):
        native.open_cache_directory()
    assert not (theirs / "cache").exists()


def test_a_folder_replaced_by_a_link_after_the_path_was_resolved_is_refused(
    tmp_path: Path,
) -> None:
    # The walk opens each name with O_NOFOLLOW on its parent's fd: a link found there
    # (put in place after `realpath`, or made by someone else) stops it.
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "elsewhere")
    parent = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with pytest.raises(native.Unusable, match="is not a folder"):
            native._open_or_make(parent, "link", str(tmp_path / "link"))
    finally:
        os.close(parent)


# ---- the very file that is loaded ----------------------------------------------------


@NEEDS_CC
@pytest.mark.parametrize(("built", "checked"), [("cached", 1), ("just built", 5)])
def test_the_library_loaded_is_the_one_checked_even_if_the_name_is_swapped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, built: str, checked: int
) -> None:
    cache = tmp_path / "cache"
    monkeypatch.setenv(native.CACHE_VARIABLE, str(cache))
    source, flags = _answer_source(checked), ["-O0"]
    if built == "cached":
        with native.cached_library("trust", source, flags):
            pass
    # Another library, one the check would refuse (anybody may write it), ready to be
    # renamed over the cached name.
    other = tmp_path / "other.so"
    cc = shutil.which("cc") or shutil.which("gcc")
    assert cc is not None
    (tmp_path / "other.c").write_text(_answer_source(checked + 1))
    argv = [cc, "-shared", "-fPIC", "-o", str(other), str(tmp_path / "other.c")]
    assert subprocess.run(argv, check=False).returncode == 0
    other.chmod(0o777)

    def load() -> ctypes.CDLL:
        with native.cached_library("trust", source, flags) as path:
            (name,) = [p.name for p in cache.iterdir()]
            # Between the check and the load: the name now holds the other library.
            os.rename(other, cache / name)
            assert os.stat(cache / name).st_mode & 0o777 == 0o777
            return ctypes.CDLL(path)

    # In a thread of its own, as the parts load (the loader's name for it is then new).
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        library = pool.submit(load).result()
    assert library.answer() == checked, "the checked library was loaded, not the name's"


@NEEDS_ROOT
@NEEDS_CC
def test_a_cached_library_of_another_user_is_not_loaded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = tmp_path / "cache"
    monkeypatch.setenv(native.CACHE_VARIABLE, str(cache))
    source = _answer_source(3)
    with native.cached_library("theirs", source, []):
        pass
    (library,) = cache.iterdir()
    os.chown(library, OTHER_UID, OTHER_UID)
    with pytest.raises(native.Unusable, match="not a private file of ours"):
        with native.cached_library("theirs", source, []):
            pass


# ---- a compiler that hangs or leaves something behind ---------------------------------


def _fake_compiler(folder: Path, body: str) -> Path:
    path = folder / "fake-cc"
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o700)
    return path


async def test_a_hanging_compiler_holds_no_session_start_and_is_killed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mark = str(86400 + os.getpid() % 10000)  # a sleep length nothing else uses
    # It hangs, and so does a child it started in the background.
    compiler = _fake_compiler(tmp_path, f"sleep {mark} &\nexec sleep {mark}")
    monkeypatch.setenv("CC", str(compiler))
    monkeypatch.setenv(native.CACHE_VARIABLE, str(tmp_path / "cache"))
    # The deadline is shortened so this test sees the kill (30 s otherwise).
    monkeypatch.setattr(native, "BUILD_DEADLINE_S", 4.0)
    with _fresh(*PARTS):
        began = time.monotonic()
        async with asyncio.timeout(15), UnixLocalSession(workspace=tmp_path / "ws") as session:
            update = await session.pty_exec_start("echo started", tty=True, yield_time_s=5)
            took = time.monotonic() - began
            assert update.output.strip() == "started" and update.exit_code == 0
            # Both parts were still building while the session started and ran.
            assert host_pids_with_arg(mark), "the fake compiler was hanging meanwhile"
            assert spawn_helper.loaded() is None
        # Each start waits at most native.START_WAIT_S per part (the old wait was 120 s).
        assert took < 5, f"start + pty start took {took:.1f} s"
        for part in PARTS:
            await asyncio.to_thread(part.prepare)  # until its deadline has passed
            assert "did not finish within" in part.reason(), part.reason()
        assert await eventually(lambda: not host_pids_with_arg(mark)), (
            "the compiler and its child were killed at the deadline"
        )


async def test_what_a_compiler_leaves_behind_is_killed_when_it_exits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mark = str(76400 + os.getpid() % 10000)
    compiler = _fake_compiler(tmp_path, f"sleep {mark} &\necho broken >&2\nexit 1")
    monkeypatch.setenv("CC", str(compiler))
    monkeypatch.setenv(native.CACHE_VARIABLE, str(tmp_path / "cache"))
    began = time.monotonic()
    with pytest.raises(native.Unusable, match="failed: broken"):
        with native.cached_library("leftover", _answer_source(4), []):
            pass
    assert time.monotonic() - began < 10, "its child holds no pipe it waits on"
    assert await eventually(lambda: not host_pids_with_arg(mark)), "its child went with it"
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [], "no build leftovers"
