"""`FileInfo`: what `stat` and `list_dir` say about one name in the workspace."""

from __future__ import annotations

import posixpath
import stat as stat_module
from dataclasses import dataclass
from typing import Literal

FileKind = Literal["file", "dir", "symlink", "other"]


@dataclass(frozen=True, slots=True)
class FileInfo:
    """One name in the sandbox, never followed when it is a symlink.

    `name` is the last component, `path` the path as the caller would pass it back
    (relative names stay relative to the workspace), `kind` one of "file", "dir",
    "symlink", "other" (FIFO, socket, device), `size` in bytes (a symlink: its target's
    length, as `lstat` says; 0 where the provider does not tell), `mode` the permission
    bits (`0o7777` at most), `mtime` seconds since the epoch (0.0 when unknown), and
    `link_target` the symlink's target as written (None for other kinds, or when the
    provider does not tell).
    """

    name: str
    path: str
    kind: FileKind
    size: int
    mode: int
    mtime: float
    link_target: str | None = None


def kind_of_mode(mode: int) -> FileKind:
    """The `FileKind` of a POSIX `st_mode`."""
    if stat_module.S_ISREG(mode):
        return "file"
    if stat_module.S_ISDIR(mode):
        return "dir"
    if stat_module.S_ISLNK(mode):
        return "symlink"
    return "other"


def child_path(parent: str, name: str) -> str:
    """The path of `name` inside `parent`, spelled as the caller spelled `parent`."""
    if parent in ("", "."):
        return name
    return posixpath.join(parent, name)
