"""The resource limits of a Daytona sandbox, as the SDK's create takes them.

daytona==0.226.1 takes resources only when a sandbox is created from an image
(`CreateSandboxFromImageParams.resources`, a `daytona.Resources`): `cpu` a whole number
of cores, `memory` (and `disk`) whole GiB. A sandbox made from a snapshot has the
snapshot's resources, and an attached one has its own. So `memory_limit_bytes` and
`cpu_limit` need the `image` option; a value that is not a whole number of GiB or of
cores is refused rather than rounded to another limit. Daytona has no process limit.
"""

from __future__ import annotations

from daytona import Resources

from ...errors import InvalidArgumentError, UnsupportedOperationError
from ..toolkit import CPU, MEMORY, ResourceLimits, refuse_unsupported, whole_multiple

GIB = 1024**3


def create_resources(
    limits: ResourceLimits, *, image: str | None, attach: bool
) -> Resources | None:
    """The `Resources` for `limits` (None when none was asked)."""
    refuse_unsupported(
        limits,
        backend="daytona",
        supported=(MEMORY, CPU),
        why="Daytona's create takes cpu, memory and disk only",
    )
    if not limits.asked:
        return None
    if attach or image is None:
        where = "an attached sandbox (sandbox_id)" if attach else "a sandbox made from a snapshot"
        raise UnsupportedOperationError(
            f"daytona cannot apply {limits.asked[0]} to {where}: Daytona takes resources "
            "only when it creates a sandbox from an image (option image)"
        )
    memory = None
    if limits.memory_limit_bytes is not None:
        memory = whole_multiple(MEMORY, limits.memory_limit_bytes, GIB, "GiB")
    cpu = None
    if limits.cpu_limit is not None:
        if not limits.cpu_limit.is_integer():
            raise InvalidArgumentError(
                f"{CPU} must be a whole number of cores on daytona, not {limits.cpu_limit!r}"
            )
        cpu = int(limits.cpu_limit)
    return Resources(cpu=cpu, memory=memory)
