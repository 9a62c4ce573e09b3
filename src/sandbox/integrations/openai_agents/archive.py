"""The workspace archive the SDK snapshots, made fit for it: its skip set left out, and
absolute symlinks into the workspace made relative (so our own hydrate, which refuses
absolute targets, restores them)."""

from __future__ import annotations

import posixpath
import tarfile
from collections.abc import Iterable
from pathlib import PurePosixPath
from typing import IO


def member_path(name: str) -> PurePosixPath:
    """A member's name as a workspace-relative path (`./a/b` and `a/b/` are `a/b`)."""
    return PurePosixPath(posixpath.normpath(name.lstrip("/")))


def skipped(path: PurePosixPath, skip: Iterable[PurePosixPath]) -> bool:
    """Whether `path` is one of `skip` or below one."""
    return any(path == entry or entry in path.parents for entry in skip)


def relative_target(link: PurePosixPath, target: str, root: str) -> str | None:
    """For a symlink at `link` (workspace-relative) to the absolute `target`: the same
    place as a relative target when it lies in the workspace `root`, else None."""
    inside = posixpath.relpath(posixpath.normpath(target), posixpath.normpath(root))
    if inside == ".." or inside.startswith("../"):
        return None
    return posixpath.relpath(inside, posixpath.dirname(str(link)) or ".")


def rewrite(source: IO[bytes], destination: IO[bytes], skip: set[PurePosixPath], root: str) -> None:
    """Copy the tar `source` to `destination` (streamed, both pax) without the members
    at or below a path of `skip`, with absolute symlink targets inside `root` made
    relative. Other members are copied as they are."""
    with (
        tarfile.open(fileobj=source, mode="r|") as reading,
        tarfile.open(fileobj=destination, mode="w|", format=tarfile.PAX_FORMAT) as writing,
    ):
        for member in reading:
            path = member_path(member.name)
            if str(path) != "." and skipped(path, skip):
                continue
            if member.issym() and member.linkname.startswith("/"):
                target = relative_target(path, member.linkname, root)
                if target is not None:
                    member.linkname = target
            data = reading.extractfile(member) if member.isreg() else None
            writing.addfile(member, data)
            if data is not None:
                data.close()
