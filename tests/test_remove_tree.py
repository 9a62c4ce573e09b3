"""Deep trees a sandboxed process made are removed (issue 33, item 4): by `aclose()` of a
temporary workspace, by `remove(path, recursive=True)`, by `sandbox close` of a ref file;
never following a symlink out; a tree that cannot be removed is a `CleanupError`, the
ref file kept, and the close can be retried once the cause is gone."""

from __future__ import annotations

import array
import contextlib
import fcntl
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import sandbox
from sandbox.files.remove_tree import TreeRemovalError, remove_tree, remove_tree_at
from tests.helpers import open_fds

FS_IOC_GETFLAGS = 0x80086601
FS_IOC_SETFLAGS = 0x40086602
FS_IMMUTABLE_FL = 0x10


MAKE_DEEP = """
import os, sys
levels, link_to = int(sys.argv[1]), sys.argv[2]
os.mkdir("deep")
os.chdir("deep")
for _ in range(levels):
    os.mkdir("d")
    open("f", "w").close()
    os.chdir("d")  # relative, one level at a time: the whole path is far too long to name
if link_to:
    os.symlink(link_to, "out")
print("made")
"""


def deep_tree_command(levels: int, link_to: str | None = None) -> list[str]:
    """A process that makes `levels` nested folders below ./deep, a file at every level
    and, at the bottom, a symlink to `link_to`. (Python, not a shell loop: a shell's
    `cd` keeps the logical path, which stops working, or gets slow, past PATH_MAX.)"""
    return [sys.executable, "-c", MAKE_DEEP, str(levels), link_to or ""]


async def make_deep_tree(
    session: sandbox.BaseSandboxSession, levels: int, link_to: str | None = None
) -> None:
    result = await session.exec(*deep_tree_command(levels, link_to), shell=False, timeout=120)
    assert (result.exit_code, result.stdout) == (0, b"made\n"), result.stderr


def depth_of(top: str) -> int:
    """How many `d` levels are below `top` (walked by fds: the path is too long)."""
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    levels = 0
    try:
        while True:
            try:
                below = os.open("d", os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            except FileNotFoundError:
                return levels
            os.close(fd)
            fd, levels = below, levels + 1
    finally:
        os.close(fd)


@pytest.fixture
def host_folder(tmp_path: Path) -> Path:
    """A host folder a symlink in the sandbox's tree points at: it must survive."""
    folder = tmp_path / "host-folder"
    folder.mkdir()
    (folder / "precious.txt").write_text("keep me")
    return folder


def _set_immutable(path: str, on: bool) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        flags = array.array("l", [0])
        fcntl.ioctl(fd, FS_IOC_GETFLAGS, flags, True)
        flags[0] = flags[0] | FS_IMMUTABLE_FL if on else flags[0] & ~FS_IMMUTABLE_FL
        fcntl.ioctl(fd, FS_IOC_SETFLAGS, flags, True)
    finally:
        os.close(fd)


@contextlib.contextmanager
def immutable(path: str) -> Iterator[None]:
    """`path` cannot be removed (not even by root) until the block ends: the file
    system's immutable flag (`chattr +i`), or a skip where it cannot be set."""
    try:
        _set_immutable(path, True)
    except OSError as exc:
        pytest.skip(f"the immutable flag cannot be set here: {exc.strerror}")
    try:
        yield
    finally:
        _set_immutable(path, False)


# ---- the function itself -------------------------------------------------------------


def test_a_deep_tree_is_removed_with_few_fds_and_a_symlink_is_removed_as_a_link(
    tmp_path, host_folder
):
    top = tmp_path / "top"
    top.mkdir()
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(3000):
        os.mkdir("d", dir_fd=fd)
        os.symlink(str(host_folder), "out", dir_fd=fd)
        os.mkfifo("fifo", dir_fd=fd)
        below = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = below
    os.close(fd)
    before = open_fds()
    remove_tree(str(top))
    assert not top.exists()
    assert (host_folder / "precious.txt").read_text() == "keep me"
    assert open_fds() == before
    remove_tree(str(top))  # already gone: fine


def test_a_symlink_at_the_top_is_removed_not_followed(tmp_path, host_folder):
    link = tmp_path / "link"
    link.symlink_to(host_folder)
    remove_tree(str(link))
    assert not os.path.lexists(link) and (host_folder / "precious.txt").exists()
    holder = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        link.symlink_to(host_folder)
        remove_tree_at(holder, "link")
    finally:
        os.close(holder)
    assert not os.path.lexists(link) and (host_folder / "precious.txt").exists()


def test_what_cannot_be_removed_is_one_error_and_the_rest_goes(tmp_path):
    top = tmp_path / "top"
    (top / "a" / "b").mkdir(parents=True)
    (top / "a" / "b" / "stuck").write_text("x")
    (top / "other").mkdir()
    (top / "other" / "f").write_text("x")
    stuck = str(top / "a" / "b" / "stuck")
    with immutable(stuck):
        with pytest.raises(TreeRemovalError) as caught:
            remove_tree(str(top))
        assert isinstance(caught.value, sandbox.SandboxError)
        assert "top/a/b/stuck" in str(caught.value)
        assert "Operation not permitted" in str(caught.value)
        assert os.path.exists(stuck) and not (top / "other").exists()
    remove_tree(str(top))
    assert not top.exists()


# ---- unix_local: aclose() and remove(recursive=True) ---------------------------------


@pytest.mark.parametrize("levels", [1200, 5000])
async def test_aclose_removes_a_deep_temporary_workspace(levels, host_folder):
    session = sandbox.open_session("unix_local")
    async with session:
        workspace = session.workdir
        await make_deep_tree(session, levels, link_to=str(host_folder))
        assert depth_of(os.path.join(workspace, "deep")) == levels
    assert not os.path.exists(workspace)
    assert (host_folder / "precious.txt").read_text() == "keep me"


@pytest.mark.parametrize("levels", [1200, 5000])
async def test_remove_recursive_removes_a_deep_tree(levels, host_folder):
    async with sandbox.open_session("unix_local") as session:
        await make_deep_tree(session, levels, link_to=str(host_folder))
        await session.remove("deep", recursive=True)
        assert await session.list_dir(".") == []
    assert (host_folder / "precious.txt").read_text() == "keep me"


async def test_remove_recursive_that_cannot_finish_is_a_sandbox_error():
    async with sandbox.open_session("unix_local") as session:
        await make_deep_tree(session, 1200)
        fd = _open_deep(session.workdir, ["deep", *(["d"] * 600)])
        try:
            with immutable(f"/proc/self/fd/{fd}/f"):
                with pytest.raises(sandbox.SandboxError) as caught:
                    await session.remove("deep", recursive=True)
                assert "Operation not permitted" in str(caught.value)
                assert str(caught.value).count("d/") >= 600
        finally:
            os.close(fd)
        await session.remove("deep", recursive=True)
        assert await session.list_dir(".") == []


def _open_deep(top: str, names: list[str]) -> int:
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    for name in names:
        below = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
        os.close(fd)
        fd = below
    return fd


async def test_aclose_that_cannot_remove_the_workspace_raises_cleanup_error():
    session = sandbox.open_session("unix_local")
    await session.start()
    workspace = session.workdir
    await make_deep_tree(session, 1200)
    fd = _open_deep(workspace, ["deep", *(["d"] * 1100)])
    try:
        with immutable(f"/proc/self/fd/{fd}/f"):
            with pytest.raises(sandbox.CleanupError) as caught:
                await session.aclose()
            assert workspace in str(caught.value)
            assert "Operation not permitted" in str(caught.value)
            assert os.path.isdir(workspace)
    finally:
        os.close(fd)
    remove_tree(workspace)


# ---- `sandbox close` of a ref file ---------------------------------------------------


def _cli(*words: str, cwd: Path) -> subprocess.CompletedProcess[bytes]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    return subprocess.run(
        [sys.executable, "-m", "sandbox.cli", *words], capture_output=True, cwd=cwd, env=env
    )


def _open_with_deep_tree(tmp_path: Path, levels: int, link_to: str) -> tuple[Path, str]:
    opened = _cli("open", cwd=tmp_path)
    assert opened.returncode == 0, opened.stderr
    ref_file = tmp_path / "ref.json"
    ref_file.write_bytes(opened.stdout)
    workspace = sandbox.SessionRef.from_json(opened.stdout).sandbox["workspace"]
    made = _cli(
        "run", "--session", str(ref_file), "--", *deep_tree_command(levels, link_to), cwd=tmp_path
    )
    assert (made.returncode, made.stdout) == (0, b"made\n"), made.stderr
    return ref_file, workspace


@pytest.mark.parametrize("levels", [1200, 5000])
def test_sandbox_close_removes_a_deep_tree_and_then_the_ref_file(tmp_path, host_folder, levels):
    ref_file, workspace = _open_with_deep_tree(tmp_path, levels, str(host_folder))
    closed = _cli("close", str(ref_file), cwd=tmp_path)
    assert closed.returncode == 0, closed.stderr
    assert not os.path.exists(workspace) and not ref_file.exists()
    assert (host_folder / "precious.txt").read_text() == "keep me"


def test_sandbox_close_that_fails_keeps_the_ref_file_and_can_be_retried(tmp_path, host_folder):
    ref_file, workspace = _open_with_deep_tree(tmp_path, 1200, str(host_folder))
    fd = _open_deep(workspace, ["deep", *(["d"] * 700)])
    try:
        with immutable(f"/proc/self/fd/{fd}/f"):
            failed = _cli("close", str(ref_file), cwd=tmp_path)
            assert failed.returncode == 1, failed.stderr
            assert b"Traceback" not in failed.stderr
            lines = failed.stderr.decode().strip().splitlines()
            assert len(lines) == 1 and "was not removed" in lines[0], failed.stderr
            assert ref_file.exists() and os.path.isdir(workspace)
    finally:
        os.close(fd)
    again = _cli("close", str(ref_file), cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert not os.path.exists(workspace) and not ref_file.exists()
    assert (host_folder / "precious.txt").read_text() == "keep me"
