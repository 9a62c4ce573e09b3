"""Where the cluster is and who we are there, found as every Kubernetes tool finds it.

Loaded by `kubernetes_asyncio` (its `config` package: kubeconfig files, several of them
in `KUBECONFIG` merged, contexts, bearer tokens, client certificates, CA data, exec
credential plugins, and the in-cluster service account), never parsed by hand. What
we keep: the server's URL, an `ssl.SSLContext`, and a way to ask for the
`Authorization` header (the loader's refresh hook re-reads an in-cluster token). The
token is never stored in a message, log or repr: `Cluster` shows the server only.
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...backend import Secret
from ...errors import CredentialsMissingError

IN_CLUSTER_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
DEFAULT_NAMESPACE = "default"


def kubeconfig_paths(kubeconfig: str | None) -> str | None:
    """The kubeconfig path list to load (`kubeconfig=`, else `KUBECONFIG`, else
    ~/.kube/config), or None when none of its files exists."""
    text = kubeconfig or os.environ.get("KUBECONFIG") or str(Path.home() / ".kube" / "config")
    existing = [p for p in text.split(os.pathsep) if p and Path(p).expanduser().exists()]
    return os.pathsep.join(existing) if existing else None


def in_cluster() -> bool:
    """True when this process runs in a pod with a service account (the variables the
    kubelet sets)."""
    return (
        bool(os.environ.get("KUBERNETES_SERVICE_HOST"))
        and Path("/var/run/secrets/kubernetes.io/serviceaccount/token").exists()
    )


def found(kubeconfig: str | None = None) -> tuple[str | None, str | None]:
    """For `sandbox backends`: the kubeconfig found (or "in-cluster") and its current
    context, reading nothing but the file (no credential plugin runs)."""
    paths = kubeconfig_paths(kubeconfig)
    if paths is None:
        return ("in-cluster", None) if in_cluster() else (None, None)
    try:
        from kubernetes_asyncio.config import list_kube_config_contexts
    except ImportError:
        return paths, None
    try:
        _, current = list_kube_config_contexts(paths)
    except Exception:
        return paths, None
    name = current.get("name") if isinstance(current, dict) else None
    return paths, name if isinstance(name, str) else None


@dataclass(repr=False)
class Cluster:
    """One API server: URL, TLS, credentials (behind `authorization()`), namespace."""

    server: str
    ssl: ssl.SSLContext | bool
    namespace: str
    context: str | None = None
    # The kubeconfig file(s) loaded (`os.pathsep`-joined), None in-cluster: a path, never
    # their contents (a durable ref keeps it).
    kubeconfig: str | None = None
    _token: Secret | None = None
    _refresh: Callable[[], Awaitable[str | None]] | None = field(default=None)

    async def authorization(self) -> str | None:
        """The `Authorization` header value now (a refreshed token when the loader has
        a hook), or None (client certificates only)."""
        if self._refresh is not None:
            return await self._refresh()
        return self._token.reveal() if self._token is not None else None

    def secrets(self) -> list[Secret]:
        """What must never appear in a message."""
        if self._token is None:
            return []
        bare = self._token.reveal().removeprefix("Bearer ").strip()
        return [self._token, Secret(bare)] if bare else [self._token]

    def __repr__(self) -> str:
        return f"Cluster(server={self.server!r}, namespace={self.namespace!r})"


def _in_cluster_namespace() -> str | None:
    # A small local file the kubelet mounted: read at once, as the loader reads its own.
    try:
        text = Path(IN_CLUSTER_NAMESPACE).read_text(encoding="utf-8")
    except OSError:
        return None
    return text.strip() or None


def _ssl_context(configuration: Any) -> ssl.SSLContext | bool:
    if not configuration.host.startswith("https"):
        return False
    context = ssl.create_default_context(cafile=configuration.ssl_ca_cert or None)
    if configuration.cert_file:
        context.load_cert_chain(configuration.cert_file, configuration.key_file or None)
    if not configuration.verify_ssl:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return context


async def load_cluster(
    kubeconfig: str | None, context: str | None, namespace: str | None
) -> Cluster:
    """The cluster of `context` (default: the current one) in the kubeconfig found by
    `kubeconfig_paths`, else the in-cluster service account; `CredentialsMissingError`
    when there is neither. `namespace` wins over the context's."""
    try:
        from kubernetes_asyncio.client import Configuration
        from kubernetes_asyncio.config import (
            ConfigException,
            load_incluster_config,
            load_kube_config,
        )
    except ImportError as exc:  # pragma: no cover - the registry checks first
        raise CredentialsMissingError(
            "the kubernetes backend needs kubernetes_asyncio: "
            "pip install 'agent-sandbox-pty[kubernetes]'"
        ) from exc
    configuration = Configuration()
    paths = kubeconfig_paths(kubeconfig)
    context_name: str | None = None
    context_namespace: str | None = None
    loader: Any = None
    try:
        if paths is not None:
            loader = await load_kube_config(
                config_file=paths,
                context=context,
                client_configuration=configuration,
                persist_config=False,
            )
            current = loader.current_context or {}
            context_name = current.get("name")
            context_namespace = (current.get("context") or {}).get("namespace")
        elif in_cluster():
            load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
            context_namespace = _in_cluster_namespace()
        else:
            raise CredentialsMissingError(
                "no Kubernetes credentials: pass kubeconfig=, set KUBECONFIG, create "
                "~/.kube/config, or run in a pod with a service account"
            )
    except ConfigException as exc:
        # The loader's messages name files and keys, never a token.
        raise CredentialsMissingError(f"the kubeconfig could not be used: {exc}") from None
    except OSError as exc:
        raise CredentialsMissingError(
            f"the Kubernetes credentials could not be read: {exc.strerror}"
        ) from None

    token = configuration.api_key.get("BearerToken")
    refresh: Callable[[], Awaitable[str | None]] | None = None
    if configuration.refresh_api_key_hook is not None:
        # In-cluster: the loader's hook re-reads the projected token when it is old.
        async def refresh() -> str | None:
            value = await configuration.get_api_key_with_prefix("BearerToken")
            return value if isinstance(value, str) else None

    elif paths is not None and getattr(loader, "exec_plugin_expiry", None) is not None:
        # An exec credential plugin's token expires: the loader runs the plugin again
        # once it has (and only then), and keeps the new token.
        async def refresh() -> str | None:
            await loader.load_from_exec_plugin()
            value = getattr(loader, "token", None)
            return value if isinstance(value, str) else None

    return Cluster(
        server=str(configuration.host or "").rstrip("/"),
        ssl=_ssl_context(configuration),
        namespace=namespace or context_namespace or DEFAULT_NAMESPACE,
        context=context_name,
        kubeconfig=paths,
        _token=Secret(token) if isinstance(token, str) and token else None,
        _refresh=refresh,
    )
