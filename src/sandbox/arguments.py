"""Validation and normalisation of the public API's arguments.

Bad input gets a clear `InvalidArgumentError` before anything is started.
"""

from __future__ import annotations

import math
import re
import shlex
from collections.abc import Mapping, Sequence

from .errors import InvalidArgumentError
from .process_entry import CommandSpec

# Re-exported: the session checks a size through `arguments` like every other argument.
from .terminal.size import MAX_TERMINAL_SIDE as MAX_TERMINAL_SIDE
from .terminal.size import check_terminal_size as check_terminal_size

_SURROGATE = re.compile("[\ud800-\udfff]")
_VARIABLE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

START_YIELD_S = 10.0
WRITE_YIELD_S = 0.25
MIN_YIELD_S = 0.25
MAX_YIELD_S = 30.0
EMPTY_POLL_MIN_YIELD_S = 5.0


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


def check_timeout(timeout: float | None) -> float | None:
    """An exec timeout is None (no limit) or a positive, finite number of seconds."""
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, int | float):
        raise InvalidArgumentError(f"timeout must be a number of seconds, not {timeout!r}")
    if not math.isfinite(timeout) or timeout <= 0:
        raise InvalidArgumentError(f"timeout must be a positive, finite number, got {timeout!r}")
    return float(timeout)


def check_seconds(
    name: str,
    value: object,
    *,
    allow_zero: bool = False,
    allow_none: bool = False,
) -> float | None:
    """A session option in seconds: a finite number, > 0 (or >= 0 with `allow_zero`),
    or None where `allow_none`. Checked when the session is opened, not at teardown."""
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        none = " or None" if allow_none else ""
        raise InvalidArgumentError(
            f"{name} must be a number of seconds{none}, not {type(value).__name__}"
        )
    if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise InvalidArgumentError(f"{name} must be a finite number {bound}, got {value!r}")
    return float(value)


def check_output_limit(name: str, value: object) -> int:
    """A bound on kept output, in bytes: an int >= 0 (0 keeps nothing, counts all)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidArgumentError(f"{name} must be an int >= 0 (bytes), not {value!r}")
    return value


def check_text(name: str, value: str) -> str:
    """`value` (a str) as data: no NUL byte and no lone surrogate, since neither can cross
    to a process (a C string ends at NUL; a surrogate has no UTF-8 form). The value is
    never quoted: it may be a secret."""
    if "\x00" in value:
        raise InvalidArgumentError(f"{name} must not contain NUL bytes")
    if _SURROGATE.search(value):
        raise InvalidArgumentError(
            f"{name} must be valid Unicode text (it holds a lone surrogate, which has no"
            " UTF-8 form)"
        )
    return value


def check_str(name: str, value: object, *, allow_none: bool = True) -> str | None:
    """A non-empty str without NUL bytes or lone surrogates (or None where allowed)."""
    if value is None and allow_none:
        return None
    if not isinstance(value, str) or not value:
        raise InvalidArgumentError(f"{name} must be a non-empty str, not {value!r}")
    return check_text(name, value)


def check_env(env: object, *, name: str = "env", variables: bool = True) -> dict[str, str] | None:
    """An environment mapping of str names to str values (no NUL, no lone surrogate).

    With `variables` (environment variables) a name is a portable shell name
    (`[A-Za-z_][A-Za-z0-9_]*`): anything else cannot be exported by a shell, and a
    remote backend could not pass it on. Otherwise (labels, metadata) a name is any
    non-empty str without '=' or NUL. Values are never quoted in errors: they may be
    secrets."""
    if env is None:
        return None
    if not isinstance(env, Mapping):
        raise InvalidArgumentError(
            f"{name} must be a mapping of variable names to str values, not {type(env).__name__}"
        )
    checked: dict[str, str] = {}
    for key, value in env.items():
        if variables:
            if not isinstance(key, str) or not _VARIABLE_NAME.fullmatch(key):
                raise InvalidArgumentError(
                    f"{name} has an invalid variable name {key!r} (letters, digits and '_',"
                    " not starting with a digit)"
                )
        elif (
            not isinstance(key, str)
            or not key
            or "=" in key
            or "\x00" in key
            or _SURROGATE.search(key)
        ):
            raise InvalidArgumentError(
                f"{name} has an invalid name {key!r} (a non-empty str without '=')"
            )
        if not isinstance(value, str):
            raise InvalidArgumentError(f"{name}[{key!r}] must be a str, not {type(value).__name__}")
        checked[key] = check_text(f"{name}[{key!r}]", value)
    return checked


def to_input_bytes(chars: str | bytes) -> bytes:
    """Keystrokes as bytes: str is UTF-8 encoded, bytes pass through. The surrogates
    `surrogateescape` makes of undecodable bytes (U+DC80..U+DCFF) stand for those bytes;
    any other lone surrogate has no byte form and is refused."""
    if isinstance(chars, str):
        try:
            return chars.encode("utf-8", "surrogateescape")
        except UnicodeEncodeError:
            raise InvalidArgumentError(
                "chars must be valid Unicode text (it holds a lone surrogate, which has no"
                " UTF-8 form)"
            ) from None
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
        check_text("a command part", part)
    checked_env = check_env(env)
    if cwd is not None:
        if not isinstance(cwd, str):
            raise InvalidArgumentError(f"cwd must be a str, not {type(cwd).__name__}")
        check_text("cwd", cwd)
        cwd = cwd or None  # "" is the default directory, as if not given
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
        env=checked_env,
        cwd=cwd,
    )
