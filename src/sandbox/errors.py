"""The error hierarchy: every error the library raises derives from `SandboxError`.

Each error carries a human-readable message and a `retryable` flag that tells the caller
whether trying the same call again may succeed (a busy provider, a dropped connection)
or cannot (a bad argument, a missing credential, an unknown process id).
"""

from __future__ import annotations


class SandboxError(Exception):
    """Base class of every error raised by the library.

    `retryable` is True when the same call may succeed if tried again later.
    """

    retryable: bool = False

    def __init__(self, message: str, *, retryable: bool | None = None) -> None:
        super().__init__(message)
        self.message = message
        if retryable is not None:
            self.retryable = retryable

    def __str__(self) -> str:
        return self.message


class InvalidArgumentError(SandboxError, ValueError):
    """An argument is out of range or of the wrong kind (a negative yield time, NaN...)."""


class UnknownBackendError(SandboxError, LookupError):
    """`open_session` was given a backend name that is not registered."""


class BackendUnavailableError(SandboxError):
    """The backend exists but cannot be used here: its extra is not installed, or the
    host lacks what it needs (e.g. bubblewrap for confinement)."""


class CredentialsMissingError(SandboxError):
    """A provider credential was neither passed as an option nor found in the environment."""


class SessionStateError(SandboxError):
    """The session is not in a state that allows the call (not started, or closed)."""


class SessionNotStartedError(SessionStateError):
    """A call was made before `start()` (or outside `async with`)."""


class SessionClosedError(SessionStateError):
    """A call was made after `aclose()`."""


class PtyProcessNotFoundError(SandboxError, LookupError):
    """No live process has this id (it never existed, exited and was collected, or was
    terminated)."""


class StdinClosedError(SandboxError):
    """Input was written to a process started with `tty=False`, whose stdin is closed."""


class ProcessExitedError(SandboxError):
    """Input was written to a process that has already exited. Nothing is lost: poll it
    (empty chars) to collect its remaining output and exit code."""


class UnsupportedOperationError(SandboxError):
    """The backend's provider cannot do this (e.g. resizing a terminal it does not expose)."""


class ExecTimeoutError(SandboxError):
    """A one-shot `exec` ran past its timeout; its process tree was killed.

    `stdout` and `stderr` hold what it printed before it was killed.
    """

    def __init__(self, message: str, *, stdout: bytes = b"", stderr: bytes = b"") -> None:
        super().__init__(message, retryable=False)
        self.stdout = stdout
        self.stderr = stderr

    @classmethod
    def killed(
        cls,
        display: str,
        timeout: float | None,
        stdout: bytes | bytearray,
        stderr: bytes | bytearray,
    ) -> ExecTimeoutError:
        """The error every backend raises for a command killed at its timeout, keeping
        what it printed (the command is shown shortened, never more than 200 chars)."""
        after = f"after {timeout:g}s" if timeout is not None else "at its deadline"
        return cls(
            f"command timed out {after} and was killed: {display[:200]}",
            stdout=bytes(stdout),
            stderr=bytes(stderr),
        )


class WorkspacePathError(SandboxError, ValueError):
    """A file path escapes the workspace (`..`, an absolute path outside it, a symlink out)."""


class SandboxFileNotFoundError(SandboxError, FileNotFoundError):
    """`read_file` named a file that does not exist."""


class ProviderError(SandboxError):
    """The provider (engine, API, SDK) failed the request. `retryable` follows the
    provider's answer: busy/unavailable/timeouts are retryable, bad requests are not."""


class ConnectionLostError(ProviderError):
    """The connection to the provider dropped while a process was running."""

    retryable = True


class CleanupError(SandboxError):
    """Several teardowns in one batch failed; `errors` holds each failure."""

    def __init__(self, message: str, errors: list[BaseException]) -> None:
        super().__init__(message)
        self.errors = errors
