"""`SandboxClient`: the SDK's client contract (create, delete, resume, state) on ours."""

from __future__ import annotations

import asyncio
import logging
import os
import tempfile
import uuid
import weakref
from pathlib import Path
from typing import Any

from agents.sandbox.manifest import Manifest
from agents.sandbox.session.dependencies import Dependencies
from agents.sandbox.session.manager import Instrumentation
from agents.sandbox.session.sandbox_client import BaseSandboxClient
from agents.sandbox.session.sandbox_session import SandboxSession
from agents.sandbox.session.sandbox_session_state import (
    SandboxSessionState as SdkSessionState,
)
from agents.sandbox.snapshot import SnapshotBase, SnapshotSpec, resolve_snapshot

from sandbox.errors import InvalidArgumentError, RefNotTrustedError
from sandbox.files.remove_tree import remove_tree

from .options import TYPE_NAME, SandboxClientOptions
from .session import AgentsSessionAdapter, _default_root
from .state import SandboxSessionState, public_options

_WORKSPACE_PREFIX = "sandbox-agents-"
_log = logging.getLogger(__name__)


class SandboxClient(BaseSandboxClient[SandboxClientOptions]):
    """Create, resume and delete SDK sessions backed by `sandbox` sessions.

    `resume_options` are backend options given again at resume (credentials, live
    objects such as a stand-in's SDK class): the serialized state never holds them.
    A client also remembers the private options of the sessions it created, so it
    can resume those without being told again.
    """

    backend_id = TYPE_NAME
    supports_default_options = False

    def __init__(
        self,
        *,
        resume_options: dict[str, Any] | None = None,
        instrumentation: Instrumentation | None = None,
        dependencies: Dependencies | None = None,
    ) -> None:
        self._resume_options = dict(resume_options or {})
        self._instrumentation = (
            instrumentation if instrumentation is not None else Instrumentation()
        )
        self._dependencies = dependencies
        self._private_by_session: dict[uuid.UUID, dict[str, Any]] = {}
        self._adapters: weakref.WeakValueDictionary[uuid.UUID, AgentsSessionAdapter] = (
            weakref.WeakValueDictionary()
        )

    def __repr__(self) -> str:
        return f"<SandboxClient sessions={len(self._private_by_session)}>"

    async def create(
        self,
        *,
        snapshot: SnapshotSpec | SnapshotBase | None = None,
        manifest: Manifest | None = None,
        options: SandboxClientOptions,
    ) -> SandboxSession:
        """A new (not yet started) session on `options.backend`."""
        manifest = self._validate_manifest_for_create(manifest or Manifest())
        backend_options = dict(options.backend_options)
        # Before anything is made: a grant naming a host folder is refused or mounted.
        backend_options = _host_path_grants(options.backend, manifest, backend_options)
        if options.backend == "docker" and options.exposed_ports:
            # Published on the host's loopback at create: the bridge address the engine
            # would give otherwise is unreachable on Docker Desktop, rootless Docker and
            # a remote DOCKER_HOST.
            named = [int(port) for port in backend_options.get("ports") or ()]
            wanted = [port for port in options.exposed_ports if port not in named]
            backend_options["ports"] = [*named, *wanted]
        owned = False
        if options.backend == "unix_local" and "workdir" not in backend_options:
            if manifest.root == _default_root():
                # An SDK-made session gets a workspace of its own, removed by delete().
                root = await asyncio.to_thread(tempfile.mkdtemp, prefix=_WORKSPACE_PREFIX)
                manifest = manifest.model_copy(update={"root": root}, deep=True)
                owned = True
            backend_options["workdir"] = manifest.root
        session_id = uuid.uuid4()
        public = public_options(backend_options)
        private = {k: v for k, v in backend_options.items() if k not in public}
        state = SandboxSessionState(
            session_id=session_id,
            manifest=manifest,
            snapshot=resolve_snapshot(snapshot, str(session_id)),
            backend=options.backend,
            backend_options=public,
            exposed_ports=tuple(dict.fromkeys(options.exposed_ports)),  # each port once
            workspace_root_owned=owned,
        )
        state.reseal()
        self._private_by_session[session_id] = private
        inner = AgentsSessionAdapter(
            state=state, private_options={**self._resume_options, **private}
        )
        self._adapters[session_id] = inner
        return self._wrap_session(inner, instrumentation=self._instrumentation)

    async def delete(self, session: SandboxSession) -> SandboxSession:
        """Close our session (if the SDK did not) and remove the workspace `create` made.

        Only the sealed fields of the state decide what is removed (see
        `SandboxSessionState`): a state this user's library did not write, or whose
        backend, options, ref or ownership changed, raises `RefNotTrustedError` and
        nothing is removed; so does an owned workspace the manifest's root disagrees
        with. The removal never follows a symlink inside the folder."""
        inner = session._inner
        if not isinstance(inner, AgentsSessionAdapter):
            raise TypeError("SandboxClient.delete expects a session this client made")
        state = inner.state
        try:
            state.check_trusted()
            folder = state.owned_workspace()
            # Mounts inside the workspace come off first, deepest first: removing the
            # folder under a live mount would remove the mounted bucket's files.
            unmounted = folder is None or await _unmount_ephemeral(inner)
        finally:
            # Our live session is ours whatever the state says: closed in every case.
            await inner._shutdown_backend()
            self._private_by_session.pop(inner.state.session_id, None)
        if folder is None or not unmounted:
            return session
        root = state.manifest.root
        if root not in ("", _default_root()) and not _same_folder(root, folder):
            raise RefNotTrustedError(
                "this session state's manifest root is not the workspace the client made "
                "for it: refusing to remove anything"
            )
        if not await asyncio.to_thread(os.path.lexists, folder):
            return session
        if not _made_by_us(folder):
            raise RefNotTrustedError(
                f"the workspace {folder!r} of this session state is not a folder this "
                f"client makes ({_WORKSPACE_PREFIX}* in the temporary folder): refusing "
                "to remove it"
            )
        await asyncio.to_thread(remove_tree, folder)
        return session

    async def resume(self, state: SdkSessionState) -> SandboxSession:
        """A session on the same sandbox (our `SessionRef` in the state), or, when it is
        gone, a replacement the SDK restores from the state's snapshot at start."""
        if not isinstance(state, SandboxSessionState):
            raise TypeError("SandboxClient.resume expects this client's session state")
        # Its backend and options pick what is opened on the host: only sealed ones.
        state.check_trusted()
        private = {**self._resume_options, **self._private_by_session.get(state.session_id, {})}
        inner = AgentsSessionAdapter(state=state, private_options=private)
        self._adapters[state.session_id] = inner
        return self._wrap_session(inner, instrumentation=self._instrumentation)

    def serialize_session_state(self, state: SdkSessionState) -> dict[str, object]:
        """The SDK's serialization, after recording the live session's `SessionRef`."""
        adapter = self._adapters.get(state.session_id)
        if adapter is not None and adapter.state is state:
            adapter.refresh_ref()
        return super().serialize_session_state(state)

    def deserialize_session_state(self, payload: dict[str, object]) -> SdkSessionState:
        """Our state from what `serialize_session_state` wrote."""
        return self._deserialize_session_state_payload(payload, SandboxSessionState)


async def _unmount_ephemeral(inner: AgentsSessionAdapter) -> bool:
    """Unmount the manifest's ephemeral mounts, deepest first (a mount inside another
    comes off before it); False when one failed (then nothing may be removed)."""
    targets = list(inner.state.manifest.ephemeral_mount_targets())
    if not targets:
        return True
    if not inner._live():
        await inner._ensure_backend_started()
    targets.sort(key=lambda target: len(target[1].parts), reverse=True)
    ok = True
    for entry, path in targets:
        try:
            await entry.unmount(inner, path, Path("/"))
        except Exception as error:  # each failure is logged, none hides another
            ok = False
            _log.warning(
                "could not unmount %s before deleting the workspace (%s): the workspace is kept",
                path,
                type(error).__name__,
            )
    return ok


def _host_path_grants(backend: str, manifest: Manifest, options: dict[str, Any]) -> dict[str, Any]:
    """`extra_path_grants` naming a `host_path`: refused on unix_local (the sandbox is
    the host: the path is the grant's own), bind-mounted on docker (read-only when the
    grant is), refused on backends without bind mounts."""
    grants = [grant for grant in manifest.extra_path_grants if grant.host_path is not None]
    if not grants:
        return options
    if backend != "docker":
        raise InvalidArgumentError(
            f"a path grant with host_path ({grants[0].path!r}) is not supported on "
            f"{backend}: omit host_path (unix_local: the grant's path is the host's) or "
            "use the docker backend, which bind-mounts it"
        )
    volumes = options.get("volumes") or {}
    if not isinstance(volumes, dict):
        raise InvalidArgumentError(
            "path grants with host_path need the docker `volumes` option as a mapping"
        )
    volumes = dict(volumes)
    for grant in grants:
        host = os.path.abspath(str(grant.host_path))
        volumes[host] = {"bind": grant.path, "mode": "ro" if grant.read_only else "rw"}
    return {**options, "volumes": volumes}


def _same_folder(first: str, second: str) -> bool:
    return os.path.realpath(first) == os.path.realpath(second)


def _made_by_us(root: str) -> bool:
    """Whether `root` is a workspace folder `create` makes (defence in depth beside the
    seal: delete never removes a folder of another kind)."""
    path = os.path.abspath(root)
    parent, name = os.path.split(path)
    return (
        name.startswith(_WORKSPACE_PREFIX)
        and parent == os.path.abspath(tempfile.gettempdir())
        and os.path.isdir(path)
        and not os.path.islink(path)
    )
