"""The `unix_local` backend: processes on this machine (see `session.UnixLocalSession`).

Beside the session: `local_process` (a child driven by the event loop, no threads),
`process_tree` (a process's whole tree through /proc), `confine` (the bubblewrap jail),
`workspace`, `safe_open` and `local_files` (race-free file access beneath it).
"""

from .session import UnixLocalSession

__all__ = ["UnixLocalSession"]
