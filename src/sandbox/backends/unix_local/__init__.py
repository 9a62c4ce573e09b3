"""The `unix_local` backend: processes on this machine (see `session.UnixLocalSession`).

Beside the session: `cgroup_limits` (memory/pids/cpu limits on the session's cgroup),
`confine` (the bubblewrap jail), `workspace`, `safe_open` and `local_files` (race-free
file access beneath it). The child itself, its /proc tree and its cgroup are driven by
`sandbox.local`, which the stand-ins in `sandbox.testing` share.
"""

from .session import UnixLocalSession

__all__ = ["UnixLocalSession"]
