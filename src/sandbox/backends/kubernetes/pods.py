"""The session's pod: its manifest, the create, the wait for a running container by
watch (`start_pod`), the attach to an existing pod (`attach_pod`), and the deletion
(graceful, then forced).

Facts (kubernetes/kubernetes `pkg/apis/core/types.go`, kubelet `pkg/kubelet/kuberuntime`):
a container waiting to start says why in `status.containerStatuses[].state.waiting.reason`
(`ErrImagePull`, `ImagePullBackOff`, `InvalidImageName`, `CreateContainerConfigError`,
...), a pod the scheduler cannot place has the condition `PodScheduled=False` with
reason `Unschedulable`; a watch (`?watch=true&fieldSelector=metadata.name=NAME`) sends
`{"type": "ADDED"|"MODIFIED"|"DELETED"|"ERROR", "object": ...}` lines. A DELETE with
`gracePeriodSeconds` sets `metadata.deletionTimestamp`; the kubelet gives at least 2 s
(`minimumGracePeriodInSeconds`) and the pod object goes once its containers stopped;
`gracePeriodSeconds: 0` removes it at once (forced).
"""

from __future__ import annotations

import asyncio
import contextlib
import posixpath
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from ...errors import InvalidArgumentError, ProviderError
from . import bounds
from .client import KubeClient

SESSION_LABEL = "sandbox.session"
# Waiting reasons that mean the container will not start by itself soon.
FATAL_WAITING = frozenset(
    {
        "ErrImagePull",
        "ImagePullBackOff",
        "InvalidImageName",
        "ErrImageNeverPull",
        "CreateContainerConfigError",
        "CreateContainerError",
        "RunContainerError",
    }
)
CONTAINER_NAME = "sandbox"


class PodStartError(ProviderError):
    """The pod could not be started (image, scheduling, a failed container)."""


def new_pod_name(prefix: str) -> str:
    """A fresh DNS-1123 pod name."""
    return f"{prefix}-{secrets.token_hex(6)}"


@dataclass(frozen=True)
class PodOptions:
    """What a created pod looks like beside its image."""

    workdir: str
    name_prefix: str = "sandbox"
    resources: Mapping[str, Any] | None = None
    runtime_class: str | None = None
    node_selector: Mapping[str, str] | None = None
    service_account: str | None = None
    security_context: Mapping[str, Any] | None = None
    pod_security_context: Mapping[str, Any] | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    image_pull_policy: str | None = None
    grace_period_s: int = 2
    keepalive: Sequence[str] = ()


def pod_manifest(name: str, session_id: str, image: str, options: PodOptions) -> dict[str, Any]:
    """The Pod of a session: one container kept alive by a shell, never restarted."""
    container: dict[str, Any] = {
        "name": CONTAINER_NAME,
        "image": image,
        "command": list(options.keepalive),
        "workingDir": options.workdir,
        # A pipe nobody writes to: the keep-alive's `read` blocks on it.
        "stdin": True,
        "tty": False,
    }
    if options.resources:
        container["resources"] = dict(options.resources)
    if options.security_context:
        container["securityContext"] = dict(options.security_context)
    if options.image_pull_policy:
        container["imagePullPolicy"] = options.image_pull_policy
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": options.grace_period_s,
        "automountServiceAccountToken": options.service_account is not None,
        "containers": [container],
    }
    if options.runtime_class:
        spec["runtimeClassName"] = options.runtime_class
    if options.node_selector:
        spec["nodeSelector"] = dict(options.node_selector)
    if options.service_account:
        spec["serviceAccountName"] = options.service_account
    if options.pod_security_context:
        spec["securityContext"] = dict(options.pod_security_context)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {**options.labels, SESSION_LABEL: session_id}},
        "spec": spec,
    }


def pods_path(namespace: str, name: str | None = None) -> str:
    """The API path of the namespace's pods, or of one pod."""
    base = f"/api/v1/namespaces/{quote(namespace, safe='')}/pods"
    return base if name is None else f"{base}/{quote(name, safe='')}"


def _container_status(pod: Mapping[str, Any], container: str) -> Mapping[str, Any]:
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        if isinstance(status, dict) and status.get("name") == container:
            return status
    return {}


def readiness(pod: Mapping[str, Any], container: str) -> tuple[bool, str | None, bool]:
    """(running, why not, fatal) for `container` of `pod`."""
    status = pod.get("status") or {}
    phase = status.get("phase")
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        return False, "the pod is being deleted", True
    if phase in ("Failed", "Succeeded"):
        message = status.get("message") or status.get("reason") or ""
        return False, f"the pod ended ({phase}{': ' + message if message else ''})", True
    for condition in status.get("conditions") or []:
        if (
            isinstance(condition, dict)
            and condition.get("type") == "PodScheduled"
            and condition.get("status") == "False"
        ):
            why = condition.get("reason") or "not scheduled"
            message = condition.get("message")
            return False, f"{why}{': ' + message if message else ''}", False
    state = _container_status(pod, container).get("state") or {}
    if "running" in state and phase == "Running":
        return True, None, False
    waiting = state.get("waiting") or {}
    if waiting:
        reason = waiting.get("reason") or "waiting"
        message = waiting.get("message")
        text = f"{reason}{': ' + message if message else ''}"
        return False, text, reason in FATAL_WAITING
    if "terminated" in state:
        terminated = state["terminated"] or {}
        return False, f"the container exited ({terminated.get('reason') or 'terminated'})", True
    return False, f"the pod is {phase or 'pending'}", False


async def wait_running(
    client: KubeClient, namespace: str, name: str, container: str, timeout: float
) -> dict[str, Any]:
    """Watch the pod until its container runs; `PodStartError` at a fatal reason or at
    the deadline (naming the last reason seen)."""
    last = "no status yet"
    params = {"fieldSelector": f"metadata.name={name}"}
    try:
        async with asyncio.timeout(timeout):
            while True:
                _, pod = await client.call("GET", pods_path(namespace, name), "look at the pod")
                running, why, fatal = readiness(pod, container)
                if running:
                    return pod
                last = why or last
                if fatal:
                    raise PodStartError(f"the pod {name} could not start: {last}")
                version = (pod.get("metadata") or {}).get("resourceVersion")
                watch_params = dict(params)
                if version:
                    watch_params["resourceVersion"] = version
                watch = client.watch(pods_path(namespace), watch_params, "watch the pod")
                # Closed at once when we stop reading: the watch's connection goes back.
                async with contextlib.aclosing(watch) as events:
                    async for event in events:
                        kind = event.get("type")
                        obj = event.get("object") or {}
                        if kind == "ERROR":
                            break  # e.g. 410 Gone: read the pod again, watch anew
                        if kind == "DELETED":
                            raise PodStartError(f"the pod {name} was deleted while starting")
                        running, why, fatal = readiness(obj, container)
                        if running:
                            return obj
                        last = why or last
                        if fatal:
                            raise PodStartError(f"the pod {name} could not start: {last}")
                # The server ended the watch (its own timeout, an ERROR event): a pause,
                # so a server that ends every watch at once is not asked in a loop.
                await asyncio.sleep(bounds.WATCH_RETRY_S)
    except TimeoutError:
        raise PodStartError(
            f"the pod {name} did not start within {timeout:g} s: {last}", retryable=True
        ) from None


async def create_pod(client: KubeClient, namespace: str, manifest: Mapping[str, Any]) -> None:
    """POST the pod (the caller claimed its name first)."""
    await client.call("POST", pods_path(namespace), "create the pod", body=manifest)


async def existing_pod(
    client: KubeClient, namespace: str, name: str, container: str | None
) -> tuple[dict[str, Any], str]:
    """The running pod `name` and the container execs go to (`container`, else its
    first)."""
    status, pod = await client.call(
        "GET", pods_path(namespace, name), f"find the pod {name!r}", allow=(404,)
    )
    if status == 404:
        raise InvalidArgumentError(f"no pod {name!r} in the namespace {namespace!r}")
    names = [c.get("name") for c in (pod.get("spec") or {}).get("containers") or []]
    chosen = container or (names[0] if names else None)
    if chosen is None or chosen not in names:
        raise InvalidArgumentError(
            f"the pod {name!r} has no container {container!r} "
            f"(it has: {', '.join(map(str, names))})"
        )
    running, why, _ = readiness(pod, chosen)
    if not running:
        raise PodStartError(f"the pod {name!r} is not running: {why}")
    return pod, chosen


async def start_pod(
    client: KubeClient,
    namespace: str,
    name: str,
    session_id: str,
    image: str,
    options: PodOptions,
    timeout: float,
) -> str | None:
    """Create the session's pod `name` (`pod_manifest`), wait until its container runs
    (`wait_running`, within `timeout`), and return its uid."""
    await create_pod(client, namespace, pod_manifest(name, session_id, image, options))
    running = await wait_running(client, namespace, name, CONTAINER_NAME, timeout)
    return pod_uid(running)


@dataclass(frozen=True)
class AttachedPod:
    """A running pod found to attach to: its uid and labels, the container execs go to,
    and the directory they change to first (None when the container's own working
    directory is the session's workdir)."""

    uid: str | None
    labels: dict[str, Any]
    container: str
    cwd: str | None


async def attach_pod(
    client: KubeClient, namespace: str, name: str, container: str | None, workdir: str
) -> AttachedPod:
    """The running pod `name` (`existing_pod`) as an `AttachedPod` for `workdir`."""
    found, chosen = await existing_pod(client, namespace, name, container)
    own = container_workdir(found, chosen)
    cwd = None if own and posixpath.normpath(own) == workdir else workdir
    return AttachedPod(pod_uid(found), pod_labels(found), chosen, cwd)


def pod_uid(pod: Mapping[str, Any]) -> str | None:
    """The pod's `metadata.uid` (unique across the pods ever made under one name)."""
    uid = (pod.get("metadata") or {}).get("uid")
    return uid if isinstance(uid, str) and uid else None


def pod_labels(pod: Mapping[str, Any]) -> dict[str, Any]:
    """The pod's `metadata.labels` (empty when it has none)."""
    labels = (pod.get("metadata") or {}).get("labels")
    return dict(labels) if isinstance(labels, dict) else {}


def container_workdir(pod: Mapping[str, Any], container: str) -> str | None:
    """The container's `workingDir`, when its spec sets one."""
    for spec in (pod.get("spec") or {}).get("containers") or []:
        if isinstance(spec, dict) and spec.get("name") == container:
            value = spec.get("workingDir")
            return value if isinstance(value, str) and value else None
    return None


async def delete_pod(client: KubeClient, namespace: str, name: str, grace_s: int) -> None:
    """Delete gracefully, wait for the pod to go (grace + slack), then delete with a
    grace period of 0 if it is still there. A pod already gone is fine."""
    path = pods_path(namespace, name)
    status, _ = await client.call(
        "DELETE",
        path,
        "delete the pod",
        body={"kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": grace_s},
        allow=(404,),
    )
    if status == 404:
        return
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(max(grace_s, 2) + bounds.DELETE_SLACK_S):
            await _gone(client, namespace, name)
            return
    await client.call(
        "DELETE",
        path,
        "delete the pod (forced)",
        body={"kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": 0},
        allow=(404,),
    )


async def _gone(client: KubeClient, namespace: str, name: str) -> None:
    """Return once the pod object is gone, by watch."""
    while True:
        status, pod = await client.call(
            "GET", pods_path(namespace, name), "look at the pod", allow=(404,)
        )
        if status == 404:
            return
        params = {"fieldSelector": f"metadata.name={name}"}
        version = (pod.get("metadata") or {}).get("resourceVersion")
        if version:
            params["resourceVersion"] = version
        watch = client.watch(pods_path(namespace), params, "watch the pod")
        async with contextlib.aclosing(watch) as events:
            async for event in events:
                if event.get("type") == "DELETED":
                    return
                if event.get("type") == "ERROR":
                    break
        await asyncio.sleep(bounds.WATCH_RETRY_S)
