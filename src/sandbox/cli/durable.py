"""`sandbox open` and `sandbox close`, and the `--session REF_FILE` of `run`, `shell`, `cp`.

`sandbox open [--backend ...] > ref.json` starts a session, detaches from it and prints
its ref (one JSON line): the sandbox keeps running, owned by the ref. `run`/`shell`/`cp
--session ref.json` resume it, take it over, and detach again at the end, writing the
new ref back to the file (`ref_file`: replaced atomically, mode 0600). `sandbox close
ref.json` resumes and closes it (the sandbox is deleted as by `aclose()`) and removes the
file. Credentials are never in a ref: give them again (`--opt`, the environment).

On `unix_local`, `sandbox open` opens the session with `runner=True` when this install
has the runner (and no option it cannot honour was given): the local runner daemon keeps
its processes between CLI calls, like tmux, so `run --session` finds the processes an
earlier call started, with what they printed meanwhile. `--opt runner=false` opens it
without (processes then end with the command that started them).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from ..backends.toolkit import options as cli_options
from ..durable.ref_file import read_ref_file
from ..durable.resume import resume_session
from ..runner import unavailable_reason
from ..session import BaseSandboxSession
from .session import open_cli_session


def add_session_argument(parser: argparse.ArgumentParser) -> None:
    """`--session REF_FILE` for `run`, `shell` and `cp`."""
    parser.add_argument(
        "--session",
        metavar="REF_FILE",
        help="resume the session `sandbox open` wrote to REF_FILE (and keep it there)",
    )


def add_commands(commands: Any) -> None:
    """The `open` and `close` subcommands."""
    opener = commands.add_parser(
        "open", help="start a session, leave it running, print its ref (JSON) on stdout"
    )
    cli_options.add_backend_arguments(opener)
    closer = commands.add_parser("close", help="close (delete) the session a ref file names")
    closer.add_argument("ref_file", help="the file `sandbox open` wrote")
    closer.add_argument(
        "--opt", action="append", default=[], metavar="KEY=VALUE", help="backend option"
    )


@asynccontextmanager
async def cli_session(
    backend: str, options: dict[str, Any], session_file: str | None
) -> AsyncIterator[BaseSandboxSession]:
    """The session of `run`/`shell`/`cp`: a fresh one (closed at the end), or with
    `--session` the resumed one (detached at the end, its new ref in the file)."""
    if session_file is None:
        async with open_cli_session(backend, one_off(backend, options)) as session:
            yield session
        return
    path = _absolute(session_file)
    session = resume_session(read_ref_file(path), ref_file=path, **_extra(options))
    await session.start()
    try:
        yield session
    finally:
        await session.detach()


def _absolute(path: str) -> str:
    # Resolved now: the resumed session opens the file's folder before anything runs.
    return os.path.abspath(path)


def _extra(options: dict[str, Any]) -> dict[str, Any]:
    # Only the generic options go to a resume: the ref says where the sandbox is.
    return {k: v for k, v in options.items() if k not in ("workdir", "image", "container")}


# The backends whose sessions go through the runner by default (docs/runner.md).
_RUNNER_BY_DEFAULT = ("docker", "kubernetes")


def one_off(backend: str, options: dict[str, Any]) -> dict[str, Any]:
    """`options` for a session closed after one command: `runner=False` on a backend that
    would start the runner by default, unless `runner` was given. Its processes end with
    the session anyway, and putting the runner in and linking to it costs about 130 ms
    more than the one exec it would save (docs/performance.md)."""
    if backend not in _RUNNER_BY_DEFAULT or "runner" in options:
        return options
    return {**options, "runner": False}


# Options a unix_local session through the runner refuses (`UnixLocalSession`).
_NOT_WITH_RUNNER = ("memory_limit_bytes", "process_limit", "cpu_limit", "containment")


def detachable(backend: str, options: dict[str, Any]) -> dict[str, Any]:
    """`options`, with `runner=True` for a unix_local session that can have it: the
    runner is built, and neither `runner` nor an option it refuses was given."""
    if (
        backend != "unix_local"
        or "runner" in options
        or any(options.get(name) is not None for name in _NOT_WITH_RUNNER)
        or unavailable_reason() is not None
    ):
        return options
    return {**options, "runner": True}


async def open_command(args: argparse.Namespace) -> int:
    """`sandbox open`: start, detach, print the ref."""
    backend, options = cli_options.options_from_args(args)
    options = detachable(backend, options)
    async with open_cli_session(backend, options) as session:
        ref = await session.detach()
    sys.stdout.write(ref.to_json() + "\n")
    sys.stdout.flush()
    return 0


async def close_command(args: argparse.Namespace) -> int:
    """`sandbox close REF_FILE`: resume and close; the file is removed."""
    path = _absolute(args.ref_file)
    extra: dict[str, Any] = {}
    for item in args.opt:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--opt expects KEY=VALUE, got {item!r}")
        extra[key.strip().replace("-", "_")] = cli_options._parse_value(value)
    session = resume_session(read_ref_file(path), ref_file=path, **extra)
    async with session:
        pass
    return 0
