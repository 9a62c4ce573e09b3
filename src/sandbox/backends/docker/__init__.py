"""The `docker` backend: a Docker container per session (or an attached one), one exec
per process, read by the event loop.

`session` holds `DockerSession` (the hooks only); beside it, one idea per module:
`options` checks the session's options and documents them (`DockerOptions`),
`container` makes or finds the container, probes it and lets go of it (`disconnect`:
a close or a detach), `engine` owns the SDK client, its thread pool and the
container's event stream, `execs` runs one exec (create, start, exit detection, the
tag-based kill built from `sandbox.backends.toolkit.shell`) and is the handle of a
session's process (a `Process`), `processes` starts a session's process or one-shot
command as an exec, `stream` reads and writes an exec's hijacked socket with the event
loop, `frames` decodes the multiplexed stdout/stderr of a non-tty exec, `files` and
`archive` move files through the archive endpoint (tar), and `errors` maps the SDK's
exceptions onto ours by the toolkit's policy. Only the registry imports this package
(lazily), so importing `sandbox` never imports the docker SDK.
"""

from __future__ import annotations

from .session import DockerSession

__all__ = ["DockerSession"]
