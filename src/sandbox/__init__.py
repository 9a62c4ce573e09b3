"""sandbox: open and drive processes (one-shot and interactive PTYs) inside sandboxes.

One API over seven backends: `open_session` opens one by name (`BACKENDS` lists them,
each a `BackendInfo`), `load_backend` gives its session class. A session's results are
`ExecResult` (or an `ExecStream` of `ExecChunk`s), `PtyUpdate` and `PtyProcessInfo`;
`until` takes an `UntilPattern` (a str or a compiled regex); every error is a
`SandboxError`. Backend authors use `sandbox.backend`.
"""

from typing import TYPE_CHECKING, Any

from .backends import BACKENDS, BackendInfo, load_backend, open_session
from .durable import ProcessRef, SessionRef, read_ref_file, resume_session
from .errors import (
    BackendUnavailableError,
    CleanupError,
    CommandNotFoundError,
    ConnectionLostError,
    CredentialsMissingError,
    ExecTimeoutError,
    FileTooLargeError,
    HostPathError,
    InvalidArgumentError,
    NotAFileError,
    ProcessExitedError,
    ProviderError,
    PtyProcessNotFoundError,
    RefNotTrustedError,
    SandboxError,
    SandboxFileNotFoundError,
    SessionClosedError,
    SessionGoneError,
    SessionNotStartedError,
    SessionStateError,
    SessionTakenOverError,
    StdinClosedError,
    UnknownBackendError,
    UnsupportedOperationError,
    WorkdirError,
    WorkspacePathError,
)
from .output.until import UntilPattern
from .session import BaseSandboxSession, SessionState
from .session.exec_stream import ExecChunk, ExecStream
from .types import ExecResult, PtyProcessInfo, PtyUpdate
from .workspace import ExposedPort, FileInfo, SnapshotRef

if TYPE_CHECKING:
    from .terminal.screen import ScreenSnapshot


def __getattr__(name: str) -> Any:
    # `ScreenSnapshot` is loaded on first use: `import sandbox` stays free of the
    # terminal emulator (pyte) until a screen is made.
    if name == "ScreenSnapshot":
        from .terminal.screen import ScreenSnapshot

        return ScreenSnapshot
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "BACKENDS",
    "BackendInfo",
    "BackendUnavailableError",
    "BaseSandboxSession",
    "CleanupError",
    "CommandNotFoundError",
    "ConnectionLostError",
    "CredentialsMissingError",
    "ExecChunk",
    "ExecResult",
    "ExecStream",
    "ExecTimeoutError",
    "ExposedPort",
    "FileInfo",
    "FileTooLargeError",
    "HostPathError",
    "InvalidArgumentError",
    "NotAFileError",
    "ProcessExitedError",
    "ProcessRef",
    "ProviderError",
    "PtyProcessInfo",
    "PtyProcessNotFoundError",
    "PtyUpdate",
    "RefNotTrustedError",
    "SandboxError",
    "SandboxFileNotFoundError",
    "ScreenSnapshot",
    "SessionClosedError",
    "SessionGoneError",
    "SessionNotStartedError",
    "SessionRef",
    "SessionState",
    "SessionStateError",
    "SessionTakenOverError",
    "SnapshotRef",
    "StdinClosedError",
    "UnknownBackendError",
    "UnsupportedOperationError",
    "UntilPattern",
    "WorkdirError",
    "WorkspacePathError",
    "load_backend",
    "open_session",
    "read_ref_file",
    "resume_session",
]
