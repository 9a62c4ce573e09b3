"""The runner inside a container: put there once, checked by content, reached by an exec.

Delivery goes through the engine's archive endpoint (no shell, no `cat` in the image):
the binary lands at `/tmp/.sandbox-runner-<digest>` (mode 0755, root-owned, so any
uid may run it). A binary already there is read back and hashed before it is trusted
with the name, and only when it is root's and writable by no one else (another uid could
rewrite its own file between the check and the link's exec): a container that put
something else at that name gets ours written over it (and, if that fails because its
impostor is running, a clear error: the session then keeps the per-exec path).

The link is one exec of `sandbox-runner connect --start`: it starts the runner once (its
own session inside the container, so it outlives this exec and this client) and bridges
its stdin/stdout to the runner's unix socket. Without a terminal the engine frames what
the exec prints (8-byte headers), so the stream's reader strips them (`FrameDecoder`)
and hands the runner's bytes to an ordinary `asyncio.StreamReader`; what the exec
writes on stderr (a failed start) is kept, bounded, for the error message. Writes go
through asyncio's own transport, so `StreamWriter.drain` gives real flow control.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import socket
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import docker.errors

from ...backend import parse_tar_header
from ...errors import ProviderError, UnsupportedOperationError
from ...runner import RunnerBinary, RunnerClient, RunnerError, runner_binary, unavailable_reason
from ..toolkit import (
    FALLBACK_ERRORS,
    HELLO_TIMEOUT_S,
    MAX_RUNNER_BYTES,
    MAX_STDERR_BYTES,
    RUNNER_OFF,
    fallen_back,
    process_environment,
    read_packaged,
    runner_name,
)
from .archive import put_tar, stat_path, tar_one_file
from .engine import Engine
from .execs import ExecOptions, _close_quietly, _start_attached
from .frames import STDERR, STDOUT, SYSTEM_ERROR, FrameDecoder

INSTALL_FOLDER = "/tmp"
# What the link's first stdout bytes kept for an error message may hold.
MAX_HEAD_BYTES = 512
BLOCK = 512  # a tar header

logger = logging.getLogger("sandbox.docker")


def runner_path(binary: RunnerBinary) -> str:
    """Where the runner lives in a container: named by its content."""
    return f"{INSTALL_FOLDER}/{runner_name(binary)}"


def socket_path(binary: RunnerBinary, user: str) -> str:
    """The runner's socket for the exec user `user`: one runner per user and build (the
    runner makes the socket's folder 0700, so another uid's runner is not reachable)."""
    who = hashlib.sha256(user.encode("utf-8", "surrogateescape")).hexdigest()[:8]
    return f"{INSTALL_FOLDER}/{runner_name(binary)}-{who}/runner.sock"


async def deliver(engine: Engine, container_id: str, binary: RunnerBinary) -> str:
    """Put the runner into the container unless the same bytes are already at its name,
    and return its path there."""
    return await engine.call(
        "put the runner into the container", _deliver, engine.api, container_id, binary
    )


def _deliver(api: Any, container_id: str, binary: RunnerBinary) -> str:
    """(In a worker thread) what `deliver` does."""
    path = runner_path(binary)
    if _installed_digest(api, container_id, path, binary.size) != binary.sha256:
        data = read_packaged(binary)
        name = path.rsplit("/", 1)[1]
        try:
            put_tar(api, container_id, INSTALL_FOLDER, tar_one_file(name, data, mode=0o755))
        except docker.errors.NotFound:
            # An image without /tmp (FROM scratch, some distroless ones): it gets one,
            # as a usual image has it (root's, 1777: each uid makes its runner's
            # socket folder there).
            if stat_path(api, container_id, INSTALL_FOLDER) is not None:
                raise
            folder = INSTALL_FOLDER.lstrip("/")
            tar = tar_one_file(name, data, mode=0o755, parents=[folder], parents_mode=0o1777)
            put_tar(api, container_id, "/", tar)
    return path


def _installed_digest(api: Any, container_id: str, path: str, size: int) -> str | None:
    """The sha256 of the regular file at `path`, None when there is none or it cannot
    be ours (not regular, another size): reads at most the one member's bytes, whatever
    the container says."""
    if size > MAX_RUNNER_BYTES:
        return None
    stat = stat_path(api, container_id, path)
    if stat is None or int(stat.get("size", -1)) != size:
        return None
    chunks, _ = api.get_archive(container_id, path, chunk_size=256 * 1024)
    try:
        return _first_member_digest(iter(chunks), size)
    finally:
        close = getattr(chunks, "close", None)
        if callable(close):
            close()


def _first_member_digest(chunks: Iterator[bytes], size: int) -> str | None:
    """The sha256 of the first member of a tar stream if it is a regular file of `size`
    bytes, root's and writable by no one else; None otherwise. Reads at most one header
    block and `size` bytes."""
    buffer = bytearray()
    for chunk in chunks:
        buffer += chunk
        if len(buffer) >= BLOCK:
            break
    if len(buffer) < BLOCK:
        return None
    try:
        header = parse_tar_header(bytes(buffer[:BLOCK]))
    except Exception:
        return None
    if header.type not in (b"0", b"\0") or header.size != size:
        return None
    # Only root's file that no one else may write is trusted with the name: another
    # uid's could be rewritten between this check and the link's exec (run as the
    # session's user, maybe root). Anything else gets ours written over it.
    if header.uid != 0 or header.mode & 0o022:
        return None
    digest = hashlib.sha256()
    payload = bytes(buffer[BLOCK : BLOCK + size])
    digest.update(payload)
    left = size - len(payload)
    for chunk in chunks:
        if left <= 0:
            break
        piece = chunk[:left]
        digest.update(piece)
        left -= len(piece)
    return digest.hexdigest() if left <= 0 else None


class _LinkProtocol(asyncio.StreamReaderProtocol):
    """asyncio's stream protocol with the engine's output frames taken off first."""

    def __init__(self, reader: asyncio.StreamReader, keep: tuple[Any, ...]) -> None:
        super().__init__(reader)
        self._decoder = FrameDecoder(self._payload)
        self._keep = keep
        self.stderr = bytearray()
        # The first bytes of stdout: where the engine writes why it could not run the
        # runner at all (a noexec folder, another architecture), as text.
        self.head = bytearray()

    def _payload(self, stream: int, data: bytes) -> None:
        if stream == STDOUT:
            room = MAX_HEAD_BYTES - len(self.head)
            if room > 0:
                self.head += data[:room]
            super().data_received(data)
        elif stream in (STDERR, SYSTEM_ERROR):
            room = MAX_STDERR_BYTES - len(self.stderr)
            if room > 0:
                self.stderr += data[:room]

    def data_received(self, data: bytes) -> None:
        """Raw socket bytes: framed output of the exec."""
        self._decoder.feed(data)

    def connection_lost(self, exc: Exception | None) -> None:
        """Close what kept the hijacked connection alive, then end the reader."""
        _close_quietly(None, self._keep)
        self._keep = ()
        super().connection_lost(exc)


@dataclass
class RunnerLink:
    """One connection to the runner through an exec: `reader` gives the runner's bytes,
    `writer` takes ours (`write_eof` ends the bridge), `exec_id` names the exec."""

    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    exec_id: str
    _protocol: _LinkProtocol

    @property
    def stderr(self) -> str:
        """What the bridge printed on stderr (bounded), for an error message."""
        return bytes(self._protocol.stderr).decode("utf-8", "replace")

    @property
    def said(self) -> str:
        """What explains a link that failed: the bridge's stderr, else the start of its
        stdout when that is text, not the runner's frames (the engine's own message when
        it could not run the runner: "OCI runtime exec failed: ... permission denied")."""
        if said := self.stderr.strip():
            return said
        head = bytes(self._protocol.head)
        if head[:4].isascii() and head[:4].decode("ascii").isprintable():
            return head.decode("utf-8", "replace").strip()
        return ""

    def close(self) -> None:
        """Drop the connection (the runner and its processes go on)."""
        self.writer.close()


async def open_link(
    engine: Engine, options: ExecOptions, runner_path: str, sock_path: str
) -> RunnerLink:
    """Start `runner connect --start` in the container as the session's user and wrap
    its hijacked stream. Cancellation after the exec started closes the stream (the
    bridge then exits; the runner stays)."""
    api = engine.api
    created = await engine.call(
        "create the runner's exec",
        api.exec_create,
        options.container_id,
        [runner_path, "connect", "--start", "--socket", sock_path],
        stdout=True,
        stderr=True,
        stdin=True,
        tty=False,
        user=options.user,
        workdir="/",
    )
    exec_id = str(created["Id"])
    started = engine.submit("start the runner's exec", _start_attached, api, exec_id, False)
    try:
        sock, leftover, keep = await asyncio.shield(started)
    except asyncio.CancelledError:
        # The start goes on in its thread: whatever socket it opens is closed when it
        # lands (the bridge then reads the end of its stdin and exits; the runner stays).
        started.add_done_callback(_close_started)
        raise
    if type(sock) is not socket.socket:
        _close_quietly(sock, keep)
        raise UnsupportedOperationError(
            "the runner is reached over a plain unix or tcp connection to the engine; "
            "this engine connection (tls) keeps the per-exec path"
        )
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=2**20, loop=loop)
    protocol = _LinkProtocol(reader, keep)
    try:
        transport, _ = await loop.create_connection(lambda: protocol, sock=sock)
    except BaseException:
        _close_quietly(sock, keep)
        raise
    if leftover:
        protocol.data_received(leftover)
    writer = asyncio.StreamWriter(transport, protocol, reader, loop)
    return RunnerLink(reader, writer, exec_id, protocol)


def _close_started(future: asyncio.Future[Any]) -> None:
    """Close the hijacked socket of a link start nobody waits for any more."""
    if future.cancelled() or future.exception() is not None:
        return
    sock, _, keep = future.result()
    _close_quietly(sock, keep)


def link_failed(link: RunnerLink, what: str) -> ProviderError:
    """The error for a link that ended before the runner answered."""
    said = link.said
    detail = f": {said[-300:]}" if said else ""
    with contextlib.suppress(Exception):
        link.close()
    return ProviderError(f"the runner in the container {what}{detail}", retryable=False)


# Variables in the container's configuration taken as the base of every environment.
MAX_CONFIG_ENV = 4096


class ContainerRunner:
    """The session's connection to the runner in its container: the client, the exec
    that carries it, and the environment every process starts with (the runner spawns
    with exactly the environment it is given)."""

    def __init__(self, client: RunnerClient, link: RunnerLink, base_env: dict[str, str]) -> None:
        self.client = client
        self.link = link
        self.base_env = base_env

    @classmethod
    async def start(
        cls, engine: Engine, options: ExecOptions, config_env: object
    ) -> ContainerRunner:
        """Deliver the runner, start it (or find it running) and connect; raises
        `UnsupportedOperationError` when this install has no runner to deliver."""
        delivered = await deliver_as_asked(engine, options, True)
        assert delivered.binary is not None and delivered.path is not None
        return await cls.connect(delivered.binary, delivered.path, engine, options, config_env)

    @classmethod
    async def connect(
        cls,
        binary: RunnerBinary,
        path: str,
        engine: Engine,
        options: ExecOptions,
        config_env: object,
    ) -> ContainerRunner:
        """Start the runner delivered at `path` (or find it running) and connect."""
        link = await open_link(engine, options, path, socket_path(binary, options.user))
        try:
            client = await RunnerClient.open(link.reader, link.writer, timeout=HELLO_TIMEOUT_S)
        except RunnerError as exc:
            raise link_failed(link, f"did not answer ({exc})") from None
        except BaseException:
            link.close()
            raise
        return cls(client, link, base_environment(config_env, options))

    def environment(
        self, extra: Mapping[str, str] | None, *, tty: bool, term: str
    ) -> dict[str, str]:
        """The whole environment of one process: the container's, the session's, the
        command's, and TERM for a terminal."""
        return process_environment(self.base_env, extra, tty=tty, term=term)

    async def aclose(self) -> None:
        """Close the connection (the runner and any process it keeps live on)."""
        try:
            await self.client.aclose()
        finally:
            self.link.close()


@dataclass(frozen=True)
class Delivered:
    """The runner in the container (`binary` and its `path` there), or why the session
    goes without it (`reason`)."""

    binary: RunnerBinary | None
    path: str | None
    reason: str | None


# Why a session in auto mode with `memory_limit_bytes` keeps the per-exec path: only it
# says so on the output of a process the limit killed (the container's `oom` event
# matched to the exec's 137); the runner reports the 137 alone.
MEMORY_LIMITED = (
    "memory_limit_bytes: the per-exec path notes a process the limit killed "
    "(runner=True uses the runner without that note)"
)


async def deliver_as_asked(engine: Engine, options: ExecOptions, asked: bool | None) -> Delivered:
    """The delivery the session's `runner` option asks for: False, none; True, the
    runner put into the container or the error saying why not; None (auto), the runner
    where this install has one and the container takes it, else why not (and none for
    a session with a memory limit: `MEMORY_LIMITED`)."""
    if asked is False:
        return Delivered(None, None, RUNNER_OFF)
    if asked is None and options.memory_limited:
        return Delivered(None, None, MEMORY_LIMITED)
    binary = runner_binary()
    if binary is None:
        why = unavailable_reason() or "runner: not built"
        if asked:
            raise UnsupportedOperationError(f"runner=True, but {why}")
        return Delivered(None, None, why)
    try:
        path = await deliver(engine, options.container_id, binary)
    except FALLBACK_ERRORS as exc:
        if asked:
            raise
        return Delivered(None, None, fallen_back("docker", "container", exc))
    return Delivered(binary, path, None)


async def connect_as_asked(
    delivered: Delivered,
    engine: Engine,
    options: ExecOptions,
    config_env: object,
    asked: bool | None,
) -> tuple[ContainerRunner | None, str | None]:
    """The session's runner once `delivered`, and why it has none (None while it has
    one): a failed start is an error when the runner was required (`asked` True), the
    per-exec path with its reason in auto mode."""
    if delivered.binary is None or delivered.path is None:
        return None, delivered.reason
    try:
        runner = await ContainerRunner.connect(
            delivered.binary, delivered.path, engine, options, config_env
        )
    except FALLBACK_ERRORS as exc:
        if asked:
            raise
        return None, fallen_back("docker", "container", exc)
    return runner, None


def base_environment(config_env: object, options: ExecOptions) -> dict[str, str]:
    """The container's configured variables (`Config.Env`, "K=V" strings, at most
    `MAX_CONFIG_ENV`), then the session's `env`; HOME as the engine would give a root
    exec when neither sets it."""
    env: dict[str, str] = {}
    if isinstance(config_env, list):
        for item in config_env[:MAX_CONFIG_ENV]:
            if isinstance(item, str) and "=" in item and "\0" not in item:
                key, _, value = item.partition("=")
                if key:
                    env[key] = value
    env.update(options.env)
    if options.user in ("", "root", "0", "0:0"):
        env.setdefault("HOME", "/root")
    env.setdefault("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
    return env
