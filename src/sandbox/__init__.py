"""sandbox: open and drive processes (one-shot and interactive PTYs) inside sandboxes.

One API over seven backends; see `open_session`.
"""

from .backends import BACKENDS, BackendInfo, load_backend, open_session
from .errors import (
    BackendUnavailableError,
    CleanupError,
    ConnectionLostError,
    CredentialsMissingError,
    ExecTimeoutError,
    InvalidArgumentError,
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
    WorkspacePathError,
)
from .process_entry import CommandSpec, ProcessSpec, PtyEntry
from .session import BaseSandboxSession, SessionState
from .settle import settle, settle_each
from .types import ExecResult, PtyProcessInfo, PtyUpdate

__all__ = [
    "BACKENDS",
    "BackendInfo",
    "BackendUnavailableError",
    "BaseSandboxSession",
    "CleanupError",
    "CommandSpec",
    "ConnectionLostError",
    "CredentialsMissingError",
    "ExecResult",
    "ExecTimeoutError",
    "InvalidArgumentError",
    "ProcessExitedError",
    "ProcessSpec",
    "ProviderError",
    "PtyEntry",
    "PtyProcessInfo",
    "PtyProcessNotFoundError",
    "PtyUpdate",
    "SandboxError",
    "SandboxFileNotFoundError",
    "SessionClosedError",
    "SessionNotStartedError",
    "SessionState",
    "SessionStateError",
    "StdinClosedError",
    "UnknownBackendError",
    "UnsupportedOperationError",
    "WorkspacePathError",
    "load_backend",
    "open_session",
    "settle",
    "settle_each",
]
