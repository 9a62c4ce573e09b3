"""The resource limits a Blaxel sandbox takes at create, from the portable options.

Blaxel's create (`blaxel==0.4.24`, `SandboxRuntime.memory`: "Memory allocation in
megabytes. Also determines CPU allocation (CPU cores = memory in MB / 2048)") takes a
memory size in whole MiB and nothing else: its CPU follows the memory and there is no
process-count limit. So:

- `memory_limit_bytes` (int) becomes `memory` in MiB; a size that is not a whole
  number of MiB is refused (`InvalidArgumentError`), not rounded to another size;
- `cpu_limit` and `process_limit` raise `UnsupportedOperationError` naming the option.

All of it is checked when the session is made, before anything is created.
"""

from __future__ import annotations

from ...errors import InvalidArgumentError, UnsupportedOperationError

MIB = 1024 * 1024


def memory_mib(
    memory_limit_bytes: object, *, process_limit: object, cpu_limit: object
) -> int | None:
    """The `memory` (MiB) to create the sandbox with, from `memory_limit_bytes` (None:
    Blaxel's default)."""
    if cpu_limit is not None:
        raise UnsupportedOperationError(
            "blaxel has no cpu_limit: a sandbox's CPU follows its memory "
            "(memory MB / 2048 cores); set memory_limit_bytes instead"
        )
    if process_limit is not None:
        raise UnsupportedOperationError("blaxel has no process_limit (Blaxel offers none)")
    if memory_limit_bytes is None:
        return None
    if (
        isinstance(memory_limit_bytes, bool)
        or not isinstance(memory_limit_bytes, int)
        or memory_limit_bytes <= 0
    ):
        raise InvalidArgumentError(
            f"memory_limit_bytes must be a positive int (bytes), not {memory_limit_bytes!r}"
        )
    if memory_limit_bytes % MIB:
        raise InvalidArgumentError(
            f"memory_limit_bytes must be a whole number of MiB on blaxel (Blaxel takes "
            f"memory in MB), not {memory_limit_bytes}"
        )
    return memory_limit_bytes // MIB
