"""The registry of backend names -> lazily imported session classes.

Importing `sandbox` never imports a provider SDK: a backend's module is imported only
when a session of that backend is opened (or `sandbox backends` inspects it).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import BackendUnavailableError, InvalidArgumentError, UnknownBackendError
from ..session.capabilities import snapshot_options_of
from ..session.options import bad_option_error

if TYPE_CHECKING:
    from ..session import BaseSandboxSession


@dataclass(frozen=True, slots=True)
class BackendInfo:
    """How to find one backend: its module, the distributions it needs, the extra that
    installs them, and the environment variables that hold its credentials.

    `credential_env` lists alternatives groups: each inner tuple is a set of variables
    that together make a credential (any group being complete is enough).
    """

    name: str
    module: str
    class_name: str
    extra: str | None
    requires: tuple[str, ...]
    credential_env: tuple[tuple[str, ...], ...] = ()
    description: str = ""

    def missing_modules(self) -> list[str]:
        """Top-level modules this backend needs that are not importable here."""
        return [m for m in self.requires if importlib.util.find_spec(m) is None]

    @property
    def installed(self) -> bool:
        """True when every module the backend needs is importable."""
        return not self.missing_modules()

    def credentials_found(self) -> bool | None:
        """True/False whether credentials are in the environment; None if none needed."""
        if not self.credential_env:
            return None
        return any(all(os.environ.get(var) for var in group) for group in self.credential_env)


BACKENDS: dict[str, BackendInfo] = {
    info.name: info
    for info in (
        BackendInfo(
            "unix_local",
            "sandbox.backends.unix_local",
            "UnixLocalSession",
            None,
            (),
            description="local processes (PTY via openpty); optional bubblewrap jail",
        ),
        BackendInfo(
            "docker",
            "sandbox.backends.docker",
            "DockerSession",
            "docker",
            ("docker",),
            description="Docker Engine API: a container per session, or attach to one",
        ),
        BackendInfo(
            "blaxel",
            "sandbox.backends.blaxel",
            "BlaxelSession",
            "blaxel",
            ("blaxel", "aiohttp"),
            (("BL_API_KEY", "BL_WORKSPACE"),),
            description="Blaxel sandboxes: SDK for exec/files, terminal WebSocket for PTYs",
        ),
        BackendInfo(
            "cloudflare",
            "sandbox.backends.cloudflare",
            "CloudflareSession",
            "cloudflare",
            ("aiohttp",),
            (("CLOUDFLARE_SANDBOX_WORKER_URL", "CLOUDFLARE_SANDBOX_API_KEY"),),
            description="a user-deployed Cloudflare Sandbox Worker (HTTP + WebSocket)",
        ),
        BackendInfo(
            "daytona",
            "sandbox.backends.daytona",
            "DaytonaSession",
            "daytona",
            ("daytona",),
            (("DAYTONA_API_KEY",),),
            description="Daytona sandboxes via the async SDK",
        ),
        BackendInfo(
            "e2b",
            "sandbox.backends.e2b",
            "E2BSession",
            "e2b",
            ("e2b",),
            (("E2B_API_KEY",),),
            description="E2B sandboxes via the async SDK",
        ),
        BackendInfo(
            "modal",
            "sandbox.backends.modal",
            "ModalSession",
            "modal",
            ("modal",),
            (("MODAL_TOKEN_ID", "MODAL_TOKEN_SECRET"),),
            description="Modal sandboxes via the SDK's .aio calls",
        ),
        BackendInfo(
            "kubernetes",
            "sandbox.backends.kubernetes",
            "KubernetesSession",
            "kubernetes",
            ("kubernetes_asyncio", "aiohttp"),
            description="a pod per session (or attach to one), pods/exec over WebSocket",
        ),
    )
}


def backend_info(name: str) -> BackendInfo:
    """The registry entry for `name`, or `UnknownBackendError` listing the known names."""
    try:
        return BACKENDS[name]
    except (KeyError, TypeError):
        known = ", ".join(sorted(BACKENDS))
        raise UnknownBackendError(f"unknown backend {name!r}; known backends: {known}") from None


def load_backend(name: str) -> type[BaseSandboxSession]:
    """Import and return the session class of backend `name`.

    Raises `UnknownBackendError` for an unknown name and `BackendUnavailableError`
    naming the pip extra when the backend's dependencies are not installed.
    """
    info = backend_info(name)
    missing = info.missing_modules()
    if missing:
        raise BackendUnavailableError(
            f"the {name} backend needs {', '.join(missing)}: "
            f"pip install 'agent-sandbox-pty[{info.extra}]'"
        )
    try:
        module = importlib.import_module(info.module)
    except ImportError as exc:
        hint = f"pip install 'agent-sandbox-pty[{info.extra}]'" if info.extra else "reinstall"
        raise BackendUnavailableError(
            f"the {name} backend could not be imported ({exc.name or exc}): {hint}"
        ) from exc
    cls: type[BaseSandboxSession] = getattr(module, info.class_name)
    return cls


def open_session(backend: str = "unix_local", **options: Any) -> BaseSandboxSession:
    """Return an unstarted session of `backend`, configured by its `options`.

    Use it as `async with open_session(...) as session:`.
    """
    cls = load_backend(backend)
    own = options.get("snapshot")
    if isinstance(own, str) and not own.lstrip().startswith("{"):
        pass  # not a ref's JSON: a backend's own option (Daytona's snapshot name)
    elif own is not None:
        # `snapshot=` (a `SnapshotRef` or its JSON) opens what `session.snapshot()` made.
        from ..workspace.snapshots import SnapshotRef

        ref = options.pop("snapshot")
        ref = SnapshotRef.from_json(ref) if isinstance(ref, str | bytes) else ref
        if not isinstance(ref, SnapshotRef) or ref.backend != backend:
            raise InvalidArgumentError(f"snapshot must be a SnapshotRef of the {backend} backend")
        options = snapshot_options_of(cls.backend_name, cls._snapshots, ref, options)
    elif "snapshot" in options:
        options.pop("snapshot")  # `snapshot=None`: none
    try:
        return cls(**options)
    except TypeError as exc:
        # An unknown or misspelled option: named with the closest valid one, never a value.
        raise bad_option_error(backend, cls, options, exc) from None
