"""Files the host creates on the sandbox's behalf: recordings today (`record=`,
`record_dir`), and every state file, archive or copy target added later.

A process in the sandbox may be able to write where such a file goes (a recording kept
in the workspace, say) and plant something at its name first: a symlink to a host file
(the host would overwrite that file: a jail escape), a FIFO (a blocking open would stall
the event loop for ever), or a symlink swapped for a folder on the way. So every such
file follows these rules:

- It is only ever *created*: `O_CREAT | O_EXCL | O_NOFOLLOW` (plus `O_NONBLOCK`,
  `O_NOCTTY`, `O_CLOEXEC`), mode 0600 by default. Whatever already has its name (a
  file, a symlink, a FIFO, a device) is refused with `HostPathError` and left as it is:
  never truncated, never followed, never opened, so nothing can block. `fstat` then
  checks the new fd is a regular file.
- It is created relative to the fd of its folder (`HostDirectory`), never by a path, so
  a folder renamed or swapped for a symlink after the fd was opened cannot redirect it.
- The folder is reached in one of two ways, by who could have touched its path:
  `HostDirectory.open(path)` takes the caller's path as it is, following its symlinks,
  for a folder named and opened before any sandboxed process runs (the session opens
  `record_dir` in `start()`, before the backend starts); `HostDirectory.walk(path)`
  follows no symlink at all, for a path named while the sandbox runs (`record=`): each
  component is opened with `O_PATH | O_DIRECTORY | O_NOFOLLOW` relative to the fd of the
  one before, from `/` (absolute paths) or the current directory (relative ones). `..`
  is resolved on paper first (with no symlink followed, the kernel would resolve it the
  same way); the leading `..` of a relative path are opened like any other component.
  The caller is trusted when it names a path, what the sandbox plants later is not: a
  symlink on the way is refused with a `HostPathError` naming it, and a caller who
  trusts it names the resolved folder instead (`os.path.realpath` of the folder).
- Nothing here blocks: an `O_PATH` open never opens a FIFO or a device, and an
  exclusive create never opens what already exists.

Interface::

    with HostDirectory.open("/var/casts", what="record to") as folder:  # or .walk(...)
        if not folder.contains("1234.cast"):
            fd = folder.create_file("1234.cast")      # a new regular file; caller closes
    fd = create_new_file("out/run.cast", what="record to")  # walk + create_file

Every failure is a `HostPathError` (an `InvalidArgumentError`) whose message reads
"cannot <what> <path>: <reason>"; never a raw `OSError` or `UnicodeError`.
"""

from __future__ import annotations

import errno
import os
import posixpath
import stat
from types import TracebackType
from typing import Self

from ..errors import HostPathError

O_PATH = getattr(os, "O_PATH", 0)
DIRECTORY_FLAGS = (O_PATH or os.O_RDONLY) | os.O_DIRECTORY | os.O_CLOEXEC
NEW_FILE_FLAGS = (
    os.O_WRONLY
    | os.O_CREAT
    | os.O_EXCL
    | os.O_NOFOLLOW
    | os.O_NONBLOCK
    | os.O_NOCTTY
    | os.O_CLOEXEC
)
NEW_FILE_MODE = 0o600


def file_kind(mode: int) -> str:
    """What an `st_mode` is, in words ("a regular file", "a symlink", "a FIFO"...)."""
    if stat.S_ISREG(mode):
        return "a regular file"
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISLNK(mode):
        return "a symlink"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "not a regular file"


def host_path(path: object, *, what: str = "open") -> str:
    """`path` (a str or `os.PathLike[str]`) as a str the kernel can take: not empty, no
    NUL, encodable to bytes; else `HostPathError`."""
    value = os.fspath(path) if isinstance(path, os.PathLike) else path
    if not isinstance(value, str):
        raise HostPathError(f"cannot {what} {value!r}: the path must be a str", path=repr(value))
    if not value:
        raise HostPathError(f"cannot {what} an empty path", path=value)
    if "\0" in value:
        raise HostPathError(f"cannot {what} {value!r}: the path holds a NUL byte", path=value)
    try:
        os.fsencode(value)
    except UnicodeError:
        raise HostPathError(
            f"cannot {what} {value!r}: the path cannot be encoded for this file system",
            path=value,
        ) from None
    return value


class HostDirectory:
    """A host folder held as an fd: files are created relative to it (`create_file`),
    so a path renamed or swapped after it was opened cannot redirect them.

    Open it with `HostDirectory.open` (the path as it is) or `HostDirectory.walk` (no
    symlink followed); close it with `close()` or a `with` block. One owner: the fd is
    closed once, by whoever opened it.
    """

    def __init__(self, fd: int, path: str) -> None:
        """Use `HostDirectory.open` or `HostDirectory.walk`."""
        self.path = path
        self._fd: int | None = fd

    @classmethod
    def open(cls, path: str | os.PathLike[str], *, what: str = "open") -> HostDirectory:
        """The folder at `path` as it is now, its symlinks followed: for a path named at a
        time no sandboxed process can have planted anything on it."""
        name = host_path(path, what=what)
        try:
            fd = os.open(name, DIRECTORY_FLAGS)
        except OSError as exc:
            raise _refused(exc, name, what, component=name) from None
        return cls(fd, name)

    @classmethod
    def walk(cls, path: str | os.PathLike[str], *, what: str = "open") -> HostDirectory:
        """The folder at `path`, reached through no symlink (see the module docstring)."""
        name = host_path(path, what=what)
        return cls(_walk(name, what=what, shown=name), name)

    @property
    def fd(self) -> int:
        """The folder's fd (an `O_PATH` fd where the kernel has them)."""
        if self._fd is None:
            raise HostPathError(f"the folder {self.path!r} was closed", path=self.path)
        return self._fd

    @property
    def closed(self) -> bool:
        """True once `close()` was called."""
        return self._fd is None

    def contains(self, name: str) -> bool:
        """Whether anything (of any kind, a dangling symlink too) has `name` in it now."""
        try:
            os.stat(_component(name, self.path), dir_fd=self.fd, follow_symlinks=False)
        except FileNotFoundError:
            return False
        except (OSError, HostPathError):
            return True  # unreadable, or not a name it could hold: not free either
        return True

    def create_file(self, name: str, *, mode: int = NEW_FILE_MODE, what: str = "create") -> int:
        """Create `name` (one path component) in this folder as a new regular file and
        return its fd, open for writing (the caller owns and closes it). Anything already
        named so is refused (`HostPathError`) and left untouched."""
        shown = posixpath.join(self.path, name)
        _component(name, shown, what=what)
        return _create(self.fd, name, mode, what=what, shown=shown)

    def close(self) -> None:
        """Close the folder's fd. Idempotent."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._fd is None else "open"
        return f"<HostDirectory {self.path!r} {state}>"


def create_new_file(
    path: str | os.PathLike[str], *, mode: int = NEW_FILE_MODE, what: str = "create"
) -> int:
    """Create the file at `path` as a new regular file, its folder reached through no
    symlink, and return its fd open for writing (the caller owns and closes it).

    Refused with `HostPathError`, with nothing changed: anything already at `path`, a
    symlink or a non-folder on the way, a missing folder, a path naming a folder.
    """
    shown = host_path(path, what=what)
    normal = posixpath.normpath(shown)
    folder, name = posixpath.split(normal)
    if shown.endswith("/") or name in ("", ".", ".."):
        raise HostPathError(f"cannot {what} {shown!r}: it names a folder, not a file", path=shown)
    dir_fd = _walk(folder or ".", what=what, shown=shown)
    try:
        return _create(dir_fd, name, mode, what=what, shown=shown)
    finally:
        os.close(dir_fd)


# ---- internals ----------------------------------------------------------------------


def _component(name: str, shown: str, *, what: str = "create") -> str:
    if not name or "/" in name or name in (".", "..") or "\0" in name:
        raise HostPathError(
            f"cannot {what} {shown!r}: {name!r} is not a single file name", path=shown
        )
    return name


def _walk(path: str, *, what: str, shown: str) -> int:
    """The fd of the folder `path`, each component opened with `O_NOFOLLOW` relative to
    the one before (no symlink is followed)."""
    normal = posixpath.normpath(path)
    absolute = normal.startswith("/")
    parts = [p for p in normal.split("/") if p not in ("", ".")]
    try:
        fd = os.open("/" if absolute else ".", DIRECTORY_FLAGS)
    except OSError as exc:
        raise _refused(exc, shown, what, component="/" if absolute else ".") from None
    reached = "/" if absolute else ""
    try:
        for part in parts:
            reached = posixpath.join(reached, part)
            try:
                step = os.open(part, DIRECTORY_FLAGS | os.O_NOFOLLOW, dir_fd=fd)
            except OSError as exc:
                raise _refused(exc, shown, what, component=reached, dir_fd=fd, name=part) from None
            os.close(fd)
            fd = step
    except BaseException:
        os.close(fd)
        raise
    return fd


def _create(dir_fd: int, name: str, mode: int, *, what: str, shown: str) -> int:
    try:
        fd = os.open(name, NEW_FILE_FLAGS, mode, dir_fd=dir_fd)
    except OSError as exc:
        raise _refused(exc, shown, what, dir_fd=dir_fd, name=name, creating=True) from None
    try:
        info = os.fstat(fd)
    except OSError as exc:
        os.close(fd)
        raise _refused(exc, shown, what) from None
    if not stat.S_ISREG(info.st_mode):
        # Only a file system that ignores O_EXCL could get here; refuse what it gave.
        os.close(fd)
        raise HostPathError(
            f"cannot {what} {shown!r}: the new file is {file_kind(info.st_mode)}", path=shown
        )
    return fd


def _kind_at(dir_fd: int | None, name: str | None) -> str | None:
    if dir_fd is None or name is None:
        return None
    try:
        return file_kind(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except OSError:
        return None


def _refused(
    exc: OSError,
    shown: str,
    what: str,
    *,
    component: str | None = None,
    dir_fd: int | None = None,
    name: str | None = None,
    creating: bool = False,
) -> HostPathError:
    """The `HostPathError` for `exc`, met opening `component` (a folder on the way) or
    creating the file itself."""
    code = exc.errno
    where = f"the folder {component!r}" if component is not None else "the file"
    if creating and code == errno.EEXIST:
        existing = _kind_at(dir_fd, name) or "something"
        reason = (
            f"{existing} already exists there; a file the host creates for the sandbox "
            "is always new, never written over (move it away, or name another path)"
        )
    elif code in (errno.ENOTDIR, errno.ELOOP) and component is not None:
        found = _kind_at(dir_fd, name)
        if found == "a symlink":
            reason = (
                f"{component!r} is a symlink, and this path is reached through no symlink "
                "(one could have been planted by the sandbox): name the resolved folder, "
                "e.g. with os.path.realpath"
            )
        else:
            reason = f"{component!r} is {found}" if found else f"{component!r} is"
            reason += " not a folder" if found is None else ", not a folder"
    elif code == errno.ENOENT:
        reason = f"{where} does not exist" if component is not None else "a folder is missing"
    elif code in (errno.EACCES, errno.EPERM):
        reason = "permission denied"
    elif code == errno.ENAMETOOLONG:
        reason = "the path is too long"
    else:
        reason = os.strerror(code or 0)
    return HostPathError(f"cannot {what} {shown!r}: {reason}", path=shown)
