"""The resource limits a session may ask of its sandbox, checked in one place.

Three options, the same names on every backend: `memory_limit_bytes` (int bytes),
`process_limit` (int processes) and `cpu_limit` (float cores). A remote backend maps
those its provider takes at create (each in the provider's own unit, see
docs/providers.md) and refuses the rest with `UnsupportedOperationError` naming the
option, when the session is opened, before anything is created.
"""

from __future__ import annotations

import math
from collections.abc import Collection
from dataclasses import dataclass

from ...errors import InvalidArgumentError, UnsupportedOperationError

MEMORY = "memory_limit_bytes"
PROCESSES = "process_limit"
CPU = "cpu_limit"


@dataclass(frozen=True, slots=True)
class ResourceLimits:
    """The limits a caller asked for (None: not asked, the provider's default)."""

    memory_limit_bytes: int | None = None
    process_limit: int | None = None
    cpu_limit: float | None = None

    @property
    def asked(self) -> tuple[str, ...]:
        """The names of the options that were given, in their documented order."""
        values = ((MEMORY, self.memory_limit_bytes), (PROCESSES, self.process_limit))
        given = [name for name, value in values if value is not None]
        return (*given, *([CPU] if self.cpu_limit is not None else []))


def check_limits(
    *,
    memory_limit_bytes: object = None,
    process_limit: object = None,
    cpu_limit: object = None,
) -> ResourceLimits:
    """The three options checked: positive ints, and a positive finite number of cores."""
    for name, value in ((MEMORY, memory_limit_bytes), (PROCESSES, process_limit)):
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise InvalidArgumentError(f"{name} must be a positive int, not {value!r}")
    if cpu_limit is not None and (
        isinstance(cpu_limit, bool)
        or not isinstance(cpu_limit, int | float)
        or not math.isfinite(cpu_limit)
        or cpu_limit <= 0
    ):
        raise InvalidArgumentError(f"{CPU} must be a positive number of cores, not {cpu_limit!r}")
    return ResourceLimits(
        memory_limit_bytes=memory_limit_bytes,  # type: ignore[arg-type]
        process_limit=process_limit,  # type: ignore[arg-type]
        cpu_limit=None if cpu_limit is None else float(cpu_limit),
    )


def refuse_unsupported(
    limits: ResourceLimits, *, backend: str, supported: Collection[str], why: str
) -> None:
    """Raise `UnsupportedOperationError` naming the first asked limit not in
    `supported`; `why` says what the provider offers instead."""
    for name in limits.asked:
        if name not in supported:
            raise UnsupportedOperationError(f"{backend} cannot apply {name}: {why}")


def whole_multiple(name: str, value: int, unit: int, unit_name: str) -> int:
    """`value` bytes as a count of `unit`s; a value the provider cannot represent
    exactly is refused rather than rounded to a different limit."""
    count, rest = divmod(value, unit)
    if rest or not count:
        raise InvalidArgumentError(
            f"{name} must be a whole number of {unit_name} ({unit} bytes) on this backend, "
            f"not {value}"
        )
    return count
