"""Where the cluster is and who we are there, found as every Kubernetes tool finds it.

Loaded by `kubernetes_asyncio` (its `config` package: kubeconfig files, several of them
in `KUBECONFIG` merged, contexts, bearer tokens, client certificates, CA data, exec
credential plugins, and the in-cluster service account), never parsed by hand. What
we keep: the server's URL, an `ssl.SSLContext`, and a way to ask for the
`Authorization` header (the loader's refresh hook re-reads an in-cluster token). The
token is never stored in a message, log or repr: `Cluster` shows the server only.

Before the loader reads a kubeconfig, each file is checked here (`check_kubeconfig`):
a regular file of at most `bounds.MAX_KUBECONFIG_BYTES`, YAML read by `safe_load`,
nested at most `bounds.MAX_KUBECONFIG_DEPTH` deep, its `clusters`, `contexts` and `users`
lists of named mappings; anything else is one `CredentialsMissingError` line, never a
traceback. An exec credential plugin that fails is named by its command's basename and
exit status only: what it printed on stderr (a plugin may print a token there) reaches
no message and no log record (the loader logs its own error text: `_PluginStderrFilter`
drops that record).
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import os
import re
import ssl
import stat
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...backend import Secret
from ...errors import CredentialsMissingError
from . import bounds

IN_CLUSTER_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
DEFAULT_NAMESPACE = "default"


# kubernetes_asyncio's exec provider: "exec: process returned N. <the plugin's stderr>".
PLUGIN_FAILED = re.compile(r"exec: process returned (-?\d+)")
LOADER_LOGGER = "kubernetes_asyncio.config.kube_config"


class _PluginStderrFilter(logging.Filter):
    """Drops the loader's log record of a failed exec plugin: its text holds the
    plugin's stderr (our error names the plugin and its status instead)."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            text = record.getMessage()
        except Exception:  # a record we cannot read is not the one we drop
            return True
        return PLUGIN_FAILED.search(text) is None


logging.getLogger(LOADER_LOGGER).addFilter(_PluginStderrFilter())


def _bad(path: str, why: str) -> CredentialsMissingError:
    return CredentialsMissingError(f"the kubeconfig {path!r} could not be used: {why}")


def _check_shape(path: str, data: object) -> None:
    """Nesting and node count within bounds (iteratively: no recursion to exhaust)."""
    stack: list[tuple[object, int]] = [(data, 0)]
    nodes = 0
    while stack:
        value, depth = stack.pop()
        nodes += 1
        if nodes > bounds.MAX_KUBECONFIG_NODES:
            raise _bad(path, f"it holds more than {bounds.MAX_KUBECONFIG_NODES} values")
        if depth > bounds.MAX_KUBECONFIG_DEPTH:
            raise _bad(path, f"it is nested more than {bounds.MAX_KUBECONFIG_DEPTH} levels deep")
        if isinstance(value, dict):
            stack.extend((item, depth + 1) for item in value.values())
        elif isinstance(value, list):
            stack.extend((item, depth + 1) for item in value)
    if not isinstance(data, dict):
        raise _bad(path, "it is not a YAML mapping")
    for section in ("clusters", "contexts", "users"):
        items = data.get(section)
        if items is None:
            continue
        if not isinstance(items, list) or not all(
            isinstance(item, dict) and isinstance(item.get("name"), str) for item in items
        ):
            raise _bad(path, f"its {section!r} is not a list of mappings with a name")
        for item in items:
            body = item.get(section[:-1])
            if body is not None and not isinstance(body, dict):
                raise _bad(path, f"the {section[:-1]} {item['name']!r} is not a mapping")
    current = data.get("current-context")
    if current is not None and not isinstance(current, str):
        raise _bad(path, "its 'current-context' is not a string")


def check_kubeconfig(path: str) -> dict[str, Any]:
    """One kubeconfig file, read and checked (see the module docstring)."""
    # PyYAML comes with kubernetes_asyncio; untyped (no stubs installed), so as Any.
    yaml: Any = importlib.import_module("yaml")
    full = os.path.expanduser(path)
    try:
        fd = os.open(full, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise _bad(path, exc.strerror or "it cannot be opened") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise _bad(path, "it is not a regular file")
        if info.st_size > bounds.MAX_KUBECONFIG_BYTES:
            raise _bad(path, f"it is larger than {bounds.MAX_KUBECONFIG_BYTES} bytes")
        with os.fdopen(os.dup(fd), "rb") as f:
            raw = f.read(bounds.MAX_KUBECONFIG_BYTES + 1)
    except OSError as exc:
        raise _bad(path, exc.strerror or "it cannot be read") from None
    finally:
        os.close(fd)
    if len(raw) > bounds.MAX_KUBECONFIG_BYTES:
        raise _bad(path, f"it is larger than {bounds.MAX_KUBECONFIG_BYTES} bytes")
    try:
        data = yaml.safe_load(raw)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        raise _bad(path, f"it is not valid YAML{where}") from None
    except RecursionError:
        raise _bad(path, "it is nested too deeply") from None
    if data is None:
        data = {}
    _check_shape(path, data)
    assert isinstance(data, dict)
    return data


def exec_plugin(configs: list[dict[str, Any]], context: str | None) -> str | None:
    """The basename of the exec credential plugin the context's user runs (merged as
    the loader merges: the first file naming a context or user wins, the last
    `current-context`), or None."""
    current = context
    if current is None:
        for data in configs:
            if isinstance(data.get("current-context"), str):
                current = data["current-context"]

    def first(section: str, name: object) -> dict[str, Any]:
        for data in configs:
            for item in data.get(section) or []:
                if item.get("name") == name:
                    body = item.get(section[:-1])
                    return body if isinstance(body, dict) else {}
        return {}

    user = first("users", first("contexts", current).get("user"))
    spec = user.get("exec")
    command = spec.get("command") if isinstance(spec, dict) else None
    if command is None:
        return None
    return os.path.basename(str(command)) or None


def plugin_error(exc: Exception, plugin: str | None) -> CredentialsMissingError | None:
    """Our error for a failed exec plugin (its name and status, never its output), or
    None when `exc` is not about the plugin."""
    text = str(exc)
    if not text.startswith("exec:"):
        return None
    name = repr(plugin) if plugin else "(unnamed)"
    failed = PLUGIN_FAILED.match(text)
    if failed is not None:
        return CredentialsMissingError(
            f"the kubeconfig's exec credential plugin {name} failed with exit status "
            f"{failed.group(1)} (its stderr is not shown: it may hold a secret)"
        )
    return CredentialsMissingError(
        f"the kubeconfig's exec credential plugin {name} gave no usable credential"
    )


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
    plugin: str | None = None
    try:
        if paths is not None:
            configs = [check_kubeconfig(p) for p in paths.split(os.pathsep)]
            plugin = exec_plugin(configs, context)
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
        # The loader's messages name files and keys, never a token; an exec plugin's
        # carry its stderr, so those are replaced.
        raise plugin_error(exc, plugin) or CredentialsMissingError(
            f"the kubeconfig could not be used: {exc}"
        ) from None
    except OSError as exc:
        raise CredentialsMissingError(
            f"the Kubernetes credentials could not be read: {exc.strerror}"
        ) from None
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
        # A kubeconfig of the right shape with a value of the wrong kind deeper in
        # (the loader indexes without checking): one line, not its traceback.
        raise CredentialsMissingError(
            f"the kubeconfig could not be used: a value of the wrong kind or a missing "
            f"field ({type(exc).__name__})"
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
            try:
                await loader.load_from_exec_plugin()
            except ConfigException as exc:
                raise plugin_error(exc, plugin) or CredentialsMissingError(
                    "the kubeconfig's exec credential plugin could not be run again"
                ) from None
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


async def load_cluster_in_time(
    kubeconfig: str | None, context: str | None, namespace: str | None
) -> Cluster:
    """`load_cluster` within `bounds.CONFIG_TIMEOUT_S`, else `CredentialsMissingError`."""
    try:
        # An exec credential plugin may hang (a login that never completes).
        async with asyncio.timeout(bounds.CONFIG_TIMEOUT_S):
            return await load_cluster(kubeconfig, context, namespace)
    except TimeoutError:
        raise CredentialsMissingError(
            f"the Kubernetes credentials were not ready within {bounds.CONFIG_TIMEOUT_S:g} s "
            "(an exec credential plugin did not finish)"
        ) from None
