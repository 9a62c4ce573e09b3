"""Detach and resume for `unix_local`: the workspace outlives the client, processes do not.

Every process is a child of the client (`LocalProcess`): nothing could read its PTY or
pipes once the client is gone, so `keeps_processes` is False. `detach()` terminates
them (the base session does, as `pty_terminate` would) and keeps the workspace, a
temporary one included: the resumed session removes it at its close. After a crash the
orphans keep running, in the dead client's cgroup and carrying its session tag in their
environment; `resume_session` kills them (the cgroup, then every process with the tag)
and reports each process of the ref as ended, with a note. The lease lives on the host
(`sandbox.backend.HostLease`), never in the workspace a sandboxed process can write.

A session opened with `runner=True` is detachable: its processes are the local runner
daemon's (docs/runner.md), not the client's, so `keeps_processes` is True for it.
`detach()` lets go of them (the runner keeps them and a ring of their output);
`resume_session` reattaches each by its runner id from the ref's output position, what
it printed meanwhile first (the omission marker where the ring kept less), and its exit
code if it ended. Its ref says `runner: true`, so the resumed session uses the runner too.
"""

from __future__ import annotations

import asyncio
import os
import stat
import tempfile
from typing import Any

from ...backend import HostLease, SessionRef, durable_session_id
from ...errors import InvalidArgumentError, SessionGoneError
from ...local import cgroups
from ...local import tree as process_tree
from ...runner import RunnerClient
from ..toolkit import RunnerDurability
from .handle import LocalHandle
from .workspace import TEMPORARY_PREFIX, Workspace

# Options a resumed session is opened with (no `env`: its values may be secrets).
REF_OPTIONS = (
    "terminate_grace_s",
    "confine",
    "network",
    "containment",
)


def check_temporary(where: str) -> None:
    """Refuse a ref whose `temporary` workspace (removed at close) is not one this
    library makes: a folder `sandbox-ws-*` of this user, directly in the temporary
    folder, reached without a symlink. Even a sealed ref is checked: the close deletes
    the folder, and nothing but a folder `Workspace.create()` made may be deleted so."""
    real = os.path.realpath(where)
    top = os.path.realpath(tempfile.gettempdir())
    try:
        info = os.lstat(where)
    except OSError:
        info = None
    if (
        real != os.path.normpath(where)
        or os.path.dirname(real) != top
        or not os.path.basename(real).startswith(TEMPORARY_PREFIX)
        or info is None
        or not stat.S_ISDIR(info.st_mode)
        or info.st_uid != os.geteuid()
    ):
        raise InvalidArgumentError(
            f"the unix_local ref says its workspace {where!r} is a temporary one (deleted "
            "at close), but this library makes temporary workspaces only as "
            f"{os.path.join(top, TEMPORARY_PREFIX + '*')} of this user: refusing the ref"
        )


def _kill_leftovers(ref: SessionRef) -> None:
    """End what a dead (or taken-over) client left running: its cgroup, its tag."""
    path = ref.sandbox.get("cgroup")
    if isinstance(path, str) and _is_our_cgroup(path):
        cgroups.kill_all(path)
    tag = ref.sandbox.get("session_tag")
    if isinstance(tag, str) and tag and "." not in tag:
        process_tree.kill_session(tag)
        # A client that still runs (a takeover) is the parent of its processes: they are
        # not orphans, so they are looked for by their tags in the whole process table.
        tags = {p.handle.get("tag") for p in ref.processes if p.running}
        prefix = tag + "."
        wanted = {t.encode() for t in tags if isinstance(t, str) and t.startswith(prefix)}
        if wanted:
            process_tree._kill_until_none(lambda: _tagged(wanted))


def _tagged(tags: set[bytes]) -> set[int]:
    table = process_tree._read_table()
    roots = {pid for pid in table if process_tree._environ_tag(pid) in tags}
    return process_tree._with_descendants(table, roots)


def _is_our_cgroup(path: str) -> bool:
    """Only a session directory under our own cgroup is ever killed from a ref."""
    try:
        home = cgroups.own_v2_directory()
    except cgroups.CgroupUnavailable:
        return False
    real = os.path.realpath(path)
    return (
        os.path.basename(real).startswith("sandbox-")
        and os.path.dirname(real) == os.path.realpath(home)
        and os.path.isdir(real)
    )


class LocalDurability(RunnerDurability):
    """The unix_local backend's durable sessions (the module docstring says what outlives
    the client), over the session it was made with."""

    not_reattached = (
        "a unix_local process is a child of the client that started it, which is gone; "
        "what was left of it was killed at resume"
    )

    @property
    def keeps_processes(self) -> bool:
        """True for a session opened with `runner=True`: the runner keeps its processes."""
        return bool(self.session.runner)

    def ref_sandbox(self) -> dict[str, Any]:
        """The workspace, whether the session made it, and where its leftovers are."""
        session = self.session
        cgroup = session._cgroup
        return {
            "workspace": session.workdir,
            "temporary": session._workspace.temporary,
            "session_tag": session._session_tag,
            "cgroup": None if cgroup is None else cgroup.path,
        }

    def ref_options(self, base: dict[str, Any]) -> dict[str, Any]:
        """The base options plus this backend's non-secret ones."""
        session = self.session
        options = dict(base)
        options.update({name: getattr(session, name) for name in REF_OPTIONS})
        options["inherit_env"] = session._commands.inherit_env
        options["readonly_paths"] = list(session._commands.readonly_request)
        limits = session._limits
        options["memory_limit_bytes"] = limits.memory_bytes
        options["process_limit"] = limits.processes
        options["cpu_limit"] = limits.cpus
        if session.runner:  # absent otherwise: refs of direct sessions stay as they were
            options["runner"] = True
        return options

    def ref_direct_process(self, handle: LocalHandle) -> dict[str, Any]:
        """The client's child: its pid and tag (the tag finds what is left of it after a
        crash)."""
        return {"pid": handle.pid, "tag": handle.tag}

    def lease_store(self) -> HostLease:
        """The lease on this host."""
        return HostLease(durable_session_id(self.session))

    async def resume(self, ref: SessionRef) -> None:
        """Adopt the workspace (gone: `SessionGoneError`), make the session's own cgroup."""
        session = self.session
        where = ref.sandbox.get("workspace")
        if not isinstance(where, str) or not os.path.isabs(where):
            raise SessionGoneError("the unix_local ref names no workspace")
        if not await asyncio.to_thread(os.path.isdir, where):
            raise SessionGoneError(f"the unix_local workspace {where!r} no longer exists")
        temporary = ref.sandbox.get("temporary") is True
        if temporary:
            await asyncio.to_thread(check_temporary, where)
        session._commands.workspace = Workspace.adopted(where, temporary=temporary)
        await session._start_backend()
        if not session.runner:  # a runner's processes are not leftovers: they are reattached
            await asyncio.to_thread(_kill_leftovers, ref)

    def kill_grace_s(self) -> float:
        """The session's `terminate_grace_s`."""
        return float(self.session.terminate_grace_s)

    def runner_client(self) -> RunnerClient | None:
        """The link to the local runner, for a session opened with `runner=True`."""
        session = self.session
        return session._require_runner() if session.runner else None

    async def detach(self) -> None:
        """Remove the session's (now empty) cgroup; keep the workspace. With the runner:
        close the connection to it (the processes stay the runner's)."""
        session = self.session
        session._close_readers()
        await session._close_runner()
        cgroup, session._cgroup = session._cgroup, None
        if cgroup is not None:
            cgroup.kill()  # the processes were torn down: this only catches a straggler
            await cgroup.wait_empty()
            cgroup.remove()
        applied, session._applied = session._applied, None
        if applied is not None:
            applied.remove()
