"""The options of a `KubernetesSession`: what each means (`KubernetesOptions`) and their
checks (`check_options`, which the session's constructor calls with its keywords)."""

from __future__ import annotations

import posixpath
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ...backend import check_env, check_seconds, check_str
from ...errors import InvalidArgumentError
from ..toolkit import check_limits
from .client import PROTOCOLS
from .limits import container_resources
from .pods import PodOptions


@dataclass(frozen=True)
class KubernetesOptions:
    """A kubernetes session's options, checked.

    Exactly one of:
    - `image`: create a pod of this image (label `sandbox.session`, `restartPolicy:
      Never`, kept alive by a shell), wait for it by watch within `create_timeout_s`,
      delete it on close (unless `keep=True`);
    - `pod`: attach to this running pod (its `container`, default the first), left
      running on close.

    Credentials as every Kubernetes tool finds them (`kubeconfig=`, `KUBECONFIG`,
    ~/.kube/config, exec plugins, client certificates, or the in-cluster service
    account), with `context` and `namespace` (default: the context's, else
    "default"). `workdir` (default /workspace) is the created container's working
    directory and where relative paths point; file paths must stay inside it.
    Created pods take `resources` (the container's `resources` object),
    `runtime_class`, `node_selector`, `service_account`, `security_context`,
    `pod_security_context`, `labels`, `image_pull_policy`, `name_prefix`,
    `keepalive_command`, `delete_grace_s`, and the common limits `memory_limit_bytes`
    and `cpu_limit` (the container's `resources.limits`; `process_limit` is refused:
    no per-pod field): together they make `pod_options`. Also `env` (added to every
    command), `terminate_grace_s` (SIGTERM to SIGKILL), `call_timeout_s` (bound on each
    API call that is not a stream), `protocols` (the channel protocols offered, best
    first: default v5 then v4).
    `runner` (default None: auto): processes and commands go through the runner
    (docs/runner.md), put into the pod at start by an exec with stdin (checked by
    sha256) in `runner_dir` (default: `$SANDBOX_RUNNER_DIR`, else the container's
    `$TMPDIR`, else /tmp) and reached by one exec of `connect --start`: a frame per
    start instead of an exec, stdin open or closed, whole-tree kills without a script,
    and processes that outlive their client (`keeps_processes`: durable sessions
    reattach them). None uses it where this install has the runner and the pod takes
    it, else (not built, a read-only or noexec `runner_dir`, another architecture) the
    per-exec path, the reason in `KubernetesSession.runner_fallback_reason` (and a
    logged warning when the delivery or start failed); True requires it (the start
    fails with the reason); False never uses it (an exec per process). Plus the base
    session's.
    """

    kubeconfig: str | None
    context: str | None
    # As given: the session's `namespace` becomes the one the credentials lead to.
    namespace: str | None
    image: str | None
    pod: str | None
    container: str | None
    # Normalized.
    workdir: str
    env: Mapping[str, str]
    pod_options: PodOptions
    keep: bool
    create_timeout_s: float
    call_timeout_s: float
    terminate_grace_s: float
    protocols: tuple[str, ...]
    # None: auto (the runner where it can be used); True: required; False: never.
    runner: bool | None
    runner_dir: str | None


def check_options(
    *,
    kubeconfig: str | None,
    context: str | None,
    namespace: str | None,
    image: str | None,
    pod: str | None,
    container: str | None,
    workdir: str,
    env: Mapping[str, str] | None,
    resources: Mapping[str, Any] | None,
    runtime_class: str | None,
    node_selector: Mapping[str, str] | None,
    service_account: str | None,
    security_context: Mapping[str, Any] | None,
    pod_security_context: Mapping[str, Any] | None,
    labels: Mapping[str, str] | None,
    image_pull_policy: str | None,
    name_prefix: str,
    keepalive_command: Sequence[str],
    keep: bool,
    create_timeout_s: float,
    call_timeout_s: float,
    terminate_grace_s: float,
    delete_grace_s: int,
    protocols: Sequence[str],
    memory_limit_bytes: int | None,
    process_limit: int | None,
    cpu_limit: float | None,
    runner: bool | None,
    runner_dir: str | None,
) -> KubernetesOptions:
    """The session's keywords checked (`InvalidArgumentError` naming the first that is
    wrong; a limit the pod cannot take: `UnsupportedOperationError`) and made into
    `KubernetesOptions`."""
    if (image is None) == (pod is None):
        raise InvalidArgumentError(
            "the kubernetes backend needs exactly one of image= (create a pod) "
            "or pod= (attach to a running one)"
        )
    for name, value in (
        ("kubeconfig", kubeconfig),
        ("context", context),
        ("namespace", namespace),
        ("image", image),
        ("pod", pod),
        ("container", container),
        ("runtime_class", runtime_class),
        ("service_account", service_account),
        ("image_pull_policy", image_pull_policy),
        ("runner_dir", runner_dir),
    ):
        check_str(name, value)
    check_str("workdir", workdir, allow_none=False)
    check_str("name_prefix", name_prefix, allow_none=False)
    if not workdir.startswith("/"):
        raise InvalidArgumentError(f"workdir must be an absolute path, not {workdir!r}")
    if runner is not None and not isinstance(runner, bool):
        raise InvalidArgumentError(
            f"runner must be True, False or None (auto: the runner where it can be used), "
            f"not {runner!r}"
        )
    if runner_dir is not None and not runner_dir.startswith("/"):
        raise InvalidArgumentError(f"runner_dir must be an absolute path, not {runner_dir!r}")
    if image is not None and container is not None:
        raise InvalidArgumentError("container= names a container of an attached pod=")
    keepalive = list(keepalive_command)
    if not keepalive or not all(isinstance(a, str) and a for a in keepalive):
        raise InvalidArgumentError("keepalive_command must be a non-empty list of str")
    offered = tuple(protocols)
    if not offered or not set(offered) <= set(PROTOCOLS):
        raise InvalidArgumentError(f"protocols must be among {', '.join(PROTOCOLS)}")
    if isinstance(delete_grace_s, bool) or not isinstance(delete_grace_s, int):
        raise InvalidArgumentError("delete_grace_s must be an int of seconds")
    start_timeout = check_seconds("create_timeout_s", create_timeout_s)
    timeout = check_seconds("call_timeout_s", call_timeout_s)
    grace = check_seconds("terminate_grace_s", terminate_grace_s, allow_zero=True)
    assert start_timeout is not None and timeout is not None and grace is not None
    normalized = posixpath.normpath(workdir)
    checked_env = dict(check_env(env) or {})
    limits = check_limits(
        memory_limit_bytes=memory_limit_bytes,
        process_limit=process_limit,
        cpu_limit=cpu_limit,
    )
    pod_options = PodOptions(
        workdir=normalized,
        name_prefix=name_prefix,
        resources=container_resources(limits, resources, attach=pod is not None),
        runtime_class=runtime_class,
        node_selector=node_selector,
        service_account=service_account,
        security_context=security_context,
        pod_security_context=pod_security_context,
        labels=dict(labels or {}),
        image_pull_policy=image_pull_policy,
        grace_period_s=max(0, delete_grace_s),
        keepalive=keepalive,
    )
    return KubernetesOptions(
        kubeconfig=kubeconfig,
        context=context,
        namespace=namespace,
        image=image,
        pod=pod,
        container=container,
        workdir=normalized,
        env=checked_env,
        pod_options=pod_options,
        keep=bool(keep),
        create_timeout_s=start_timeout,
        call_timeout_s=timeout,
        terminate_grace_s=grace,
        protocols=offered,
        runner=runner,
        runner_dir=runner_dir,
    )
