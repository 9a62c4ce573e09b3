"""File operations through a POSIX shell in the sandbox, for providers whose file API
has no call for them (listing, stat with modes, removal, symlinks, modes).

The path is checked lexically against the workspace first (`toolkit.paths`); the
script then enters the folder that holds the name with `cd -P` (symlinks resolved by
the sandbox's kernel) and refuses to act unless `pwd -P` is the workspace or under it,
so a symlink on the way that leads out is a `WorkspacePathError`, and the final name
is never followed (`stat` without `-L`, `rm` on the name itself). Output is
NUL-separated (any file name survives) and bounded by the exec's output limit.
Needs `stat`, `readlink`, `rm`, `rmdir`, `mkdir`, `ln`, `chmod` (coreutils or busybox).
"""

from __future__ import annotations

import math
import posixpath
import shlex
from collections.abc import Awaitable, Callable

from ..errors import (
    InvalidArgumentError,
    NotAFileError,
    SandboxError,
    SandboxFileNotFoundError,
    WorkspacePathError,
)
from ..session.capabilities import WorkspaceAccess
from ..types import ExecResult
from .info import FileInfo, child_path, kind_of_mode

MAX_LISTING_BYTES = 32 * 1024 * 1024
MAX_STAT_SIZE = 1 << 48  # a size a `stat` answer may give (the tar reader's bound too)
TIMEOUT_S = 120.0

# Exit codes of the script, each one error.
_MISSING, _OUTSIDE, _STAT, _NOT_DIR, _NOT_EMPTY, _EXISTS, _MKDIR, _IN_THE_WAY = range(91, 99)

_PRELUDE = r"""
set -u
cd -P -- "$1" 2>/dev/null || exit 90
W=$(pwd -P); W=${W%/}
inside() { case "$1/" in "$W"/*) return 0;; esac; return 1; }
enter() { cd -P -- "$1" 2>/dev/null || exit 91; inside "$(pwd -P)" || exit 92; }
exists() { [ -e "$1" ] || [ -L "$1" ]; }
entry() {
  s=$(stat -c '%f %s %Y' -- "$1" 2>/dev/null) || exit 93
  t=
  if [ -L "$1" ]; then t=$(readlink -- "$1") || exit 93; fi
  printf '%s\0%s\0%s\0' "$s" "$2" "$t"
}
"""

_SCRIPTS = {
    "stat": r'enter "$2"; if [ "$3" = . ]; then entry . .; else exists "$3" || exit 91; '
    r'entry "$3" "$3"; fi',
    "list": r'[ -d "$2" ] || { exists "$2" && exit 94; exit 91; }; enter "$2"; '
    r'for f in * .[!.]* ..?*; do exists "$f" || continue; entry "$f" "$f"; done',
    "remove": r'enter "$2"; exists "$3" || exit 91; '
    r'if [ -d "$3" ] && [ ! -L "$3" ]; then '
    r'if [ "$4" = 1 ]; then rm -rf -- "$3" || exit 93; else rmdir -- "$3" 2>/dev/null || exit 95; '
    r'fi; else rm -f -- "$3" || exit 93; fi',
    "mkdir": r'p=$2; shift 2; n=$#; i=0; for c in "$@"; do i=$((i+1)); '
    r'if [ -d "$c" ]; then [ "$p" = 1 ] || [ "$i" -lt "$n" ] || exit 96; '
    r'elif exists "$c"; then exit 98; '
    r'else [ "$p" = 1 ] || [ "$i" -eq "$n" ] || exit 91; mkdir -- "$c" 2>/dev/null || exit 97; fi; '
    r'enter "$c"; done',
    "symlink": r'enter "$2"; if [ -d "$3" ] && [ ! -L "$3" ]; then exit 98; fi; '
    r'rm -f -- "$3" && ln -s -- "$4" "$3" || exit 97',
    "chmod": r'enter "$2"; [ -L "$3" ] && exit 0; chmod "$4" -- "$3" || exit 93',
}


class ShellFileOps:
    """The file operations of a session whose workspace is `workspace` (absolute), run
    through `run` (`session.exec`, or a backend's own exec)."""

    def __init__(
        self,
        run: Callable[..., Awaitable[ExecResult]],
        workspace: str,
        shell_root: str | None = None,
    ) -> None:
        self._run = run
        self._workspace = posixpath.normpath(workspace)
        # Where the script finds the workspace: its path, or "." where the commands'
        # working directory is the workspace under another name (a stand-in's folder).
        self._shell_root = shell_root or self._workspace

    def _split(self, path: str) -> tuple[str, str]:
        """(the folder holding the name, the name) for `path` (checked); the workspace
        itself is (workspace, ".")."""
        from ..backends.toolkit.paths import within_workspace

        full = within_workspace(path, self._workspace)
        if full == self._workspace:
            return ".", "."
        relative = full[len(self._workspace) :].lstrip("/")
        return posixpath.dirname(relative) or ".", posixpath.basename(relative)

    async def _script(self, op: str, path: str, *args: str) -> bytes:
        command = " ".join(
            ["sh", "-c", shlex.quote(_PRELUDE + _SCRIPTS[op]), "sh", shlex.quote(self._shell_root)]
            + [shlex.quote(arg) for arg in args]
        )
        result = await self._run(command, timeout=TIMEOUT_S, max_output_bytes=MAX_LISTING_BYTES)
        if result.stdout_omitted:
            raise SandboxError(f"the listing of {path!r} is above {MAX_LISTING_BYTES} bytes")
        code = result.exit_code
        if code == 0:
            return result.stdout
        raise _error(code, path, result.stderr)

    async def stat(self, path: str) -> FileInfo:
        """The entry at `path`, not followed."""
        folder, name = self._split(path)
        out = await self._script("stat", path, folder, name)
        infos = _parse(out, "")
        if len(infos) != 1:
            raise SandboxError(f"cannot stat {path!r}: the sandbox's stat answered nothing")
        info = infos[0]
        shown = posixpath.basename(posixpath.normpath(path)) if name == "." else name
        return FileInfo(shown, path, info.kind, info.size, info.mode, info.mtime, info.link_target)

    async def list_dir(self, path: str) -> list[FileInfo]:
        """The entries of the directory `path` (symlinks to folders inside are followed)."""
        folder, name = self._split(path)
        target = "." if name == "." else posixpath.join(folder, name)
        return _parse(await self._script("list", path, target), path)

    async def remove(self, path: str, recursive: bool) -> None:
        """Remove the name `path` (a folder only when empty, unless `recursive`)."""
        folder, name = self._split(path)
        if name == ".":
            raise InvalidArgumentError("cannot remove the workspace itself")
        await self._script("remove", path, folder, name, "1" if recursive else "0")

    async def make_dir(self, path: str, parents: bool) -> None:
        """Make the folder `path` (and missing parents with `parents`)."""
        from ..backends.toolkit.paths import within_workspace

        full = within_workspace(path, self._workspace)
        parts = [p for p in full[len(self._workspace) :].split("/") if p]
        if not parts:
            if parents:
                return
            raise InvalidArgumentError(f"{path!r} exists (it is the workspace)")
        await self._script("mkdir", path, "1" if parents else "0", *parts)

    async def make_symlink(self, path: str, target: str) -> None:
        """Make (or replace) the symlink `path` pointing at `target`."""
        folder, name = self._split(path)
        await self._script("symlink", path, folder, name, target)

    async def set_mode(self, path: str, mode: int) -> None:
        """Set the permission bits of `path` (a symlink is left alone)."""
        folder, name = self._split(path)
        await self._script("chmod", path, folder, name, format(mode & 0o7777, "o"))


def _parse(out: bytes, parent: str) -> list[FileInfo]:
    fields = out.split(b"\0")
    infos: list[FileInfo] = []
    for k in range(0, len(fields) - 2, 3):
        try:
            raw_mode, size, mtime = fields[k].split()
            mode = int(raw_mode, 16)
            name = fields[k + 1].decode("utf-8", "surrogateescape")
            link = fields[k + 2].decode("utf-8", "surrogateescape")
            kind = kind_of_mode(mode)
            # The answer is the sandbox's: a size or an mtime no file can have (a `stat`
            # that says -1) must not reach a tar header or a loop on the host.
            if not 0 <= int(size) <= MAX_STAT_SIZE or not math.isfinite(float(mtime)):
                raise ValueError(size)
            infos.append(
                FileInfo(
                    name,
                    child_path(parent, name),
                    kind,
                    int(size),
                    mode & 0o7777,
                    float(mtime),
                    link if kind == "symlink" else None,
                )
            )
        except ValueError:
            raise SandboxError("the sandbox's stat answered something unexpected") from None
    return infos


def _error(code: int, path: str, stderr: bytes) -> SandboxError:
    if code == _MISSING:
        return SandboxFileNotFoundError(f"no such file in the workspace: {path!r}")
    if code == _OUTSIDE:
        return WorkspacePathError(
            f"path {path!r} is outside the workspace (a symlink on the way leads out)"
        )
    if code == _NOT_DIR:
        return InvalidArgumentError(f"{path!r} is not a directory")
    if code == _NOT_EMPTY:
        return InvalidArgumentError(
            f"cannot remove {path!r}: the directory is not empty (pass recursive=True)"
        )
    if code == _EXISTS:
        return InvalidArgumentError(f"cannot make {path!r}: it exists")
    if code == _IN_THE_WAY:
        return NotAFileError(f"cannot make {path!r}: a file is in the way")
    detail = stderr.decode("utf-8", "replace").strip()[:200]
    return SandboxError(f"file operation on {path!r} failed (exit {code}): {detail}")


class ShellWorkspace(WorkspaceAccess):
    """A `WorkspaceAccess` whose six file operations go through `ShellFileOps`, for a
    backend whose provider has no call for them (archives: the shared walk and
    extractor). Its session defines `async _shell_ops()`, the `ShellFileOps` of its
    exec and workspace (known once the sandbox runs)."""

    async def _ops(self) -> ShellFileOps:
        ops: ShellFileOps = await self.session._shell_ops()
        return ops

    async def stat(self, path: str) -> FileInfo:
        """`stat` without following, in the folder entered with `cd -P` (kept inside
        the workspace)."""
        return await (await self._ops()).stat(path)

    async def list_dir(self, path: str) -> list[FileInfo]:
        """The folder's names and their `stat`, NUL-separated."""
        return await (await self._ops()).list_dir(path)

    async def remove(self, path: str, recursive: bool) -> None:
        """`rm`/`rmdir` on the name itself."""
        await (await self._ops()).remove(path, recursive)

    async def make_dir(self, path: str, parents: bool) -> None:
        """`mkdir` one name at a time, each folder checked to be inside."""
        await (await self._ops()).make_dir(path, parents)

    async def make_symlink(self, path: str, target: str) -> None:
        """`ln -s` in the link's folder."""
        await (await self._ops()).make_symlink(path, target)

    async def set_mode(self, path: str, mode: int) -> None:
        """`chmod` (symlinks left alone)."""
        await (await self._ops()).set_mode(path, mode)
