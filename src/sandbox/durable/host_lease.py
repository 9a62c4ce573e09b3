"""A lease kept on this host, for backends whose sandbox is this host (unix_local).

One file per session in a folder only this user may use: `leases` in this user's
private state folder (`sandbox.durable.seal.state_folder()`), both made 0700 and
checked to be ours and no symlink. Nothing a sandboxed process planted in its workspace
can reach it, and no other user can take its place (a folder in the shared temporary
folder could be made first by anyone). The records are sealed all the same
(`sandbox.durable.lease`). The value is replaced by a rename (readers never see half
of one) under an advisory lock on a second file, which makes `swap` atomic between
clients on this host.
"""

from __future__ import annotations

import asyncio
import errno
import fcntl
import os
import secrets
import stat

from ..errors import HostPathError
from ..files.host import HostDirectory
from . import seal

FOLDER_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
LOCK_FLAGS = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
MAX_LEASE_BYTES = 4096
LOCK_POLL_S = 0.001


LEASES = "leases"


def _private(path: str) -> None:
    """Make `path` (0700) when missing; refuse it unless it is a folder of this user
    that nobody else may enter, reached through no symlink."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError as exc:
        raise HostPathError(
            f"cannot keep leases in {path!r}: {exc.strerror or exc}", path=path
        ) from None
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o077:
        raise HostPathError(
            f"cannot keep leases in {path!r}: it must be a folder of this user that nobody "
            "else may read or enter (not a symlink); remove it or `chmod 700` it if it is "
            "yours, or set SANDBOX_STATE_DIR to a private folder",
            path=path,
        )


def lease_folder() -> str:
    """This user's lease folder, `<state>/leases` (both made 0700 when missing, refused
    unless private and ours)."""
    state = seal.state_folder()
    parent = os.path.dirname(state)
    if parent and not os.path.isdir(parent):
        try:
            os.makedirs(parent, 0o700, exist_ok=True)
        except OSError as exc:
            raise HostPathError(
                f"cannot keep leases under {parent!r}: {exc.strerror or exc}", path=parent
            ) from None
    _private(state)
    path = os.path.join(state, LEASES)
    _private(path)
    return path


class HostLease:
    """The lease of session `session_id` (a `sandbox.durable.lease.LeaseStore`)."""

    def __init__(self, session_id: str) -> None:
        self._name = f"{session_id}.lease"
        self._lock = f"{session_id}.lock"
        self._folder: HostDirectory | None = None

    def _dir_fd(self) -> int:
        if self._folder is None:
            self._folder = HostDirectory.open(lease_folder(), what="keep a lease in")
        return self._folder.fd

    def _read_now(self) -> str | None:
        try:
            fd = os.open(self._name, READ_FLAGS, dir_fd=self._dir_fd())
        except FileNotFoundError:
            return None
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return None
            return os.read(fd, MAX_LEASE_BYTES).decode("utf-8", "replace").strip() or None
        finally:
            os.close(fd)

    async def read(self) -> str | None:
        """The lease's value (None: none was written)."""
        return self._read_now()

    async def swap(self, expected: str | None, new: str) -> str | None:
        """If the value is `expected`, replace it by `new`; return what it was."""
        lock = os.open(self._lock, LOCK_FLAGS, 0o600, dir_fd=self._dir_fd())
        try:
            while True:
                try:
                    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except OSError as exc:
                    if exc.errno not in (errno.EAGAIN, errno.EACCES):
                        raise
                # Another client holds it for a read and a rename: microseconds.
                await asyncio.sleep(LOCK_POLL_S)
            current = self._read_now()
            if current == expected:
                self._write_now(new)
            return current
        finally:
            os.close(lock)  # releases the lock

    def _write_now(self, value: str) -> None:
        folder = self._dir_fd()
        temporary = f".{self._name}.{secrets.token_hex(6)}"
        assert self._folder is not None
        fd = self._folder.create_file(temporary, what="write a lease")
        try:
            os.write(fd, value.encode() + b"\n")
        finally:
            os.close(fd)
        os.rename(temporary, self._name, src_dir_fd=folder, dst_dir_fd=folder)

    def close(self) -> None:
        """Release the folder's fd."""
        if self._folder is not None:
            self._folder.close()
            self._folder = None
