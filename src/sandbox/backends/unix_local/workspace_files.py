"""The workspace calls of unix_local: stat, list, remove, make folders and symlinks, set
modes, all beneath the workspace and race-free.

(`workspace.py` beside this holds the `Workspace` folder itself; this module is the
backend half of `sandbox.workspace`.) Every call opens the folder that holds the name
with `safe_open.open_directory_raw` (openat2 `RESOLVE_BENEATH`, or the `O_NOFOLLOW`
walk) and then acts on the final name relative to that fd, never following it
(`fstatat`/`unlinkat`/`mkdirat`/`symlinkat`/`fchmodat` with no follow): a process in the
sandbox that swaps a folder for a symlink to a host folder cannot make us touch it. A
recursive removal is `files.remove_tree` relative to that fd (an iterative walk that
opens every folder with `O_NOFOLLOW`, however deep). Each call is one short executor call.
"""

from __future__ import annotations

import errno
import os
import posixpath
import stat as stat_module
from collections.abc import Callable
from typing import TypeVar

from ...backend import FileInfo, child_path, kind_of_mode, remove_tree_at
from ...errors import (
    InvalidArgumentError,
    NotAFileError,
    SandboxError,
    SandboxFileNotFoundError,
    WorkspacePathError,
)
from .safe_open import DIR_FLAGS, open_directory_raw, relative_inside

T = TypeVar("T")
MAX_ENTRIES = 1_000_000  # a listing bigger than this is refused, not held


def explain(exc: OSError, path: str) -> SandboxError:
    """The `SandboxError` for an `OSError` met by a workspace call on `path`."""
    code = exc.errno
    if code == errno.EXDEV:
        return WorkspacePathError(
            f"path {path!r} is outside the workspace (a symlink or `..` on the way leads out)"
        )
    if code == errno.ENOENT:
        return SandboxFileNotFoundError(f"no such file in the workspace: {path!r}")
    if code == errno.ENOTDIR:
        return InvalidArgumentError(f"{path!r}: a name on its path is not a directory")
    if code == errno.ENOTEMPTY:
        return InvalidArgumentError(
            f"cannot remove {path!r}: the directory is not empty (pass recursive=True)"
        )
    if code == errno.EEXIST:
        return InvalidArgumentError(f"{path!r} exists")
    if code in (errno.EACCES, errno.EPERM):
        return SandboxError(f"permission denied: {path!r}")
    if code == errno.ELOOP:
        return NotAFileError(f"{path!r}: too many levels of symbolic links")
    return SandboxError(f"file operation on {path!r} failed: {os.strerror(code or 0)}")


class LocalTree:
    """The workspace calls under the real folder `root`."""

    def __init__(self, root: str, resolver: str = "auto") -> None:
        self._root = root
        self._resolver = resolver

    def _split(self, path: str) -> tuple[str, str]:
        rel = posixpath.normpath(relative_inside(self._root, path))
        if rel == ".":
            return ".", "."
        return posixpath.dirname(rel) or ".", posixpath.basename(rel)

    def _in_folder(self, path: str, folder: str, work: Callable[[int], T]) -> T:
        try:
            root_fd = os.open(self._root, DIR_FLAGS)
        except OSError as exc:
            raise explain(exc, path) from None
        try:
            fd = open_directory_raw(root_fd, folder, root=self._root, resolver=self._resolver)
        except OSError as exc:
            raise explain(exc, path) from None
        finally:
            os.close(root_fd)
        try:
            return work(fd)
        except OSError as exc:
            raise explain(exc, path) from None
        finally:
            os.close(fd)

    def _info(self, fd: int, name: str, shown_name: str, shown_path: str) -> FileInfo:
        info = os.stat(name, dir_fd=fd, follow_symlinks=False)
        kind = kind_of_mode(info.st_mode)
        link = os.readlink(name, dir_fd=fd) if kind == "symlink" else None
        return FileInfo(
            shown_name,
            shown_path,
            kind,
            info.st_size,
            stat_module.S_IMODE(info.st_mode),
            info.st_mtime,
            link,
        )

    def stat(self, path: str) -> FileInfo:
        """The entry at `path`, not followed."""
        folder, name = self._split(path)
        shown = posixpath.basename(posixpath.normpath(path))
        if name == ".":
            return self._in_folder(path, ".", lambda fd: self._info(fd, ".", shown, path))
        return self._in_folder(path, folder, lambda fd: self._info(fd, name, shown, path))

    def list_dir(self, path: str) -> list[FileInfo]:
        """The entries of the folder `path`."""
        folder, name = self._split(path)
        target = "." if name == "." else posixpath.join(folder, name)

        def listing(fd: int) -> list[FileInfo]:
            # The O_PATH fd cannot be read: open the same folder for reading through it.
            readable = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=fd)
            entries: list[FileInfo] = []
            try:
                with os.scandir(readable) as scan:  # works on a dup: the fd stays ours
                    for entry in scan:
                        if len(entries) >= MAX_ENTRIES:
                            raise SandboxError(f"{path!r} holds more than {MAX_ENTRIES} entries")
                        try:
                            shown = child_path(path, entry.name)
                            entries.append(self._info(fd, entry.name, entry.name, shown))
                        except FileNotFoundError:
                            continue  # removed while listed
            finally:
                os.close(readable)
            return entries

        try:
            return self._in_folder(path, target, listing)
        except InvalidArgumentError:
            # ENOTDIR: the name itself (or one on the way) is not a folder.
            raise InvalidArgumentError(f"{path!r} is not a directory") from None

    def remove(self, path: str, recursive: bool) -> None:
        """Remove the name `path` (see `BaseSandboxSession._remove`)."""
        folder, name = self._split(path)
        if name == ".":
            raise InvalidArgumentError("cannot remove the workspace itself")

        def remove(fd: int) -> None:
            info = os.stat(name, dir_fd=fd, follow_symlinks=False)
            if not stat_module.S_ISDIR(info.st_mode):
                os.unlink(name, dir_fd=fd)
            elif recursive:
                remove_tree_at(fd, name, shown=path)
            else:
                os.rmdir(name, dir_fd=fd)

        self._in_folder(path, folder, remove)

    def make_dir(self, path: str, parents: bool) -> None:
        """Make the folder `path`, one name at a time beneath the root."""
        rel = posixpath.normpath(relative_inside(self._root, path))
        parts = [] if rel == "." else rel.split("/")
        if not parts:
            if not parents:
                raise InvalidArgumentError(f"{path!r} exists (it is the workspace)")
            return
        for k in range(1, len(parts) + 1):
            folder, name = "/".join(parts[: k - 1]) or ".", parts[k - 1]
            last = k == len(parts)

            def make(fd: int, name: str = name, last: bool = last) -> None:
                try:
                    os.mkdir(name, 0o777, dir_fd=fd)
                    return
                except FileExistsError:
                    if last and not parents:
                        raise
                info = os.stat(name, dir_fd=fd)  # a symlink to a folder inside is fine
                if not stat_module.S_ISDIR(info.st_mode):
                    raise NotAFileError(f"cannot make {path!r}: {name!r} is in the way")

            if not parents and not last:
                self._in_folder(path, "/".join(parts[:k]), lambda fd: None)
                continue
            self._in_folder(path, folder, make)

    def make_symlink(self, path: str, target: str) -> None:
        """Make (or replace a file or symlink with) the symlink `path` -> `target`."""
        folder, name = self._split(path)

        def link(fd: int) -> None:
            try:
                os.symlink(target, name, dir_fd=fd)
                return
            except FileExistsError:
                info = os.stat(name, dir_fd=fd, follow_symlinks=False)
                if stat_module.S_ISDIR(info.st_mode):
                    raise NotAFileError(
                        f"cannot make the symlink {path!r}: a folder is there"
                    ) from None
                os.unlink(name, dir_fd=fd)
            os.symlink(target, name, dir_fd=fd)

        self._in_folder(path, folder, link)

    def set_mode(self, path: str, mode: int) -> None:
        """Set the permission bits of `path`; a symlink is left alone."""
        folder, name = self._split(path)

        def chmod(fd: int) -> None:
            # What glibc's fchmodat(AT_SYMLINK_NOFOLLOW) does: pin the inode with an
            # O_PATH fd that follows nothing, then change it through /proc; a name swapped
            # for a symlink after a stat can then never redirect the chmod.
            pinned = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            try:
                if not stat_module.S_ISLNK(os.fstat(pinned).st_mode):
                    os.chmod(f"/proc/self/fd/{pinned}", mode & 0o7777)
            finally:
                os.close(pinned)

        self._in_folder(path, folder, chmod)
