"""The ref file: `open_session(..., ref_file=PATH)` keeps PATH holding the current ref.

So a client killed without warning (SIGKILL, OOM, a lost machine) leaves behind what a
new client needs: `resume_session(read_ref_file(PATH))`.

The file follows `sandbox.files.host`: its folder is opened once, when the session is
made (before the sandbox runs anything), and every write creates a new file (exclusive,
no symlink followed, mode 0600) under a random name relative to that folder's fd, then
renames it over PATH in one step: a reader sees the old ref or the new one, never half
of one, and a symlink planted at PATH is replaced, never followed. Writes are not
fsync'ed: they must survive the client's death, not the machine's.
"""

from __future__ import annotations

import os
import posixpath
import secrets
import stat

from ..errors import HostPathError, InvalidArgumentError
from ..files.host import HostDirectory, host_path
from .refs import MAX_REF_BYTES, SessionRef

READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC


class RefFile:
    """PATH, kept holding the session's current ref (see the module docstring)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        shown = host_path(path, what="write the ref file")
        folder, name = posixpath.split(posixpath.normpath(shown))
        if shown.endswith("/") or name in ("", ".", ".."):
            raise HostPathError(f"cannot write the ref file {shown!r}: not a file name", path=shown)
        self.path = shown
        self._name = name
        self._folder = HostDirectory.open(folder or ".", what="write the ref file in")
        self.last: SessionRef | None = None

    def write(self, ref: SessionRef) -> None:
        """Replace the file's content by `ref` (atomically). Always written, even when
        `ref` equals the last one: the file may sit where a sandboxed process can write,
        and what it put there since must not survive this client's hold."""
        data = (ref.to_json() + "\n").encode()
        temporary = f".{self._name}.{secrets.token_hex(6)}.tmp"
        fd = self._folder.create_file(temporary, what="write the ref file")
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        except OSError as exc:
            os.close(fd)
            os.unlink(temporary, dir_fd=self._folder.fd)
            raise HostPathError(
                f"cannot write the ref file {self.path!r}: {exc.strerror or exc}", path=self.path
            ) from None
        os.close(fd)
        try:
            os.rename(temporary, self._name, src_dir_fd=self._folder.fd, dst_dir_fd=self._folder.fd)
        except OSError as exc:
            os.unlink(temporary, dir_fd=self._folder.fd)
            raise HostPathError(
                f"cannot replace the ref file {self.path!r}: {exc.strerror or exc}",
                path=self.path,
            ) from None
        self.last = ref

    def remove(self) -> None:
        """Remove the file (the session it names is gone); a missing one is fine."""
        try:
            os.unlink(self._name, dir_fd=self._folder.fd)
        except FileNotFoundError:
            pass
        self.last = None

    def close(self) -> None:
        """Release the folder's fd (the file stays)."""
        self._folder.close()


def read_ref_file(path: str | os.PathLike[str]) -> SessionRef:
    """The ref a session wrote to `path` (a regular file, no symlink followed, at most
    1 MiB); `InvalidArgumentError` / `HostPathError` when it is not one."""
    shown = host_path(path, what="read the ref file")
    try:
        fd = os.open(shown, READ_FLAGS)
    except OSError as exc:
        raise HostPathError(
            f"cannot read the ref file {shown!r}: {exc.strerror or exc}", path=shown
        ) from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise HostPathError(f"cannot read the ref file {shown!r}: not a file", path=shown)
        chunks: list[bytes] = []
        size = 0
        while size <= MAX_REF_BYTES:
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    finally:
        os.close(fd)
    if size > MAX_REF_BYTES:
        raise InvalidArgumentError(f"the ref file {shown!r} is larger than 1 MiB")
    return SessionRef.from_json(b"".join(chunks))
