"""The workspace archive the SDK snapshots, made fit for it: its skip set left out, and
absolute symlinks into the workspace made relative (so our own hydrate, which refuses
absolute targets, restores them)."""

from __future__ import annotations

import posixpath
import tarfile
from collections.abc import Iterable
from pathlib import PurePosixPath
from typing import IO

from sandbox.errors import InvalidArgumentError


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


def check(source: IO[bytes]) -> None:
    """Raise `InvalidArgumentError` for an archive our hydrate would refuse (not a tar;
    a member named absolute or with `..`; a hard link, device or FIFO; a symlink whose
    target leads out; a member below a symlink member), reading it through once. The
    SDK clears the workspace before it restores a snapshot on resume: checked first, a
    snapshot that cannot land leaves the workspace as it was. The hydrate itself still
    checks everything (this is a look ahead, not the guard)."""
    links: set[PurePosixPath] = set()
    try:
        with tarfile.open(fileobj=source, mode="r|") as reading:
            for member in reading:
                _check_member(member, links)
    except tarfile.TarError as error:
        raise InvalidArgumentError(f"a malformed tar archive: {error}") from None


def _check_member(member: tarfile.TarInfo, links: set[PurePosixPath]) -> None:
    name = member.name
    path = member_path(name)
    if name.startswith("/") or ".." in PurePosixPath(name).parts:
        raise _refused(name, "it leads out of the workspace")
    if any(parent in links for parent in path.parents):
        raise _refused(name, "it goes through a symlink the archive made")
    if member.islnk():
        raise _refused(name, "hard links are not accepted")
    if member.isdev() or member.isfifo():
        raise _refused(name, "devices and FIFOs are not accepted")
    if member.issym():
        target = member.linkname
        joined = posixpath.normpath(posixpath.join(posixpath.dirname(str(path)), target))
        if target.startswith("/") or joined == ".." or joined.startswith("../"):
            raise _refused(name, f"a symlink leading out ({target!r})")
        links.add(path)


def _refused(name: str, why: str) -> InvalidArgumentError:
    # The extractor's words, so the SDK error names the member the same way.
    return InvalidArgumentError(f"archive member {name[:200]!r} refused: {why}")
