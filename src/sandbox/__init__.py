"""sandbox: open and drive processes (one-shot and interactive PTYs) inside sandboxes.

One API over seven backends; see `open_session`.
"""

from typing import TYPE_CHECKING, Any

from .backends import BACKENDS, BackendInfo, load_backend, open_session
from .errors import (
    BackendUnavailableError,
    CleanupError,
    CommandNotFoundError,
    ConnectionLostError,
    CredentialsMissingError,
    ExecTimeoutError,
    FileTooLargeError,
    InvalidArgumentError,
    NotAFileError,
    ProcessExitedError,
    ProviderError,
    PtyProcessNotFoundError,
    SandboxError,
    SandboxFileNotFoundError,
    SessionClosedError,
    SessionNotStartedError,
    SessionStateError,
    StdinClosedError,
    UnknownBackendError,
    UnsupportedOperationError,
    WorkdirError,
    WorkspacePathError,
)
from .process_entry import CommandSpec, ProcessSpec, PtyEntry
from .session import BaseSandboxSession, SessionState
from .settle import settle, settle_each
from .types import ExecResult, PtyProcessInfo, PtyUpdate

if TYPE_CHECKING:
    from .screen import ScreenSnapshot


def __getattr__(name: str) -> Any:
    # `ScreenSnapshot` is loaded on first use: `import sandbox` stays free of the
    # terminal emulator (pyte) until a screen is made.
    if name == "ScreenSnapshot":
        from .screen import ScreenSnapshot

        return ScreenSnapshot
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "BACKENDS",
    "BackendInfo",
    "BackendUnavailableError",
    "BaseSandboxSession",
    "CleanupError",
    "CommandNotFoundError",
    "CommandSpec",
    "ConnectionLostError",
    "CredentialsMissingError",
    "ExecResult",
    "ExecTimeoutError",
    "FileTooLargeError",
    "InvalidArgumentError",
    "NotAFileError",
    "ProcessExitedError",
    "ProcessSpec",
    "ProviderError",
    "PtyEntry",
    "PtyProcessInfo",
    "PtyProcessNotFoundError",
    "PtyUpdate",
    "SandboxError",
    "SandboxFileNotFoundError",
    "ScreenSnapshot",
    "SessionClosedError",
    "SessionNotStartedError",
    "SessionState",
    "SessionStateError",
    "StdinClosedError",
    "UnknownBackendError",
    "UnsupportedOperationError",
    "WorkdirError",
    "WorkspacePathError",
    "load_backend",
    "open_session",
    "settle",
    "settle_each",
]
