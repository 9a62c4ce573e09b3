"""Library errors in the command line's spelling.

The library's messages name options as Python keywords (`pass pull=True`, `needs
exactly one of image= or container=`); the `sandbox` command's user gives them as flags
(`--image`, `--memory-limit`) or as `--opt name=value` (JSON values: `--opt pull=true`).
`cli_message` rewrites each `name=value` whose name is an option of a backend in use,
and the names a flag stands for. The flag of each option is read from the parser and
`options_from_args`, so a new flag is spelt here without a second list.
"""

from __future__ import annotations

import argparse
import ast
import functools
import json
import re
import shlex
import sys

from ..backends import BACKENDS, load_backend
from ..backends.toolkit.options import add_backend_arguments, options_from_args
from ..session.options import option_names

# `name=` and an optional Python value (a literal as a message prints it with `!r`),
# not inside a longer word, a path or a flag (`--opt x=`, `A.b=`, `$X=`).
_ASSIGNMENT = re.compile(
    r"(?<![\w.$/-])(?P<name>[a-z][a-z0-9_]*)="
    r"(?P<value>True\b|False\b|None\b|'[^']*'|\"[^\"]*\"|\[[^\]]*\]|-?\d+(?:\.\d+)?\b)?"
)
# A suggestion of the library's unknown-option error: `did you mean 'workdir'?`.
_SUGGESTION = re.compile(r"did you mean '(?P<name>[a-z][a-z0-9_]*)'")
# A bare option name with an underscore (`memory_limit_bytes`): never an English word.
_BARE = re.compile(r"(?<![\w.$/=-])(?P<name>[a-z][a-z0-9]*(?:_[a-z0-9]+)+)(?![\w=])")


@functools.cache
def option_flags() -> dict[str, tuple[str, bool]]:
    """Option name -> (its flag, whether the flag takes no value), for each option a
    flag of `add_backend_arguments` sets."""
    parser = argparse.ArgumentParser(add_help=False)
    add_backend_arguments(parser)
    flags: dict[str, tuple[str, bool]] = {}
    for action in parser._actions:  # argparse keeps its actions there, and only there
        if not action.option_strings or action.dest in ("backend", "opt"):
            continue
        switch = action.nargs == 0
        given = argparse.Namespace(backend="unix_local", opt=[])
        setattr(given, action.dest, True if switch else 1)
        for name in options_from_args(given)[1]:
            flags[name] = (action.option_strings[0], switch)
    return flags


def _known_options() -> set[str]:
    """The options of every backend imported so far (the one that raised is among
    them: a backend's module is imported only when one of its sessions is made)."""
    names: set[str] = set()
    for backend, info in BACKENDS.items():
        if info.module in sys.modules:
            names.update(option_names(load_backend(backend)))
    return names


def _cli_value(text: str) -> str:
    """A printed Python literal as `--opt` reads it: JSON where it is one, else text."""
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text
    if isinstance(value, str):
        return shlex.quote(value)
    return json.dumps(value, separators=(",", ":"))


def _assignment(name: str, value: str | None) -> str:
    flag = option_flags().get(name)
    if value is None:
        if flag is not None:
            return flag[0]
        return f"--opt {name}=VALUE"
    shown = _cli_value(value)
    if flag is not None:
        spelling, switch = flag
        if not switch:
            return f"{spelling} {shown}"
        if value == "True":
            return spelling
    return f"--opt {name}={shown}"


def cli_message(message: str) -> str:
    """`message` with the options of the backends in use spelt as the command takes
    them: `pull=True` as `--opt pull=true`, `image=` as `--image`, `memory_limit_bytes`
    as `--memory-limit`."""
    known = _known_options()
    if not known:
        return message
    flags = option_flags()

    def assignment(match: re.Match[str]) -> str:
        name = match["name"]
        return _assignment(name, match["value"]) if name in known else match[0]

    def suggestion(match: re.Match[str]) -> str:
        flag = flags.get(match["name"])
        return f"did you mean {flag[0]}" if flag is not None else match[0]

    def bare(match: re.Match[str]) -> str:
        flag = flags.get(match["name"])
        return flag[0] if flag is not None and match["name"] in known else match[0]

    # The unknown-option error's list names what `--opt` takes: kept as it is.
    head, listing, names = message.partition(" (its options: ")
    head = _ASSIGNMENT.sub(assignment, head)
    head = _SUGGESTION.sub(suggestion, head)
    return _BARE.sub(bare, head) + listing + names
