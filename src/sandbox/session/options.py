"""`SessionOptions`: the options every session takes, checked when they are given.

`BaseSandboxSession.__init__` builds one from its keyword arguments and holds it as
`_session_options` (not `_options`: that name is a backend's own). A bad option must
fail when the session is opened, naming the option, never as a `TypeError` at the
first use or at teardown.
"""

from __future__ import annotations

import dataclasses

from .. import arguments
from ..errors import InvalidArgumentError
from ..exec_output import DEFAULT_EXEC_OUTPUT_LIMIT
from ..files import arguments as files
from ..output.buffer import DEFAULT_OUTPUT_LIMIT
from ..settle import DEFAULT_BATCH_CONCURRENCY
from .registry import MAX_PROCESSES, PROTECTED_RECENT

# The least value of each int option that has one (an output bound under 1 KiB would
# not hold one screenful; a registry must keep more than its protected recent ids).
LEAST = {
    "max_processes": PROTECTED_RECENT + 1,
    "output_limit_bytes": 1024,
    "teardown_concurrency": 1,
}


def _check_at_least(name: str, value: object, least: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgumentError(f"{name} must be an int, not {value!r}")
    if value < least:
        raise InvalidArgumentError(f"{name} must be at least {least}, not {value}")


@dataclasses.dataclass(frozen=True, slots=True)
class SessionOptions:
    """The base session's own options (a backend's options are its own), checked in
    this order when made: `InvalidArgumentError` naming the first bad one.

    `max_processes`: processes at once before the least recently used is pruned;
    `output_limit_bytes`: output kept per process; `teardown_concurrency`: teardowns
    one batch runs at a time; `read_limit_bytes`: the default bound of `read_file`;
    `exec_output_limit_bytes`: what a one-shot `exec` keeps per stream (head and tail,
    see `sandbox.exec_output`).
    """

    max_processes: int = MAX_PROCESSES
    output_limit_bytes: int = DEFAULT_OUTPUT_LIMIT
    teardown_concurrency: int = DEFAULT_BATCH_CONCURRENCY
    read_limit_bytes: int = files.DEFAULT_READ_LIMIT
    exec_output_limit_bytes: int = DEFAULT_EXEC_OUTPUT_LIMIT

    def __post_init__(self) -> None:
        for name, least in LEAST.items():
            _check_at_least(name, getattr(self, name), least)
        files.check_byte_count(self.read_limit_bytes, "read_limit_bytes")
        arguments.check_output_limit("exec_output_limit_bytes", self.exec_output_limit_bytes)
