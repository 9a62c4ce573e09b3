"""A workspace directory on the local file system.

Files in it are opened through `backends.unix_local.safe_open`, which resolves and opens a path in
one step beneath the workspace: checking a path first and opening it afterwards would be
a race a process in the sandbox can win (by swapping a folder for a symlink meanwhile).
"""

from __future__ import annotations

import os
import tempfile

from ...backend import remove_tree
from ...errors import CleanupError, InvalidArgumentError, SandboxError

# The name of every temporary workspace begins so (a ref's `temporary` claim is checked
# against it: `durable.check_temporary`).
TEMPORARY_PREFIX = "sandbox-ws-"


class Workspace:
    """A directory that is the session's cwd and HOME; temporary ones are removed on
    `cleanup()`."""

    def __init__(self, path: str | os.PathLike[str] | None = None) -> None:
        self._given = path is not None
        self._path: str | None = os.fspath(path) if path is not None else None
        self._adopted_temporary = False

    @classmethod
    def adopted(cls, path: str, *, temporary: bool) -> Workspace:
        """An existing workspace a resumed session takes over (a temporary one is still
        removed on `cleanup()`, as by the session that made it)."""
        workspace = cls(path)
        workspace._adopted_temporary = temporary
        return workspace

    @property
    def temporary(self) -> bool:
        """Whether `cleanup()` removes it (the session made it, or adopted one made so)."""
        return not self._given or self._adopted_temporary

    @property
    def path(self) -> str:
        """The workspace's real path (available after `create()`)."""
        if self._path is None:
            raise RuntimeError("the workspace has not been created")
        return self._path

    def create(self) -> str:
        """Create the directory (a fresh temporary one when no path was given)."""
        try:
            if self._path is None or not self._given:
                self._path = tempfile.mkdtemp(prefix=TEMPORARY_PREFIX)
            else:
                os.makedirs(self._path, exist_ok=True)
                if not os.path.isdir(self._path):
                    raise NotADirectoryError(f"{self._path!r} is not a directory")
        except OSError as exc:
            # The path was fine when the session was opened; something changed since.
            raise InvalidArgumentError(
                f"the workspace {self._path!r} cannot be created: {exc.strerror or exc}"
            ) from None
        self._path = os.path.realpath(self._path)
        return self._path

    def cleanup(self) -> None:
        """Remove a temporary workspace; a given one is left as it is. Raises
        `CleanupError` when some of it cannot be removed (the path is then kept)."""
        if self.temporary and self._path is not None:
            try:
                # What the sandbox left there is hostile (deep, symlinks, FIFOs): an
                # iterative walk that follows nothing (`files.remove_tree`).
                remove_tree(self._path)
            except SandboxError as exc:
                raise CleanupError(
                    f"the temporary workspace {self._path!r} was not removed: {exc}", [exc]
                ) from None
            self._path = None

    def cwd_for(self, cwd: str | None) -> str:
        """The working directory for a command: the workspace, or `cwd` relative to it."""
        if cwd is None:
            return self.path
        return cwd if os.path.isabs(cwd) else os.path.join(self.path, cwd)
