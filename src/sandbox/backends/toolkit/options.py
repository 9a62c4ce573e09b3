"""Backend option names: the one name of each concept, and the command-line flags that
choose a backend and its options (shared by every subcommand that opens a session:
`run`, `shell`, `mcp`).

Every backend spells a concept it shares with another the same way (docs/providers.md,
"Options"): `call_timeout_s`, `keep`, `workdir`, `image`, ... An earlier spelling is
refused by `refuse_renamed` with an error naming the name to use: there is no alias.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from typing import Any

from ...errors import InvalidArgumentError

# An earlier option name -> the one name of its concept. A backend that takes an old
# name as its own option (blaxel's `workspace`, its account; e2b's `start_timeout_s`)
# binds it in its signature, so it never reaches `refuse_renamed`.
RENAMED: Mapping[str, str] = {
    # the bound on one provider call that is not a stream
    "api_timeout": "call_timeout_s",
    "api_timeout_s": "call_timeout_s",
    "request_timeout_s": "call_timeout_s",
    # leave the sandbox (container, pod) running at close
    "keep_container": "keep",
    "keep_pod": "keep",
    # the folder commands start in and relative paths point into
    "workspace": "workdir",
    # what a fresh sandbox is made from
    "template": "image",
    # the bound on creating the sandbox and waiting for it to run
    "start_timeout_s": "create_timeout_s",
    # the bound on each provider call made while tearing down
    "kill_timeout_s": "teardown_timeout_s",
    # variables added to every command
    "envs": "env",
    # the provider's API (docker: the engine)
    "base_url": "api_url",
    # marks on what the session creates
    "metadata": "labels",
    # an existing sandbox to attach to
    "name": "sandbox_id",
    # the limits, under the names every backend checks (`toolkit.limits`)
    "memory": "memory_limit_bytes",
    "pids_limit": "process_limit",
    "cpus": "cpu_limit",
}


def refuse_renamed(cls: type, options: Mapping[str, Any]) -> None:
    """Raise `InvalidArgumentError` when `options` (what the `__init__` of the session
    class `cls` did not bind itself, before it passes them to the base) holds an earlier
    name of an option `cls` takes, naming the one to use. An earlier name of an option
    `cls` does not take is left to the base, whose unknown-option error names it. Values
    never appear (one may be a secret)."""
    from ...session.options import option_names

    given = [old for old in sorted(options) if old in RENAMED]
    if not given:
        return
    takes = set(option_names(cls))
    for old in given:
        new = RENAMED[old]
        if new in takes:
            backend = getattr(cls, "backend_name", cls.__name__)
            raise InvalidArgumentError(
                f"the {backend} option {old}= is now {new}= (one name per concept on "
                "every backend: docs/providers.md, Options)"
            )


# An earlier flag -> the one to use (refused with a usage error naming it, never aliased).
RENAMED_FLAGS: Mapping[str, str] = {"--workspace": "--workdir"}


class _RenamedFlag(argparse.Action):
    """An earlier flag: a usage error naming the one to use."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: object,
        option_string: str | None = None,
    ) -> None:
        flag = option_string or self.option_strings[0]
        parser.error(f"{flag} is now {RENAMED_FLAGS[flag]}")


def add_backend_arguments(parser: argparse.ArgumentParser) -> None:
    """Add `--backend`, the common backend options and the generic `--opt KEY=VALUE`."""
    # Imported here: backends import this module, and the cli's modules import backends.
    from ...cli.limit_flags import add_limit_arguments
    from .. import BACKENDS

    for old in RENAMED_FLAGS:
        parser.add_argument(old, action=_RenamedFlag, help=argparse.SUPPRESS)
    parser.add_argument(
        "--backend",
        default="unix_local",
        choices=sorted(BACKENDS),
        help="backend to use (default: %(default)s)",
    )
    parser.add_argument(
        "--workdir",
        help="the session's folder: on unix_local a host folder (default: a temporary "
        "one), on docker, kubernetes, modal and blaxel a folder in the sandbox",
    )
    parser.add_argument(
        "--confine", action="store_true", help="unix_local: run inside a bubblewrap jail"
    )
    parser.add_argument(
        "--network", action="store_true", help="unix_local --confine: allow network access"
    )
    parser.add_argument(
        "--image",
        help="what a new sandbox is made from: an image (docker, kubernetes, modal, "
        "daytona, blaxel) or an e2b template",
    )
    parser.add_argument("--container", help="docker: existing container to attach to")
    parser.add_argument(
        "--sandbox-id", dest="sandbox_id", help="cloud backends: attach to this sandbox id"
    )
    add_limit_arguments(parser)
    parser.add_argument(
        "--opt",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="any other backend option (VALUE is parsed as JSON when it can be)",
    )


def _parse_value(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


def options_from_args(args: argparse.Namespace) -> tuple[str, dict[str, Any]]:
    """The backend name and the options dict to pass to `open_session`."""
    from ...cli.limit_flags import limit_options

    options: dict[str, Any] = {}
    for key in ("workdir", "image", "container", "sandbox_id"):
        value = getattr(args, key, None)
        if value is not None:
            options[key] = value
    if getattr(args, "confine", False):
        options["confine"] = True
    if getattr(args, "network", False):
        options["network"] = True
    options.update(limit_options(args))
    for item in getattr(args, "opt", []):
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--opt expects KEY=VALUE, got {item!r}")
        options[key.strip().replace("-", "_")] = _parse_value(value)
    return args.backend, options
