"""Removing a tree a sandbox made: iterative, relative to folder fds, following nothing.

What runs in a sandbox is hostile: it can make a tree thousands of levels deep, swap a
folder for a symlink to a host folder just before it is opened, leave FIFOs, or keep
writing while the tree is removed. `shutil.rmtree` recurses on the Python stack (a
1,200-level tree raises `RecursionError`) and its fd walk keeps one fd per level. Here:

- the walk is a loop over an explicit stack of frames, never a recursion;
- every folder is opened relative to its parent's fd with `O_NOFOLLOW | O_DIRECTORY`
  (`O_NONBLOCK`: a FIFO swapped in cannot block the open), and every name is removed
  with `unlinkat`/`rmdir` relative to its folder's fd: a symlink is removed as a link,
  never followed, wherever it points;
- at most `WINDOW` of the deepest folders and `CHECKPOINTS` folders higher up keep their
  fd open. A folder whose fd was closed is opened again, when the walk climbs back to
  it, by name from the nearest open folder above, each step checked against the
  `(st_dev, st_ino)` it had: a tree changed under the walk is scanned again from the
  last folder still known, never entered through something else. Checkpoints sit
  every `stride` levels, the stride doubling as the tree gets deeper, so a climb never
  walks down far and the fds stay bounded;
- the walk stays on the file system of the tree's top: a mount point below it is not
  entered (its content is not the sandbox's to lose) and is reported;
- names that vanish meanwhile are fine; a folder that fills up again is scanned again,
  at most `RESCANS` times in all; what cannot be removed is skipped, the rest removed,
  and one `SandboxError` then names the first few failures (`MAX_FAILURES` stop it).

Blocking: callers run it in a thread (`asyncio.to_thread`).
"""

from __future__ import annotations

import errno
import os
import posixpath
from dataclasses import dataclass, field

from ..errors import SandboxError

OPEN_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
WINDOW = 32  # the deepest folders keep their fds: the walk goes down and up among them
CHECKPOINTS = 64  # at most this many fds higher up, one every `stride` levels
BATCH = 64  # subfolder names taken from one scan before going down into them
RESCANS = 10_000  # folders found filled again after their scan (a writer racing us)
MAX_FAILURES = 1_000  # names that could not be removed before the walk gives up
SHOWN_FAILURES = 3  # failures the error message names


class TreeRemovalError(SandboxError):
    """Some of a tree could not be removed (the rest was): `failures` holds each path
    (relative to the top's folder) and the reason."""

    def __init__(self, message: str, failures: list[tuple[str, str]]) -> None:
        super().__init__(message)
        self.failures = failures


@dataclass
class _Frame:
    """One folder on the walk's stack: its name in the folder above, its identity, its
    fd (None while closed to bound the fds), the subfolders its last scan found."""

    name: str
    ident: tuple[int, int]
    fd: int | None
    pending: list[str] = field(default_factory=list)
    skip: set[str] = field(default_factory=set)  # names that failed: not tried again
    failed: bool = False  # something below could not be removed: no rmdir


class _Walk:
    def __init__(self, top_fd: int, shown: str, device: int) -> None:
        self.stack: list[_Frame] = []
        self.top_fd = top_fd  # the folder that holds the tree's top (not ours to close)
        self.shown = shown
        self.base = posixpath.dirname(shown)  # what the names on the stack are shown under
        self.device = device
        self.stride = WINDOW
        self.rescans = 0
        self.failures: list[tuple[str, str]] = []

    # ---- fds -------------------------------------------------------------------------

    def fd_of(self, depth: int) -> int:
        """The fd of the folder holding stack[depth] (the top's folder for depth 0)."""
        if depth == 0:
            return self.top_fd
        fd = self.stack[depth - 1].fd
        assert fd is not None
        return fd

    def keeps(self, depth: int) -> bool:
        """Whether stack[depth] keeps its fd open now."""
        return depth == 0 or depth >= len(self.stack) - WINDOW or depth % self.stride == 0

    def trim(self) -> None:
        """Close the fds the stack may no longer hold (after a step down)."""
        while (len(self.stack) - WINDOW) // self.stride > CHECKPOINTS:
            self.stride *= 2
            for depth, frame in enumerate(self.stack):
                if frame.fd is not None and not self.keeps(depth):
                    os.close(frame.fd)
                    frame.fd = None
        depth = len(self.stack) - WINDOW - 1
        if depth > 0 and not self.keeps(depth):
            frame = self.stack[depth]
            if frame.fd is not None:
                os.close(frame.fd)
                frame.fd = None

    def reopen(self) -> bool:
        """Give the deepest frame its fd back, walking down by name from the nearest
        open folder above; frames that are no longer what they were are dropped (the
        last one still known scans again). False when the deepest frame changed."""
        target = len(self.stack) - 1
        start = target
        while self.stack[start].fd is None:
            start -= 1
        for depth in range(start + 1, target + 1):
            frame = self.stack[depth]
            try:
                fd = os.open(frame.name, OPEN_FLAGS, dir_fd=self.fd_of(depth))
            except OSError:
                fd = None
            if fd is not None and _ident(fd) != frame.ident:
                os.close(fd)
                fd = None
            if fd is None:
                # Moved or swapped meanwhile: what is there now is found by a new scan.
                self.drop_below(depth - 1)
                return False
            frame.fd = fd
            above = self.stack[depth - 1]
            if depth - 1 > start and above.fd is not None and not self.keeps(depth - 1):
                os.close(above.fd)  # only needed to open this one
                above.fd = None
        return True

    def drop_below(self, depth: int) -> None:
        """Pop every frame deeper than `depth` (closing its fd); stack[depth] scans
        again."""
        while len(self.stack) > depth + 1:
            frame = self.stack.pop()
            if frame.fd is not None:
                os.close(frame.fd)
        self.stack[depth].pending.clear()

    def close_all(self) -> None:
        """Close every fd still open (at the end, or on the way out of an error)."""
        for frame in self.stack:
            if frame.fd is not None:
                os.close(frame.fd)
                frame.fd = None
        self.stack.clear()

    # ---- failures --------------------------------------------------------------------

    def path_of(self, name: str) -> str:
        """`name` in the deepest folder, shown from the top (for messages)."""
        path = posixpath.join(self.base, *(f.name for f in self.stack[1:]), name)
        return path.rstrip("/") or "/"

    def fail(self, name: str, reason: str) -> None:
        """`name` in the deepest folder cannot be removed: skip it, keep its folders."""
        frame = self.stack[-1]
        frame.skip.add(name)
        frame.failed = True
        self.note(self.path_of(name), reason)

    def note(self, path: str, reason: str) -> None:
        """Record a failure; too many end the walk."""
        self.failures.append((path, reason))
        if len(self.failures) >= MAX_FAILURES:
            raise self.error()

    def error(self) -> TreeRemovalError:
        """The error naming what could not be removed."""
        shown = "; ".join(f"{path!r}: {reason}" for path, reason in self.failures[:SHOWN_FAILURES])
        more = len(self.failures) - SHOWN_FAILURES
        tail = f" (and {more} more)" if more > 0 else ""
        return TreeRemovalError(
            f"could not remove all of {self.shown!r}: {shown}{tail}", list(self.failures)
        )

    # ---- the walk --------------------------------------------------------------------

    def scan(self) -> None:
        """Read the deepest folder from its start: remove every non-folder, note up to
        `BATCH` subfolders to go down into."""
        frame = self.stack[-1]
        fd = frame.fd
        assert fd is not None
        os.lseek(fd, 0, os.SEEK_SET)
        with os.scandir(fd) as entries:
            for entry in entries:
                name = entry.name
                if name in frame.skip:
                    continue
                try:
                    is_dir = entry.is_dir(follow_symlinks=False)
                except OSError:
                    continue  # gone meanwhile
                if is_dir:
                    frame.pending.append(name)
                    if len(frame.pending) >= BATCH:
                        return
                else:
                    self.unlink(name)

    def unlink(self, name: str) -> None:
        """Remove the non-folder `name` of the deepest folder (a link, not its target)."""
        fd = self.stack[-1].fd
        try:
            os.unlink(name, dir_fd=fd)
        except FileNotFoundError:
            pass
        except IsADirectoryError:
            self.stack[-1].pending.append(name)  # swapped for a folder meanwhile
        except OSError as exc:
            self.fail(name, os.strerror(exc.errno or 0))

    def descend(self, name: str) -> None:
        """Go down into the subfolder `name` of the deepest folder."""
        parent = self.stack[-1]
        assert parent.fd is not None
        try:
            fd = os.open(name, OPEN_FLAGS, dir_fd=parent.fd)
        except FileNotFoundError:
            return
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                self.unlink(name)  # a symlink or a file now: removed as such
            else:
                self.fail(name, os.strerror(exc.errno or 0))
            return
        ident = _ident(fd)
        if ident[0] != self.device:
            os.close(fd)
            self.fail(name, "a mount point (another file system), not entered")
            return
        self.stack.append(_Frame(name, ident, fd))
        self.trim()

    def climb(self) -> None:
        """The deepest folder is empty: close it and remove it from the one above."""
        frame = self.stack.pop()
        if frame.fd is not None:
            os.close(frame.fd)
        if not self.stack:
            return
        parent = self.stack[-1]
        if parent.fd is None and not self.reopen():
            return
        if frame.failed:
            parent.failed = True
            parent.skip.add(frame.name)
            return
        try:
            os.rmdir(frame.name, dir_fd=parent.fd)
        except FileNotFoundError:
            pass
        except OSError as exc:
            if exc.errno != errno.ENOTEMPTY:
                self.fail(frame.name, os.strerror(exc.errno or 0))
                return
            # Filled again after its scan (a writer still at work): scanned again.
            self.rescans += 1
            if self.rescans > RESCANS:
                self.fail(frame.name, "it kept being filled while it was removed")
                return
            parent.pending.append(frame.name)

    def run(self, name: str) -> None:
        """Remove `name` (in the top's folder) and everything below it."""
        self.stack.append(_Frame("", (0, 0), self.top_fd))  # the top's folder itself
        try:
            self.descend(name)
            while len(self.stack) > 1:
                frame = self.stack[-1]
                if frame.pending:
                    self.descend(frame.pending.pop())
                    continue
                try:
                    self.scan()
                except OSError as exc:
                    # The folder cannot be read: it stays, and so do the folders above.
                    frame.failed = True
                    frame.pending.clear()
                    self.note(self.path_of(""), os.strerror(exc.errno or 0))
                if not self.stack[-1].pending:
                    self.climb()
        finally:
            self.stack[:1] = [_Frame("", (0, 0), None)]  # the top's folder is the caller's
            self.close_all()
        if self.failures:
            raise self.error()


def _ident(fd: int) -> tuple[int, int]:
    info = os.fstat(fd)
    return info.st_dev, info.st_ino


def remove_tree_at(dir_fd: int, name: str, *, shown: str | None = None) -> None:
    """Remove `name` in the folder `dir_fd` and, if it is a folder, everything below it
    (see the module docstring); a name already gone is fine. `shown` names the tree in
    messages. Raises `TreeRemovalError` when something could not be removed."""
    shown = name if shown is None else shown
    if "/" in name or name in ("", ".", ".."):
        raise SandboxError(f"cannot remove {shown!r}: not a single name")
    try:
        info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise TreeRemovalError(
            f"could not remove {shown!r}: {os.strerror(exc.errno or 0)}",
            [(shown, os.strerror(exc.errno or 0))],
        ) from None
    walk = _Walk(dir_fd, posixpath.dirname(shown), info.st_dev)
    walk.run(name)


def remove_tree(path: str) -> None:
    """Remove the host path `path` and everything below it, the last name not followed
    (a symlink there is removed as a link); a path already gone is fine. Its folder is
    the host's own (opened following links); everything below is the sandbox's.
    Raises `TreeRemovalError` when something could not be removed."""
    path = os.path.abspath(path)
    folder, name = posixpath.split(path)
    try:
        fd = os.open(folder or "/", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise TreeRemovalError(
            f"could not remove {path!r}: {os.strerror(exc.errno or 0)}",
            [(path, os.strerror(exc.errno or 0))],
        ) from None
    try:
        remove_tree_at(fd, name, shown=path)
    finally:
        os.close(fd)


def discard_tree(path: str) -> None:
    """`remove_tree`, what cannot be removed left where it is: the teardown of the
    stand-in servers (`sandbox.testing`), which hold trees their sandboxes made."""
    try:
        remove_tree(path)
    except SandboxError:
        pass
