"""sandbox: open and drive processes (one-shot and interactive PTYs) inside sandboxes.

One API over seven backends; see `open_session`.
"""

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
from .screen import ScreenSnapshot
from .session import BaseSandboxSession, SessionState
from .settle import settle, settle_each
from .types import ExecResult, PtyProcessInfo, PtyUpdate

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
