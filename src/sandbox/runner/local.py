"""The runner as a local daemon: started once (`serve --socket ... --detach`), found
again by every later client through its socket, like tmux's server.

The socket lives in a private folder (mode 0700, owned by this user, not a symlink):
`$XDG_RUNTIME_DIR/sandbox-runner/` when that is usable, else
`<tmp>/sandbox-runner-<uid>/`. Only this user can reach it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import stat
import tempfile
from pathlib import Path

from sandbox.errors import InvalidArgumentError

from .binary import runner_binary, unavailable_reason
from .client import DEFAULT_CALL_TIMEOUT, RunnerClient
from .errors import RunnerConnectionLost, RunnerError, RunnerTimeout

SOCKET_NAME = "runner.sock"
DEFAULT_START_TIMEOUT = 10.0
MAX_SOCKET_PATH = 107  # sun_path holds 108 bytes with the final NUL
_STREAM_LIMIT = 1 << 18  # the StreamReader's buffer before it pauses the socket
_MAX_STDERR = 4096  # of a failed start, shown in the error


def _private_dir(path: Path) -> Path:
    """Create `path` (mode 0700) or check an existing one is a real folder of ours that
    nobody else can enter; raises `RunnerError` otherwise."""
    with contextlib.suppress(FileExistsError):
        path.mkdir(mode=0o700)
    st = path.lstat()
    if not stat.S_ISDIR(st.st_mode):
        raise RunnerError(f"the runner folder {path} is not a folder (a symlink?)")
    if st.st_uid != os.getuid():
        raise RunnerError(f"the runner folder {path} belongs to uid {st.st_uid}, not to us")
    if st.st_mode & 0o077:
        raise RunnerError(f"the runner folder {path} is open to others (mode {st.st_mode:o})")
    return path


def runner_dir() -> Path:
    """This user's private runner folder (created when missing)."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime:
        base = Path(runtime)
        with contextlib.suppress(OSError):
            st = base.stat()
            if stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and not st.st_mode & 0o077:
                return _private_dir(base / "sandbox-runner")
    return _private_dir(Path(tempfile.gettempdir()) / f"sandbox-runner-{os.getuid()}")


def local_socket_path() -> Path:
    """Where this user's local runner listens."""
    return runner_dir() / SOCKET_NAME


def _check_socket_path(path: Path) -> Path:
    if len(os.fsencode(path)) > MAX_SOCKET_PATH:
        raise RunnerError(f"a unix socket path holds at most {MAX_SOCKET_PATH} bytes: {path}")
    return path


def _executable() -> Path:
    """The packaged runner, as a file this user may execute (a copy in the private
    folder, checked by hash, when the package lost its executable bit)."""
    binary = runner_binary()
    if binary is None:
        raise RunnerError(unavailable_reason() or "runner: not built")
    if os.access(binary.path, os.X_OK):
        return binary.path
    copy = runner_dir() / f"sandbox-runner-{binary.sha256[:16]}"
    if not copy.exists():
        partial = copy.with_suffix(".partial")
        shutil.copyfile(binary.path, partial)
        partial.chmod(0o700)
        partial.replace(copy)
    return copy


ORPHAN_TIMEOUT_ENV = "SANDBOX_RUNNER_ORPHAN_TIMEOUT_S"
# A week: an orphan timeout above it is a mistake, not a policy (0 means never).
MAX_ORPHAN_TIMEOUT_S = 7 * 24 * 3600


def orphan_timeout_from_env() -> int | None:
    """The orphan timeout `SANDBOX_RUNNER_ORPHAN_TIMEOUT_S` asks for (whole seconds, 0 =
    never), None when unset: the runner's default (an hour) then. A value that is not a
    whole number of seconds in [0, a week] is an `InvalidArgumentError`."""
    raw = os.environ.get(ORPHAN_TIMEOUT_ENV)
    if raw is None or raw.strip() == "":
        return None
    try:
        value = int(raw.strip())
    except ValueError:
        value = -1
    if not 0 <= value <= MAX_ORPHAN_TIMEOUT_S:
        raise InvalidArgumentError(
            f"{ORPHAN_TIMEOUT_ENV} must be a whole number of seconds from 0 (never) to "
            f"{MAX_ORPHAN_TIMEOUT_S}, not {raw[:40]!r}"
        )
    return value


async def start_local(
    socket: Path | None = None,
    *,
    orphan_timeout: float | None = None,
    timeout: float = DEFAULT_START_TIMEOUT,
) -> Path:
    """Start the local runner daemon on `socket` (this user's `local_socket_path()` when
    omitted) unless one already listens there; return the socket path. The starter
    exits once the daemon accepts connections, which this waits for (at most
    `timeout`). `orphan_timeout`: seconds without any client after which the daemon
    ends its processes and exits (when None: `SANDBOX_RUNNER_ORPHAN_TIMEOUT_S`, else the
    runner's default, an hour; 0 = never)."""
    if socket is None:
        socket = local_socket_path()
    else:
        _private_dir(socket.parent)
    _check_socket_path(socket)
    if orphan_timeout is None:
        orphan_timeout = orphan_timeout_from_env()
    argv = [str(_executable()), "serve", "--socket", str(socket), "--detach"]
    if orphan_timeout is not None:
        argv += ["--orphan-timeout", str(int(orphan_timeout))]
    with tempfile.TemporaryFile() as errors:
        process = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.DEVNULL, stdout=errors, stderr=errors
        )
        try:
            async with asyncio.timeout(timeout):
                code = await process.wait()
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()
            raise RunnerTimeout(f"the local runner did not start within {timeout} s") from None
        if code != 0:
            errors.seek(0)
            said = errors.read(_MAX_STDERR).decode("utf-8", "replace").strip()
            raise RunnerError(f"the local runner failed to start (exit {code}): {said}")
    return socket


async def connect_local(
    socket: Path | None = None,
    *,
    start: bool = True,
    orphan_timeout: float | None = None,
    timeout: float = DEFAULT_START_TIMEOUT,
    call_timeout: float = DEFAULT_CALL_TIMEOUT,
) -> RunnerClient:
    """A client of the local runner on `socket` (this user's when omitted), starting the
    daemon first when none listens and `start` is true. `timeout` bounds the start and
    the handshake; `call_timeout` is the client's default per call."""
    if socket is None:
        socket = local_socket_path()
    _check_socket_path(socket)
    try:
        async with asyncio.timeout(timeout):
            try:
                reader, writer = await asyncio.open_unix_connection(socket, limit=_STREAM_LIMIT)
            except (FileNotFoundError, ConnectionRefusedError):
                if not start:
                    raise
                await start_local(socket, orphan_timeout=orphan_timeout, timeout=timeout)
                reader, writer = await asyncio.open_unix_connection(socket, limit=_STREAM_LIMIT)
    except TimeoutError:
        raise RunnerTimeout(f"the local runner was not reached within {timeout} s") from None
    except OSError as error:
        raise RunnerConnectionLost(f"no local runner at {socket}: {error}") from None
    return await RunnerClient.open(reader, writer, timeout=timeout, call_timeout=call_timeout)
