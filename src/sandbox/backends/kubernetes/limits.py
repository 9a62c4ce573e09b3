"""The common resource limits as a created pod's container `resources.limits`.

`memory_limit_bytes` becomes `limits.memory` in bytes and `cpu_limit` `limits.cpu` in
millicores (Kubernetes quantities, `pkg/apis/core/types.go` `ResourceRequirements`; with
only limits given, the API server copies them to requests). `process_limit` has no
per-pod field (the pids limit is the kubelet's node-wide `podPidsLimit`), so it is
refused, as is any limit on an attached `pod=` (its spec is not ours to change).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ...errors import InvalidArgumentError
from ..toolkit import CPU, MEMORY, ResourceLimits, refuse_unsupported


def container_resources(
    limits: ResourceLimits, resources: Mapping[str, Any] | None, *, attach: bool
) -> dict[str, Any] | None:
    """The container's `resources` object: `resources=` with the common limits put in
    its `limits` (they win over the same keys there); None when there is nothing."""
    refuse_unsupported(
        limits,
        backend="kubernetes",
        supported=() if attach else (MEMORY, CPU),
        why=(
            "limits are set in the spec of a pod the session creates (image=), not on an "
            "attached pod="
            if attach
            else "a pod has no process limit of its own (the kubelet's podPidsLimit is per node)"
        ),
    )
    merged: dict[str, Any] = dict(resources or {})
    caps = dict(merged.get("limits") or {})
    if limits.memory_limit_bytes is not None:
        caps["memory"] = str(limits.memory_limit_bytes)
    if limits.cpu_limit is not None:
        millis = round(limits.cpu_limit * 1000)
        if millis < 1:
            raise InvalidArgumentError(f"{CPU} must be at least 0.001 cores on kubernetes")
        caps["cpu"] = f"{millis}m"
    if caps:
        merged["limits"] = caps
    return merged or None
