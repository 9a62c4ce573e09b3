"""Opening a regular file inside a directory without ever leaving it, race-free.

Checking a path and then opening it is a race: between the two, a process in the sandbox
can swap a folder for a symlink to a host folder. Here the path is resolved and opened
in ONE step relative to a directory fd of the root, so no link can lead out of it:

- with `openat2(RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS)` where the kernel has it
  (Linux 5.6+): the kernel refuses, atomically, any resolution that leaves the root;
- else by a walk: one component at a time, each opened with `O_NOFOLLOW` relative to
  the fd of the folder before it, `..` handled on our own stack of folder fds (never
  above the root), symlinks read with `readlinkat` and followed by us.

Both follow the same rules: symlinks are followed while they stay inside the root
(`..` may climb back up, never above the root). A relative target is followed by
either; an absolute one only when it names a place under the root's own path (a jail
shows the workspace at the same path as the host), and then by the walk: openat2
refuses every absolute link (EXDEV), and the walk takes over from the root's fd.
`/proc`-style magic links are refused. A path whose `..` climbs above the root on paper
is refused before anything is opened.

Only regular files are opened: the open uses `O_NONBLOCK` (a FIFO cannot block it),
then `fstat` on the opened fd refuses anything else with `NotAFileError`. A write opens
without `O_TRUNC`; the caller truncates with `ftruncate` only after that check. Missing
parent folders of a write are made one at a time with `mkdirat` relative to the fd of
the folder above. Every failure is a `SandboxError` naming the path.
"""

from __future__ import annotations

import ctypes
import errno
import os
import posixpath
import stat
import threading
from collections.abc import Callable
from dataclasses import dataclass

from ...backend import DIRECTORY_FLAGS, file_kind
from ...errors import (
    FileTooLargeError,
    InvalidArgumentError,
    NotAFileError,
    SandboxError,
    SandboxFileNotFoundError,
    WorkspacePathError,
)

SYS_OPENAT2 = 437  # the same number on every architecture Linux added it to
RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_BENEATH = 0x08
MAX_SYMLINKS = 40  # the kernel's own limit
RETRIES = 16  # EAGAIN from openat2, or a folder changing under a walk
READ_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
WRITE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
DIR_FLAGS = DIRECTORY_FLAGS
READ_STEP = 1024 * 1024


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


_probe_lock = threading.Lock()
_openat2_works: bool | None = None


def openat2_available() -> bool:
    """Whether this kernel (and seccomp profile) lets us call openat2; probed once."""
    global _openat2_works
    with _probe_lock:
        if _openat2_works is None:
            try:
                os.close(_openat2(-100, "/", DIR_FLAGS, 0, 0))  # -100: AT_FDCWD
                _openat2_works = True
            except OSError:
                # ENOSYS (old kernel), EPERM (a seccomp profile that predates it), or no
                # syscall() in this libc: the walk does the same job.
                _openat2_works = False
        return _openat2_works


def _syscall() -> Callable[..., int]:
    global _syscall_function
    if _syscall_function is None:
        try:
            # Our own CDLL object: setting restype never touches anyone else's syscall().
            function = ctypes.CDLL(None, use_errno=True).syscall
        except (OSError, AttributeError) as exc:
            raise OSError(errno.ENOSYS, "no syscall() in this libc") from exc
        function.restype = ctypes.c_long
        _syscall_function = function
    return _syscall_function


_syscall_function: Callable[..., int] | None = None


def _openat2(dirfd: int, path: str, flags: int, mode: int, resolve: int) -> int:
    syscall = _syscall()
    how = _OpenHow(flags, mode, resolve)
    fd = syscall(
        ctypes.c_long(SYS_OPENAT2),
        ctypes.c_int(dirfd),
        ctypes.c_char_p(os.fsencode(path)),
        ctypes.byref(how),
        ctypes.c_size_t(ctypes.sizeof(how)),
    )
    if fd < 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code), path)
    return int(fd)


@dataclass(frozen=True)
class OpenedFile:
    """An fd of a regular file (the caller closes it) and its size when opened."""

    fd: int
    size: int


def relative_inside(root: str, path: str) -> str:
    """`path` relative to `root`: a relative path as it is, an absolute one only when it
    is `root` or under it (else `WorkspacePathError`); a path whose `..` climbs above
    the root on paper is refused too. `root` must be a real (symlink-free) path."""
    if os.path.isabs(path):
        prefix = root.rstrip("/") + "/"
        if path != root and not path.startswith(prefix):
            raise _outside(root, path)
        rel = path[len(prefix) :] if path.startswith(prefix) else ""
    else:
        rel = path
    normal = posixpath.normpath(rel or ".")
    if normal == ".." or normal.startswith("../"):
        raise _outside(root, path)
    return rel or "."


def _outside(root: str, path: str) -> WorkspacePathError:
    return WorkspacePathError(f"path {path!r} is outside the workspace; use a path inside {root}")


def open_regular(root: str, path: str, *, write: bool, resolver: str = "auto") -> OpenedFile:
    """Open `path` (relative to `root`, or absolute inside it) as a regular file.

    For a write the file is created (mode 0666 less the umask) with its missing parent
    folders, and never truncated here: truncate the fd once you hold it. `resolver` is
    "auto" (openat2 where available), "openat2" or "walk" (tests use it to exercise the
    fallback on a kernel that has openat2). Raises only `SandboxError` subclasses.
    """
    rel = relative_inside(root, path)
    if write and (path.endswith("/") or posixpath.basename(posixpath.normpath(rel)) in ("", ".")):
        raise NotAFileError(f"cannot write {path!r}: it names a folder, not a file")
    use_openat2 = resolver == "openat2" or (resolver == "auto" and openat2_available())
    try:
        root_fd = os.open(root, DIR_FLAGS)
    except OSError as exc:
        raise open_error(exc, path, write=write) from None
    try:
        if use_openat2:
            try:
                fd = _open_openat2(root_fd, rel, write=write)
            except OSError as exc:
                if exc.errno != errno.EXDEV:
                    raise
                # Out of the root, or through an absolute symlink, which may lead back
                # in: the walk tells (and is as safe).
                fd = _open_walk(root_fd, rel, write=write, root=root)
        else:
            fd = _open_walk(root_fd, rel, write=write, root=root)
    except OSError as exc:
        raise open_error(exc, path, write=write) from None
    finally:
        os.close(root_fd)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise NotAFileError(f"{path!r} is {file_kind(info.st_mode)}, not a regular file")
    except BaseException:
        os.close(fd)
        raise
    return OpenedFile(fd=fd, size=info.st_size)


# ---- openat2 ------------------------------------------------------------------------


def _beneath(root_fd: int, rel: str, flags: int, mode: int = 0) -> int:
    for _ in range(RETRIES):
        try:
            return _openat2(root_fd, rel, flags, mode, RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS)
        except OSError as exc:
            # EAGAIN: a rename raced a `..` in the path; the kernel asks for a retry.
            if exc.errno != errno.EAGAIN:
                raise
    raise OSError(errno.EAGAIN, os.strerror(errno.EAGAIN), rel)


def _open_openat2(root_fd: int, rel: str, *, write: bool) -> int:
    if not write:
        return _beneath(root_fd, rel, READ_FLAGS)
    try:
        return _beneath(root_fd, rel, WRITE_FLAGS, 0o666)
    except FileNotFoundError:
        pass  # a parent folder is missing: make them, then try once more
    _make_parents_openat2(root_fd, rel)
    return _beneath(root_fd, rel, WRITE_FLAGS, 0o666)


def _make_parents_openat2(root_fd: int, rel: str) -> None:
    parts = [p for p in posixpath.dirname(rel).split("/") if p not in ("", ".")]
    for k in range(1, len(parts) + 1):
        try:
            os.close(_beneath(root_fd, "/".join(parts[:k]), DIR_FLAGS))
            continue
        except FileNotFoundError:
            if parts[k - 1] == "..":
                raise
        # mkdirat relative to the folder above, itself resolved beneath the root: the
        # new folder is inside whatever a process does to the names on the way.
        above = _beneath(root_fd, "/".join(parts[: k - 1]) or ".", DIR_FLAGS)
        try:
            os.mkdir(parts[k - 1], 0o777, dir_fd=above)
        except FileExistsError:
            pass  # made meanwhile, or a dangling symlink: the final open tells
        finally:
            os.close(above)


# ---- the walk -----------------------------------------------------------------------


def _open_walk(root_fd: int, rel: str, *, write: bool, root: str, directory: bool = False) -> int:
    # A stack of (name, from_link): only names of the path itself may be made as
    # folders, never names from a symlink's target (as with openat2, which never
    # creates through a link).
    pending = [(p, False) for p in reversed(rel.split("/")) if p not in ("", ".")]
    if rel.endswith("/") and pending:
        # A trailing slash: the last name must be a folder ("/" is never a real name).
        pending.insert(0, ("/", False))
    stack = [os.open(".", DIR_FLAGS, dir_fd=root_fd)]
    links = 0
    made = 0
    try:
        while pending:
            name, from_link = pending.pop()
            if name == "/":
                raise OSError(errno.EISDIR, os.strerror(errno.EISDIR), rel)
            if name == "..":
                if len(stack) == 1:
                    raise OSError(errno.EXDEV, "a path climbs above the root", rel)
                os.close(stack.pop())
                continue
            here = stack[-1]
            final = not pending
            try:
                if final:
                    flags = (WRITE_FLAGS if write else READ_FLAGS) | os.O_NOFOLLOW
                    if directory:
                        flags = DIR_FLAGS | os.O_NOFOLLOW
                    return os.open(name, flags, 0o666, dir_fd=here)
                stack.append(os.open(name, DIR_FLAGS | os.O_NOFOLLOW, dir_fd=here))
                continue
            except FileNotFoundError as exc:
                if not write or final or from_link or made >= RETRIES * MAX_SYMLINKS:
                    raise
                made += 1
                try:
                    os.mkdir(name, 0o777, dir_fd=here)
                except FileExistsError:
                    # A dangling symlink (never made through) or a name made meanwhile:
                    # the first failure stands.
                    raise exc from None
                pending.append((name, from_link))
                continue
            except OSError as exc:
                # A symlink: ELOOP (last name) or ENOTDIR (a folder on the way).
                if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                    raise
                target = _link_target(name, here, exc)
            links += 1
            if links > MAX_SYMLINKS:
                raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), rel)
            if target.startswith("/"):
                inside = _under(root, target)
                if inside is None:
                    raise OSError(errno.EXDEV, "an absolute symlink out of the root", rel)
                # Start again from the root's own fd (never from its path).
                while len(stack) > 1:
                    os.close(stack.pop())
                target = inside
            pending.extend((p, True) for p in reversed(target.split("/")) if p not in ("", "."))
        # The path ends at a folder ("a/..", or the root itself).
        if directory:
            return os.dup(stack[-1])
        raise OSError(errno.EISDIR, os.strerror(errno.EISDIR), rel)
    finally:
        for fd in stack:
            os.close(fd)


def _under(root: str, target: str) -> str | None:
    """`target` (absolute) relative to `root` when it names `root` or a place under it."""
    prefix = root.rstrip("/") + "/"
    if target == root or target == prefix.rstrip("/"):
        return "."
    return target[len(prefix) :] if target.startswith(prefix) else None


def _link_target(name: str, here: int, failure: OSError) -> str:
    """The target of the symlink `name` in the folder `here`, or `failure` re-raised when
    `name` is not a symlink (a file in the way, a missing name)."""
    try:
        return os.readlink(name, dir_fd=here)
    except OSError as exc:
        if exc.errno == errno.EINVAL:  # not a symlink (any more): the open's failure stands
            raise failure from None
        raise


# ---- errors and bounded reading -----------------------------------------------------


def open_error(exc: OSError, path: str, *, write: bool) -> SandboxError:
    """The `SandboxError` for an `OSError` met while opening `path`."""
    code = exc.errno
    if code == errno.EXDEV:
        return WorkspacePathError(
            f"path {path!r} is outside the workspace (a symlink or `..` on the way leads out)"
        )
    if code == errno.ENOENT:
        return SandboxFileNotFoundError(f"no such file in the workspace: {path!r}")
    if code == errno.ENOTDIR:
        if write:
            return NotAFileError(f"cannot write {path!r}: a parent on its path is not a folder")
        return SandboxFileNotFoundError(
            f"no such file in the workspace: {path!r} (a parent on its path is not a folder)"
        )
    if code == errno.EISDIR:
        return NotAFileError(f"{path!r} is a directory, not a regular file")
    if code == errno.ELOOP:
        return NotAFileError(f"{path!r}: too many levels of symbolic links")
    if code in (errno.ENXIO, errno.ENODEV, errno.ETXTBSY, errno.EOPNOTSUPP):
        # ENXIO: a FIFO without a reader, or a socket, opened for writing.
        return NotAFileError(f"{path!r} is not a regular file (a FIFO, socket or device)")
    if code == errno.ENAMETOOLONG:
        return InvalidArgumentError(f"path {path!r} is too long")
    if code in (errno.EACCES, errno.EPERM):
        return SandboxError(f"permission denied: {path!r}")
    if code == errno.EAGAIN:
        return SandboxError(f"{path!r} kept changing while being opened", retryable=True)
    verb = "write" if write else "read"
    return SandboxError(f"cannot {verb} {path!r}: {os.strerror(code or 0)}")


def io_error(exc: OSError, path: str, *, write: bool) -> SandboxError:
    """The `SandboxError` for an `OSError` from reading or writing an open file."""
    verb = "write" if write else "read"
    return SandboxError(f"cannot {verb} {path!r}: {os.strerror(exc.errno or 0)}")


def read_bounded(opened: OpenedFile, path: str, limit: int) -> bytes:
    """The whole file, refusing it above `limit` bytes: by its size before reading, and
    by what it holds while reading (it may grow), never reading more than limit + 1."""
    if opened.size > limit:
        raise FileTooLargeError.over(path, opened.size, limit)
    parts: list[bytes] = []
    total = 0
    ask = opened.size + 1  # one read of the known size, plus a byte that shows growth
    try:
        while total <= limit:
            piece = os.read(opened.fd, min(ask, limit + 1 - total))
            if not piece:
                break
            parts.append(piece)
            total += len(piece)
            ask = READ_STEP
    except OSError as exc:
        raise io_error(exc, path, write=False) from None
    if total > limit:
        raise FileTooLargeError.over(path, None, limit)
    return parts[0] if len(parts) == 1 else b"".join(parts)


def write_all(fd: int, data: bytes | memoryview, path: str) -> None:
    """Write every byte of `data` at the fd's position."""
    view = memoryview(data)
    try:
        while view:
            view = view[os.write(fd, view) :]
    except OSError as exc:
        raise io_error(exc, path, write=True) from None


def open_directory_raw(root_fd: int, rel: str, *, root: str, resolver: str = "auto") -> int:
    """An fd of the folder `rel` (checked with `relative_inside`) beneath `root_fd`, by
    the same rules as `open_regular` (symlinks followed inside the root); raises the
    `OSError` (EXDEV: it leads out) for the caller to explain."""
    use_openat2 = resolver == "openat2" or (resolver == "auto" and openat2_available())
    if use_openat2:
        try:
            return _beneath(root_fd, rel, DIR_FLAGS)
        except OSError as exc:
            if exc.errno != errno.EXDEV:
                raise
    return _open_walk(root_fd, rel, write=False, root=root, directory=True)
