"""What `sandbox run` and `sandbox shell` share once they have a backend and options:
opening the session with its start errors turned into one clear line, the `--record`
path resolved before the session starts, and the `until` that turns polls into a stream.

Kept apart from `run.py` and `terminal.py` so that neither imports the other.
"""

from __future__ import annotations

import os
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from ..backends import open_session
from ..errors import SandboxError
from ..session import BaseSandboxSession

# Matches any character: a window with this `until` returns as soon as output arrives,
# which turns polls into a stream.
ANY_OUTPUT = re.compile(r"[\s\S]")


def record_path(path: str | None) -> str | None:
    """`--record FILE` with its folder resolved (symlinks followed) now, before the
    session starts: the user names it while no sandboxed process runs, and the library
    follows no symlink in a `record=` path (one could have been planted since). The
    file's own name is kept as given: a symlink there is refused, never followed."""
    if path is None:
        return None
    folder, name = os.path.split(os.path.abspath(path))
    if not name or path.endswith("/"):
        return path  # names a folder: the library refuses it with its own message
    return os.path.join(os.path.realpath(folder), name)


@asynccontextmanager
async def open_cli_session(
    backend: str, options: dict[str, Any]
) -> AsyncIterator[BaseSandboxSession]:
    """Open and start a session for a CLI command, closing it on the way out.

    An `OSError` while starting (a backend should raise a `SandboxError`, but may not
    yet: e.g. a workspace the kernel refuses to create) becomes a `SandboxError` with a
    one-line message, so the command prints that line instead of a traceback.
    """
    session = open_session(backend, **options)
    try:
        await session.start()
    except OSError as exc:
        await session.aclose()
        raise SandboxError(
            f"cannot start the {backend} session: {describe_os_error(exc)}"
        ) from None
    except BaseException:
        await session.aclose()
        raise
    try:
        yield session
    finally:
        await session.aclose()


def describe_os_error(exc: OSError) -> str:
    """`strerror: 'filename'` without the `[Errno N]` prefix, or the plain message."""
    if exc.strerror is None:
        return str(exc) or type(exc).__name__
    if exc.filename is None:
        return exc.strerror
    return f"{exc.strerror}: {exc.filename!r}"
