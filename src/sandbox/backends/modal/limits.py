"""The resource limits of a Modal sandbox, as `Sandbox.create` takes them.

Modal (modal==1.6.4, `modal._resources.convert_fn_config_to_resources_config`) takes
`memory` in MiB and `cpu` in cores, each as an int/float request or a `(request, limit)`
pair, turned into whole MiB and whole millicores (`int(1000 * cpu)`, which truncates).
A limit here is a hard limit, so both are passed as `(value, value)`. A value that is
not a whole number of MiB or of millicores is refused rather than rounded to another
limit. Modal has no process limit. Limits apply at create, never to an attached
sandbox.
"""

from __future__ import annotations

import math
from typing import Any

from ...errors import InvalidArgumentError, UnsupportedOperationError
from ..toolkit import CPU, MEMORY, ResourceLimits, refuse_unsupported, whole_multiple

MIB = 1024 * 1024


def create_resources(limits: ResourceLimits, *, attach: bool) -> dict[str, Any]:
    """The `Sandbox.create` keywords for `limits` (`memory`, `cpu`)."""
    refuse_unsupported(
        limits,
        backend="modal",
        supported=(MEMORY, CPU),
        why="Modal's Sandbox.create takes cpu and memory only",
    )
    if attach and limits.asked:
        raise UnsupportedOperationError(
            f"modal cannot apply {limits.asked[0]} to an attached sandbox (sandbox_id): "
            "limits are set when a sandbox is created"
        )
    resources: dict[str, Any] = {}
    if limits.memory_limit_bytes is not None:
        mib = whole_multiple(MEMORY, limits.memory_limit_bytes, MIB, "MiB")
        resources["memory"] = (mib, mib)
    if limits.cpu_limit is not None:
        cores = cores_for_millis(_millicores(limits.cpu_limit))
        resources["cpu"] = (cores, cores)
    return resources


def _millicores(cores: float) -> int:
    millis = round(cores * 1000)
    if millis < 1 or not math.isclose(cores * 1000, millis, rel_tol=0, abs_tol=1e-6):
        raise InvalidArgumentError(
            f"{CPU} must be a whole number of millicores (0.001 core) on modal, not {cores!r}"
        )
    return millis


def cores_for_millis(millis: int) -> float:
    """The float whose `int(1000 * cores)` (what the SDK sends) is `millis`: `millis /
    1000` can fall just below (0.029 * 1000 is 28.999...), then the next float up."""
    cores = millis / 1000
    while int(1000 * cores) < millis:
        cores = math.nextafter(cores, math.inf)
    return cores
