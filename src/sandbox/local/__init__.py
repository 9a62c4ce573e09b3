"""Driving real children on this machine: shared by the unix_local backend and by every
stand-in in `sandbox.testing` (they run the commands they are sent as local processes).

- `process`: `LocalProcess`, a child driven by the event loop without threads (pidfd
  exit watch, pty or pipes, the kill of its whole tree).
- `tree`: a process's tree through /proc, and escapees found by their environment tag.
- `cgroups`: a cgroup per session and a leaf per process, where the host allows it.

Backend authors get `LocalProcess` from `sandbox.backend`; only unix_local, the local
backend itself, imports these modules directly.
"""
