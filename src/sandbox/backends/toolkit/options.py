"""Command-line flags that choose a backend and its options, shared by every subcommand
that opens a session (`run`, `shell`, `mcp`)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from ...cli.limit_flags import add_limit_arguments, limit_options
from .. import BACKENDS


def add_backend_arguments(parser: argparse.ArgumentParser) -> None:
    """Add `--backend`, the common backend options and the generic `--opt KEY=VALUE`."""
    parser.add_argument(
        "--backend",
        default="unix_local",
        choices=sorted(BACKENDS),
        help="backend to use (default: %(default)s)",
    )
    parser.add_argument("--workspace", help="unix_local: workspace directory")
    parser.add_argument(
        "--confine", action="store_true", help="unix_local: run inside a bubblewrap jail"
    )
    parser.add_argument(
        "--network", action="store_true", help="unix_local --confine: allow network access"
    )
    parser.add_argument("--image", help="docker: image to start a fresh container from")
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
    options: dict[str, Any] = {}
    for key in ("workspace", "image", "container", "sandbox_id"):
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
