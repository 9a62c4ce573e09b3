"""A file path checked against a remote sandbox's workspace before any call is made.

The contract: relative paths are in the workspace; `..` that climbs above it, or an
absolute path elsewhere, is a `WorkspacePathError`. A remote backend cannot hold the
provider's filesystem still between this check and its call (a process in the sandbox
may swap a folder for a symlink), so the check is lexical, as the Cloudflare bridge's
own is: what it rules out is a caller's path leaving the workspace. The providers
resolve a path against the same directory and clean it lexically too (Go's
`filepath.Join`/`Clean` in envd and Daytona's daemon), so the path the caller wrote
(shown in messages) is what is handed on; Modal, which takes absolute paths only, gets
the normalized one.
"""

from __future__ import annotations

import posixpath

from ...errors import WorkspacePathError


def within_workspace(path: str, workspace: str) -> str:
    """`path` as a normalized absolute path inside `workspace` (an absolute path), or
    `WorkspacePathError`."""
    root = posixpath.normpath(workspace)
    resolved = posixpath.normpath(posixpath.join(root, path))
    if resolved.startswith("//"):  # POSIX keeps a leading "//": it is "/" here
        resolved = "/" + resolved.lstrip("/")
    if root == "/" or resolved == root or resolved.startswith(root + "/"):
        return resolved
    raise WorkspacePathError(
        f"path {path!r} is outside the workspace; use a path inside {root} (or a relative one)"
    )
