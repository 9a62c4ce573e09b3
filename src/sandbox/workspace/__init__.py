"""Workspaces that move: file operations, streamed archives, exposed ports, snapshots.

The backend-neutral half lives here: `info.FileInfo` (what `stat`/`list_dir` answer),
`tar_writer` (a streamed pax writer), `tar_reader` (an incremental tar parser),
`extract` (the safe extractor's rules), `persist` (a workspace walked into a tar
through the session's file hooks), `ports.ExposedPort`, `snapshots.SnapshotRef`, and
`shell_ops` (file operations through a POSIX shell, for providers without a file API
for them). Each backend's half is in `backends/<name>/workspace.py`.
"""

from .info import FileInfo, FileKind
from .ports import ExposedPort
from .snapshots import SnapshotRef

__all__ = ["ExposedPort", "FileInfo", "FileKind", "SnapshotRef"]
