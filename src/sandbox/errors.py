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

    `stdout` and `stderr` hold what it printed before it was killed, bounded like an
    `ExecResult`'s (head and tail); `stdout_omitted` / `stderr_omitted` count the bytes
    dropped between the two.
    """

    def __init__(
        self,
        message: str,
        *,
        stdout: bytes = b"",
        stderr: bytes = b"",
        stdout_omitted: int = 0,
        stderr_omitted: int = 0,
    ) -> None:
        super().__init__(message, retryable=False)
        self.stdout = stdout
        self.stderr = stderr
        self.stdout_omitted = stdout_omitted
        self.stderr_omitted = stderr_omitted

    @classmethod
    def killed(
        cls,
        display: str,
        timeout: float | None,
        stdout: bytes | bytearray,
        stderr: bytes | bytearray,
        *,
        stdout_omitted: int = 0,
        stderr_omitted: int = 0,
    ) -> ExecTimeoutError:
        """The error every backend raises for a command killed at its timeout, keeping
        what it printed (the command is shown shortened, never more than 200 chars)."""
        after = f"after {timeout:g}s" if timeout is not None else "at its deadline"
        return cls(
            f"command timed out {after} and was killed: {display[:200]}",
            stdout=bytes(stdout),
            stderr=bytes(stderr),
            stdout_omitted=stdout_omitted,
            stderr_omitted=stderr_omitted,
        )


class CommandNotFoundError(SandboxError):
    """The program to execute does not exist or is not an executable file.

    Raised by `exec` and `pty_exec_start` with `shell=False`, on every backend, before
    anything runs. (With `shell=True` the shell looks the program up: a missing one is
    the shell's exit status 127, a normal result.) `program` is the name as given.
    """

    def __init__(self, message: str, *, program: str) -> None:
        super().__init__(message, retryable=False)
        self.program = program


class WorkdirError(SandboxError):
    """The working directory given as `cwd` does not exist, is not a directory, or
    cannot be entered. Raised by `exec` and `pty_exec_start` on every backend, before
    the command runs. `cwd` is the directory as given."""

    def __init__(self, message: str, *, cwd: str) -> None:
        super().__init__(message, retryable=False)
        self.cwd = cwd


class WorkspacePathError(SandboxError, ValueError):
    """A file path escapes the workspace (`..`, an absolute path outside it, a symlink out)."""


class SandboxFileNotFoundError(SandboxError, FileNotFoundError):
    """`read_file` named a file that does not exist."""


class NotAFileError(InvalidArgumentError):
    """A file call named something that is not a regular file: a directory, a FIFO, a
    socket, a device, or (for a write) a path under something that is not a directory.

    Nothing was read or changed. It is an `InvalidArgumentError` because the path argument
    is what is wrong (the docker backend raised that class for directories before).
    """


class HostPathError(InvalidArgumentError):
    """A path the host opens on the sandbox's behalf (a recording) was refused: something
    already exists at the file's name (a file, symlink, FIFO...: never written over), a
    symlink or a non-folder is on the way, or it cannot be created. Nothing was changed
    at the path. `path` is the path as given (see `sandbox.files.host`)."""

    def __init__(self, message: str, *, path: str) -> None:
        super().__init__(message, retryable=False)
        self.path = path


class RefNotTrustedError(InvalidArgumentError):
    """A session ref read back as JSON (a ref file, a state file, JSON text) carries no
    valid seal: this user's library did not write it, or something (a process in the
    sandbox, another user) changed it since. Nothing in it was used."""


class FileTooLargeError(SandboxError):
    """`read_file` refused a file larger than its limit (`max_bytes`, or the session's
    `read_limit_bytes`). `size` is the file's size when known (else None: it grew past the
    limit while being read), `limit` the limit. Use `read_file_chunks` for big files."""

    def __init__(self, message: str, *, size: int | None, limit: int) -> None:
        super().__init__(message, retryable=False)
        self.size = size
        self.limit = limit

    @classmethod
    def over(cls, path: str, size: int | None, limit: int) -> FileTooLargeError:
        """The error every backend raises for `path` above `limit` bytes."""
        what = f"is {size} bytes" if size is not None else "has more bytes than that"
        return cls(
            f"file {path!r} {what}, over the read limit of {limit} bytes; read it with "
            "read_file_chunks(), or pass a larger max_bytes",
            size=size,
            limit=limit,
        )


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


class SessionGoneError(SessionStateError):
    """`resume_session` found no sandbox where its ref points: it was deleted, timed out
    or was closed by its owner. Not retryable: the ref can never work again."""

    retryable = False


class SessionTakenOverError(SessionStateError):
    """Another client resumed this session's sandbox (`resume_session`) and owns it
    now. This client may not touch it any more: every call raises this, and `aclose()`
    releases only what this client holds locally, leaving the sandbox and the new
    owner's processes alone."""

    retryable = False
