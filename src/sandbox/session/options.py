"""`SessionOptions`: the options every session takes, checked when they are given.

`BaseSandboxSession.__init__` builds one from its keyword arguments and keeps it in its
core (`_core.options`). A bad option must
fail when the session is opened, naming the option, never as a `TypeError` at the
first use or at teardown.
"""

from __future__ import annotations

import dataclasses
import difflib
import inspect
import re
from collections.abc import Iterable

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


def option_names(cls: type) -> list[str]:
    """The keyword options `cls(...)` takes, sorted: the keyword parameters of each
    `__init__` along its MRO, down to the first that passes no `**options` on."""
    names: set[str] = set()
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is None or klass is object:
            continue
        try:
            parameters = inspect.signature(init).parameters.values()
        except (TypeError, ValueError):  # a C-level __init__ has no signature to read
            continue
        names.update(p.name for p in parameters if p.kind in _KEYWORD and p.name != "self")
        if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
            break  # this __init__ forwards nothing, so no base's option reaches it
    return sorted(names)


_KEYWORD = (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
_UNEXPECTED = re.compile(r"unexpected keyword argument '(\w+)'")


def bad_option_error(
    backend: str, cls: type, given: Iterable[str], exc: TypeError
) -> InvalidArgumentError:
    """The error for `cls(**options)` having raised `exc`: an option it does not take
    is named, with the closest valid name and the valid names; any other `TypeError`
    keeps its own message. Option values never appear (one may be a secret)."""
    valid = option_names(cls)
    # The name the TypeError gives comes first; any other name outside the signatures
    # next (an earlier name is refused before this by `toolkit.refuse_renamed`).
    given = set(given)
    named = _UNEXPECTED.search(str(exc))
    unknown = sorted(given - set(valid))
    if named is not None and named.group(1) in given:
        unknown.insert(0, named.group(1))
    name = unknown[0] if unknown else None
    if name is None or name in valid:
        return InvalidArgumentError(f"bad option for the {backend} backend: {exc}")
    close = difflib.get_close_matches(name, valid, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return InvalidArgumentError(
        f"unknown option {name!r} for the {backend} backend{hint} (its options: {', '.join(valid)})"
    )
