"""The `unix_local` backend: processes on this machine (see `session.UnixLocalSession`).

Beside the session: `options` (the options, their checks and documentation), `handle`
(`LocalHandle`, the `Process` of a local child, and the one-shot's), `processes` (a
command's start here: environment, the jail's check, one-shot and spawn, start errors),
`runner_link` (the local runner daemon), `cgroup_limits` (the session's cgroup and its
memory/pids/cpu limits), `confine` (the bubblewrap jail), `workspace`, `safe_open` and
`local_files` (race-free file access beneath it), `durable`. The child itself, its /proc
tree and its cgroup are driven by `sandbox.local`, which the stand-ins in
`sandbox.testing` share.
"""

from .session import UnixLocalSession

__all__ = ["UnixLocalSession"]
