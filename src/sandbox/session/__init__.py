"""The session core: `BaseSandboxSession` and the collaborators it is built from.

`base` holds the public orchestration (options, lifecycle, exec, files, `pty_*`); the
hooks a backend implements are its own module (`hooks`); the process registry, the
tasks the session owns, the window loop, the one-shot skeleton, the start and close
work (`lifecycle`) and the call groups (`pty_calls`, `file_calls`, `workspace_calls`)
each live in their own module beside it. Only the names below are imported from
`sandbox.session`.
"""

from .base import BaseSandboxSession, durable_session_id
from .hooks import SessionHooks
from .lifecycle import SessionState
from .registry import ID_RANGE, MAX_PROCESSES, PROTECTED_RECENT, WARN_PROCESSES
from .windows import SCREEN_CHECK_SLICE_S

__all__ = [
    "ID_RANGE",
    "MAX_PROCESSES",
    "PROTECTED_RECENT",
    "SCREEN_CHECK_SLICE_S",
    "WARN_PROCESSES",
    "BaseSandboxSession",
    "SessionHooks",
    "SessionState",
    "durable_session_id",
]
