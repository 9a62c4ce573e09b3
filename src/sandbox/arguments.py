"""Validation and normalisation of the public API's arguments.

Bad input gets a clear `InvalidArgumentError` before anything is started.
"""

from __future__ import annotations

import math
import shlex
from collections.abc import Mapping, Sequence

from .errors import InvalidArgumentError
from .process_entry import CommandSpec

START_YIELD_S = 10.0
WRITE_YIELD_S = 0.25
MIN_YIELD_S = 0.25
MAX_YIELD_S = 30.0
EMPTY_POLL_MIN_YIELD_S = 5.0
MAX_TERMINAL_SIDE = 10_000


def yield_window(value: float | None, default: float, *, floor: float = MIN_YIELD_S) -> float:
    """The window length for a yield time: `default` when None, clamped to
    [`floor`, MAX_YIELD_S]. Negative, NaN and non-numbers are rejected."""
    if value is None:
        value = default
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidArgumentError(f"yield_time_s must be a number of seconds, not {value!r}")
    if math.isnan(value) or value < 0:
        raise InvalidArgumentError(f"yield_time_s must be >= 0 seconds, got {value!r}")
    return min(MAX_YIELD_S, max(floor, float(value)))


def check_max_tokens(value: int | None) -> int | None:
    """`max_output_tokens` must be None (no truncation) or a positive int."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise InvalidArgumentError(
            f"max_output_tokens must be a positive int or None, not {value!r}"
        )
    return value


def check_terminal_size(rows: int, cols: int) -> tuple[int, int]:
    """Rows and columns must be ints in [1, MAX_TERMINAL_SIDE]."""
    for name, value in (("rows", rows), ("cols", cols)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise InvalidArgumentError(f"{name} must be an int, not {value!r}")
        if not 1 <= value <= MAX_TERMINAL_SIDE:
            raise InvalidArgumentError(
                f"{name} must be between 1 and {MAX_TERMINAL_SIDE}, got {value}"
            )
    return rows, cols


def check_timeout(timeout: float | None) -> float | None:
    """An exec timeout is None (no limit) or a positive, finite number of seconds."""
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, int | float):
        raise InvalidArgumentError(f"timeout must be a number of seconds, not {timeout!r}")
    if not math.isfinite(timeout) or timeout <= 0:
        raise InvalidArgumentError(f"timeout must be a positive, finite number, got {timeout!r}")
    return float(timeout)


def to_input_bytes(chars: str | bytes) -> bytes:
    """Keystrokes as bytes: str is UTF-8 encoded, bytes pass through."""
    if isinstance(chars, str):
        return chars.encode("utf-8", "surrogateescape")
    if isinstance(chars, bytes | bytearray):
        return bytes(chars)
    raise InvalidArgumentError(f"chars must be str or bytes, not {type(chars).__name__}")


def build_command(
    command: Sequence[str],
    *,
    shell: bool,
    env: Mapping[str, str] | None,
    cwd: str | None,
) -> CommandSpec:
    """Normalise `*command` into a `CommandSpec`.

    With `shell=True` one part is a shell string and several parts are shell-quoted and
    joined; with `shell=False` the parts are the argv.
    """
    if not command:
        raise InvalidArgumentError("a command is required")
    parts = tuple(command)
    for part in parts:
        if not isinstance(part, str):
            raise InvalidArgumentError(f"command parts must be str, not {type(part).__name__}")
        if "\x00" in part:
            raise InvalidArgumentError("command parts must not contain NUL bytes")
    if env is not None:
        for key, value in env.items():
            if not isinstance(key, str) or not isinstance(value, str) or not key or "=" in key:
                raise InvalidArgumentError(f"invalid environment entry {key!r}")
    if cwd is not None and not isinstance(cwd, str):
        raise InvalidArgumentError(f"cwd must be a str, not {type(cwd).__name__}")
    if shell:
        script = parts[0] if len(parts) == 1 else shlex.join(parts)
        if not script.strip():
            raise InvalidArgumentError("the command is empty")
        argv: tuple[str, ...] = ("sh", "-c", script)
        display = script
    else:
        if not parts[0]:
            raise InvalidArgumentError("the program name is empty")
        argv = parts
        script = shlex.join(parts)
        display = script
    return CommandSpec(
        argv=argv,
        shell_command=script,
        display=display,
        shell=shell,
        env=dict(env) if env is not None else None,
        cwd=cwd,
    )
