"""`sandbox mcp --state-file F`: a server that survives its own restart.

When F exists the server resumes the session it names (`resume_session`, taking it
over), else it opens a new one; either way F is kept holding the current ref (the
session's `ref_file`: replaced atomically, mode 0600) as processes start and end. On
stop the server detaches (the sandbox, and the processes its backend keeps, stay for
the next server, which finds them with `list_processes`) unless `--close-on-exit`.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from ..backends import open_session
from ..durable.ref_file import read_ref_file
from ..durable.resume import resume_session
from ..session import BaseSandboxSession


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """`--state-file` and `--close-on-exit`."""
    parser.add_argument(
        "--state-file",
        metavar="PATH",
        help="resume the session PATH names when it exists, keep PATH current, and "
        "detach on stop (the sandbox stays for the next server)",
    )
    parser.add_argument(
        "--close-on-exit",
        action="store_true",
        help="with --state-file: close the session on stop instead of detaching",
    )


def session_for(
    args: argparse.Namespace, backend: str, options: dict[str, Any]
) -> BaseSandboxSession:
    """The session to serve: resumed from the state file, or new."""
    path = getattr(args, "state_file", None)
    if path is None:
        return open_session(backend, **options)
    path = os.path.abspath(path)
    if os.path.lexists(path):
        extra = {k: v for k, v in options.items() if k not in ("workdir", "image", "container")}
        session: BaseSandboxSession = resume_session(read_ref_file(path), ref_file=path, **extra)
        return session
    return open_session(backend, ref_file=path, **options)


def detaches(args: argparse.Namespace) -> bool:
    """Whether the server detaches (rather than closes) its session on stop."""
    return getattr(args, "state_file", None) is not None and not args.close_on_exit
