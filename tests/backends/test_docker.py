"""docker specifics, against this machine's real engine: the container's life, the
multiplexed stream, faults (a container killed or removed mid-stream, a dropped engine
connection, an unreachable engine), cancellation at every await point of the SDK
boundary, 64 PTYs at once, big files, and that nothing is left behind.

These are the per-exec path's (an exec per process): its sessions say `runner=False`,
the runner being the default where this install has it (the runner's own promises and
the option's defaults: test_docker_runner.py).

Faults are real: containers are killed through the engine, and the engine connection
runs through a TCP proxy on 127.0.0.1 that the test kills. Cancellation points are
found by a `docker.APIClient` subclass that, for one chosen SDK call, signals that it is
blocked and waits until released; nothing of our own code is mocked.
"""

from __future__ import annotations

import asyncio
import gc
import os
import re
import secrets
import socket
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from typing import Any

import docker
import pytest

import sandbox
from sandbox.backends.docker import DockerSession
from sandbox.backends.docker.frames import FrameDecoder
from sandbox.backends.docker.stream import RawStream
from sandbox.testing import procfs
from tests.backend_fixtures import docker as fx
from tests.conftest import skip_or_fail
from tests.helpers import DeadlineCount, eventually, host_pids_with_arg, unique_seconds

TEST_LABEL = "sandbox.test.case"


@pytest.fixture(autouse=True)
def _engine() -> None:
    reason = fx.skip_reason()
    if reason:
        skip_or_fail(f"docker: {reason}")


@pytest.fixture
def api() -> Any:
    return fx._client()


@pytest.fixture
def case() -> str:
    """A label value that marks every container this test creates."""
    return secrets.token_hex(6)


def containers_of(case: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = fx._client().containers(
        all=True, filters={"label": f"{TEST_LABEL}={case}"}
    )
    return found


def remove_containers_of(case: str) -> None:
    for info in containers_of(case):
        with suppress(Exception):
            fx._client().remove_container(info["Id"], force=True, v=True)


def docker_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("sandbox-docker")]


def open_image(case: str, **options: Any) -> DockerSession:
    options.setdefault("runner", False)  # the per-exec path (the module docstring)
    options.setdefault("network_mode", "none")
    options.setdefault("terminate_grace_s", 0.3)
    session = sandbox.open_session("docker", image=fx.image(), labels={TEST_LABEL: case}, **options)
    assert isinstance(session, DockerSession)
    return session


@asynccontextmanager
async def image_session(case: str, **options: Any) -> AsyncIterator[DockerSession]:
    try:
        async with open_image(case, **options) as session:
            yield session
        assert containers_of(case) == [], "a created container must be removed on close"
    finally:
        remove_containers_of(case)


@asynccontextmanager
async def shared_session(**options: Any) -> AsyncIterator[DockerSession]:
    """A session attached to the shared test container; checks it left nothing."""
    container = fx.shared_container()
    options.setdefault("runner", False)  # the per-exec path (the module docstring)
    options.setdefault("terminate_grace_s", 0.3)
    session = sandbox.open_session(
        "docker", container=container, workdir=f"/tmp/ws-{secrets.token_hex(6)}", **options
    )
    assert isinstance(session, DockerSession)
    try:
        async with session:
            yield session
        # Sessions opened by default (other tests') may have left the runner's daemon in
        # the shared container: nothing else may be there.
        fx.assert_only_keepalive(container, runner_daemons=True)
    finally:
        exec_id = fx._client().exec_create(container, ["rm", "-rf", session.workdir])["Id"]
        fx._client().exec_start(exec_id)


# ---- a gate at the SDK boundary -----------------------------------------------------


class GatedClient(docker.APIClient):  # type: ignore[misc]
    """The real SDK client; the first call of `method` that concerns an exec whose command
    mentions `command` (any call, when `command` is None) signals `blocked` on the test's
    loop and waits for `release`; `finished` is set once that call has returned."""

    def __init__(self, method: str, command: str | None = None, *, armed: bool = True) -> None:
        super().__init__(version="auto")
        self.method = method
        self.command = command
        self.loop = asyncio.get_running_loop()
        self.blocked = asyncio.Event()
        self.finished = asyncio.Event()
        self.release = threading.Event()
        self.fired = not armed  # `arm()` later gates a call made after the session's start
        self.matching_execs: set[str] = set()

    def arm(self) -> None:
        """Gate the next matching call from now on."""
        self.fired = False

    def _matches(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        if self.command is None:
            return True
        if name == "exec_create":
            cmd = args[1] if len(args) > 1 else kwargs.get("cmd", ())
            return any(self.command in part for part in cmd)
        exec_id = args[0] if args else kwargs.get("exec_id")
        return exec_id in self.matching_execs

    def _call(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        gated = name == self.method and not self.fired and self._matches(name, args, kwargs)
        if gated:
            self.fired = True
            self.loop.call_soon_threadsafe(self.blocked.set)
            self.release.wait(60)
        try:
            result = getattr(super(), name)(*args, **kwargs)
            if name == "exec_create" and self._matches(name, args, kwargs):
                self.matching_execs.add(result["Id"])
            return result
        finally:
            if gated:
                self.loop.call_soon_threadsafe(self.finished.set)

    def create_container(self, *args: Any, **kwargs: Any) -> Any:
        return self._call("create_container", args, kwargs)

    def start(self, *args: Any, **kwargs: Any) -> Any:
        return self._call("start", args, kwargs)

    def inspect_container(self, *args: Any, **kwargs: Any) -> Any:
        return self._call("inspect_container", args, kwargs)

    def events(self, *args: Any, **kwargs: Any) -> Any:
        return self._call("events", args, kwargs)

    def exec_create(self, *args: Any, **kwargs: Any) -> Any:
        return self._call("exec_create", args, kwargs)

    def exec_start(self, *args: Any, **kwargs: Any) -> Any:
        return self._call("exec_start", args, kwargs)

    def exec_resize(self, *args: Any, **kwargs: Any) -> Any:
        return self._call("exec_resize", args, kwargs)

    def _put(self, *args: Any, **kwargs: Any) -> Any:
        return self._call("_put", args, kwargs)  # the archive upload (see archive.put_tar)

    def remove_container(self, *args: Any, **kwargs: Any) -> Any:
        return self._call("remove_container", args, kwargs)


async def cancel_when_blocked(client: GatedClient, coro: Any) -> BaseException | None:
    """Run `coro`, cancel it once the gate reports the SDK call blocked, release the
    gate, and return what the task ended with."""
    task = asyncio.ensure_future(coro)
    blocked = asyncio.ensure_future(client.blocked.wait())
    done, _ = await asyncio.wait({task, blocked}, return_when=asyncio.FIRST_COMPLETED)
    assert blocked in done, f"the gate on {client.method} was never reached: {task}"
    task.cancel()
    await asyncio.sleep(0)
    client.release.set()
    try:
        await task
    except BaseException as exc:
        return exc
    return None


# ---- a TCP proxy to the engine that can be killed -------------------------------------


def engine_socket_path() -> str:
    host = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    if not host.startswith("unix://"):
        pytest.skip("the proxy tests need the engine on a unix socket")
    return host[len("unix://") :]


class EngineProxy:
    """127.0.0.1:port <-> the engine's unix socket; `kill()` drops every connection,
    `drop(prefix)` only those whose first request line starts with `prefix`."""

    def __init__(self) -> None:
        self.server: asyncio.Server | None = None
        self.port = 0
        self.links: list[list[Any]] = []  # [latest request line, writer, engine writer]
        self.tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]

    @property
    def url(self) -> str:
        return f"tcp://127.0.0.1:{self.port}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_unix_connection(engine_socket_path())
        link = ["", writer, up_writer]
        self.links.append(link)
        for src, dst, sniff in ((reader, up_writer, link), (up_reader, writer, None)):
            task = asyncio.ensure_future(self._pipe(src, dst, sniff))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    async def _pipe(
        self, src: asyncio.StreamReader, dst: asyncio.StreamWriter, link: list[Any] | None
    ) -> None:
        with suppress(OSError, ConnectionError):
            while data := await src.read(65536):
                if link is not None and re.match(rb"(GET|POST|PUT|DELETE|HEAD) /", data):
                    link[0] = data.split(b"\r\n", 1)[0].decode("latin-1")
                dst.write(data)
                await dst.drain()
            if dst.can_write_eof():
                dst.write_eof()

    def drop(self, path_part: str) -> int:
        """Abort the connections whose latest request mentions `path_part`."""
        dropped = 0
        for request, writer, up_writer in self.links:
            if path_part in request:
                writer.transport.abort()
                up_writer.transport.abort()
                dropped += 1
        return dropped

    async def kill(self) -> None:
        assert self.server is not None
        self.server.close()
        for _, writer, up_writer in self.links:
            writer.transport.abort()
            up_writer.transport.abort()
        for task in list(self.tasks):
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        await self.server.wait_closed()


# ---- the container's life ----------------------------------------------------------------


async def test_options_are_validated() -> None:
    with pytest.raises(sandbox.InvalidArgumentError, match="exactly one of image"):
        sandbox.open_session("docker")
    with pytest.raises(sandbox.InvalidArgumentError, match="exactly one of image"):
        sandbox.open_session("docker", image="x", container="y")
    with pytest.raises(sandbox.InvalidArgumentError, match="workdir"):
        sandbox.open_session("docker", image="x", workdir="relative")
    with pytest.raises(sandbox.InvalidArgumentError, match="cpu_limit"):
        sandbox.open_session("docker", image="x", cpu_limit=0)


async def test_created_container_is_confined_and_removed(api: Any, case: str) -> None:
    async with image_session(
        case,
        memory_limit_bytes=256 * 1024 * 1024,
        cpu_limit=0.5,
        process_limit=200,
        env={"GREETING": "hi"},
    ) as s:
        host = api.inspect_container(s.container_id)["HostConfig"]
        assert host["Memory"] == host["MemorySwap"] == 256 * 1024 * 1024
        assert host["NanoCpus"] == 500_000_000
        assert host["PidsLimit"] == 200
        assert host["NetworkMode"] == "none"
        assert host["Privileged"] is False
        assert not host.get("Binds")
        assert host["Init"] is True
        assert (await s.exec("echo $GREETING; pwd")).stdout == b"hi\n/root\n"
        assert len(containers_of(case)) == 1


async def test_attached_container_is_left_running(api: Any) -> None:
    async with shared_session() as s:
        assert (await s.exec("echo attached")).stdout == b"attached\n"
        container = s.container_id
    assert api.inspect_container(container)["State"]["Running"]


async def test_workdir_is_created_and_relative_paths_use_it() -> None:
    async with shared_session() as s:
        assert (await s.exec("pwd")).stdout.decode().strip() == s.workdir
        await s.write_file("note.txt", "hello")
        assert (await s.exec("cat note.txt", cwd=".")).stdout == b"hello"
        assert (await s.exec("pwd", cwd="sub/..")).stdout.decode().strip() == s.workdir
        assert await s.read_file(f"{s.workdir}/note.txt") == b"hello"


async def test_missing_image_is_not_retryable_and_leaves_nothing(case: str) -> None:
    session = sandbox.open_session(
        "docker", image="sandbox-no-such-image:never", labels={TEST_LABEL: case}
    )
    with pytest.raises(sandbox.ProviderError, match="image was not found") as info:
        await session.start()
    assert info.value.retryable is False
    assert containers_of(case) == []
    assert await eventually(lambda: docker_threads() == [])


async def test_missing_or_stopped_container_is_not_retryable(api: Any, case: str) -> None:
    with pytest.raises(sandbox.ProviderError, match="No such container") as info:
        await sandbox.open_session("docker", container="sandbox-no-such-container").start()
    assert info.value.retryable is False
    created = api.create_container(fx.image(), "true", labels={TEST_LABEL: case})
    try:
        with pytest.raises(sandbox.ProviderError, match="not running") as info:
            await sandbox.open_session("docker", container=created["Id"]).start()
        assert info.value.retryable is False
    finally:
        remove_containers_of(case)


@pytest.mark.parametrize("url", ["tcp://127.0.0.1:{port}", "unix:///nonexistent/docker.sock"])
async def test_unreachable_engine_is_retryable(url: str) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    session = sandbox.open_session("docker", image="x", api_url=url.format(port=port))
    with pytest.raises(sandbox.ProviderError, match="cannot reach the Docker engine") as info:
        await session.start()
    assert info.value.retryable is True
    assert str(port) not in str(info.value) and "nonexistent" not in str(info.value)
    assert await eventually(lambda: docker_threads() == [])


async def test_silent_engine_times_out_retryably() -> None:
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)  # connections complete in the backlog; nothing ever answers
        port = silent.getsockname()[1]
        session = sandbox.open_session(
            "docker", image="x", api_url=f"tcp://127.0.0.1:{port}", call_timeout_s=0.5
        )
        # The engine client's own timeout is 60 s: a start that ignored `call_timeout_s`
        # would meet this deadline first (TimeoutError, not the ProviderError).
        async with asyncio.timeout(10):
            with pytest.raises(sandbox.ProviderError, match="did not answer in time") as info:
                await session.start()
        assert info.value.retryable is True
    assert await eventually(lambda: docker_threads() == [])


async def test_secrets_in_env_stay_out_of_reprs_and_errors() -> None:
    secret = "s3cr3t-" + secrets.token_hex(8)
    async with shared_session(env={"API_TOKEN": secret}) as s:
        assert (await s.exec("echo $API_TOKEN")).stdout.decode().strip() == secret
        update = await s.pty_exec_start("echo r; exec cat", tty=True, until="r")
        assert secret not in repr(s) and secret not in repr(s.pty_processes())
        assert update.process_id is not None
        with pytest.raises(sandbox.SandboxError) as info:
            await s.read_file("/no/such/file")
        assert secret not in str(info.value)


async def test_non_root_user_runs_and_owns_written_files() -> None:
    async with shared_session(user="1000") as s:
        assert (await s.exec("id -u")).stdout == b"1000\n"
        await s.write_file("deep/er/file.txt", b"mine")
        owner = await s.exec("stat -c %u:%g deep/er/file.txt; stat -c %u deep/er")
        assert owner.stdout == b"1000:1000\n1000\n"
        update = await s.pty_exec_start("echo r; exec sleep 600", tty=True, until="r")
        assert update.process_id is not None
        await s.pty_terminate(update.process_id)


def fd_targets() -> set[str]:
    return procfs.fd_targets()


async def test_no_fd_or_thread_growth(case: str) -> None:
    assert containers_of(case) == []  # the test's own client: its pooled connection
    gc.collect()
    await asyncio.sleep(0)
    fds, threads = fd_targets(), set(threading.enumerate())
    async with image_session(case) as s:
        for i in range(10):
            update = await s.pty_exec_start("echo r; exec sleep 600", tty=i % 2 == 0, until="r")
            assert update.process_id is not None
        await s.exec("true")
        await s.pty_terminate_all()
    gc.collect()
    assert await eventually(lambda: fd_targets() <= fds), fd_targets() - fds
    assert await eventually(lambda: set(threading.enumerate()) <= threads)


# ---- the streams ---------------------------------------------------------------------------


def test_frame_header_split_at_every_position() -> None:
    frames = [(1, b"out-one\n"), (2, b"err\n"), (1, b""), (2, b"x" * 1500), (1, b"end")]
    wire = b"".join(bytes([kind, 0, 0, 0]) + len(p).to_bytes(4, "big") + p for kind, p in frames)
    for cut in range(len(wire) + 1):
        for cut2 in (cut, min(len(wire), cut + 3), min(len(wire), cut + 11)):
            got: dict[int, bytearray] = {1: bytearray(), 2: bytearray()}
            decoder = FrameDecoder(lambda kind, data, got=got: got[kind].extend(data))
            for piece in (wire[:cut], wire[cut:cut2], wire[cut2:]):
                decoder.feed(piece)
            assert bytes(got[1]) == b"out-one\nend"
            assert bytes(got[2]) == b"err\n" + b"x" * 1500
            assert decoder.pending_bytes == 0
    decoder = FrameDecoder(lambda kind, data: None)
    decoder.feed(wire[:13])
    assert decoder.pending_bytes > 0


def test_frames_byte_by_byte() -> None:
    payload = bytes(range(256)) * 3
    wire = bytes([1, 0, 0, 0]) + len(payload).to_bytes(4, "big") + payload
    wire += bytes([2, 0, 0, 0, 0, 0, 0, 2]) + b"ok"
    got: list[tuple[int, bytes]] = []
    decoder = FrameDecoder(lambda kind, data: got.append((kind, data)))
    for i in range(len(wire)):
        decoder.feed(wire[i : i + 1])
    assert b"".join(d for k, d in got if k == 1) == payload
    assert b"".join(d for k, d in got if k == 2) == b"ok"


async def test_raw_stream_delivers_leftover_first_and_reports_the_end() -> None:
    ours, theirs = socket.socketpair()
    chunks: list[bytes] = []
    ended: asyncio.Future[BaseException | None] = asyncio.get_running_loop().create_future()
    stream = RawStream(
        ours, on_data=chunks.append, on_end=ended.set_result, leftover=b"already-read|"
    )
    stream.start()
    theirs.sendall(b"then-this")
    await stream.write(b"to-peer")
    assert theirs.recv(100) == b"to-peer"
    theirs.close()
    assert await asyncio.wait_for(ended, 5) is None
    assert b"".join(chunks) == b"already-read|then-this"
    stream.close()
    with pytest.raises(Exception, match="closed"):
        await stream.write(b"late")
    assert ours.fileno() == -1


async def test_interleaved_stdout_and_stderr_frames_are_split_right() -> None:
    async with shared_session() as s:
        result = await s.exec(
            "i=0; while [ $i -lt 3000 ]; do echo o$i; echo e$i >&2; i=$((i+1)); done"
        )
        assert result.stdout == b"".join(b"o%d\n" % i for i in range(3000))
        assert result.stderr == b"".join(b"e%d\n" % i for i in range(3000))
        update = await s.pty_exec_start("echo out; echo err >&2; printf 'x%.0s' $(seq 1 9000)")
        assert update.exit_code == 0
        assert "out\n" in update.output and "err\n" in update.output
        assert update.output.count("x") == 9000


async def test_pipes_have_stdin_closed() -> None:
    async with shared_session() as s:
        update = await s.pty_exec_start("cat; echo cat-ended=$?")
        assert update.exit_code == 0 and "cat-ended=0" in update.output


async def test_detach_keys() -> None:
    """Docker's default detach keys (Ctrl-P Ctrl-Q) are ordinary input; typing the
    session's own sequence ends the attachment (the engine says 126 or 127) and the
    process is still killed."""
    marker = unique_seconds()
    async with shared_session() as s:
        update = await s.pty_exec_start(
            f"stty -echo; echo r; sleep {marker} & exec cat", tty=True, until="r"
        )
        pid = update.process_id
        assert pid is not None
        for key in (b"\x10", b"\x11", b"\x10\x11", b"\x1e", b"x", b"\x00\x1e"):
            await s.pty_write_stdin(pid, key)
        final = await s.pty_write_stdin(pid, "still-here\n", until="still-here", yield_time_s=20)
        assert final.process_id == pid and "still-here" in final.output
        for key in (b"\x1e", b"\x00", b"\x1e", b"\x00"):
            with suppress(sandbox.ProcessExitedError, sandbox.PtyProcessNotFoundError):
                final = await s.pty_write_stdin(pid, key)
        while final.process_id is not None:
            final = await s.pty_write_stdin(pid, "", yield_time_s=10)
        assert final.exit_code in (126, 127) and "escape sequence" in final.output
        assert await eventually(lambda: not host_pids_with_arg(marker))


async def test_big_file_round_trip_streams(api: Any) -> None:
    payload = os.urandom(48 << 20) + b"\x00end"
    async with shared_session() as s:
        await s.write_file("big/blob.bin", payload)
        assert (await s.exec("wc -c < big/blob.bin")).stdout.strip() == str(len(payload)).encode()
        back = await s.read_file("big/blob.bin")
        assert back == payload
        await s.write_file("empty", b"")
        assert await s.read_file("empty") == b""
        await s.exec("ln -s big/blob.bin link; mkdir -p adir")
        assert await s.read_file("link") == payload
        with pytest.raises(sandbox.InvalidArgumentError, match="directory"):
            await s.read_file("adir")
        with pytest.raises(sandbox.SandboxFileNotFoundError):
            await s.read_file("nope/none")
        name = "n" * 150
        await s.write_file(name, "long name")
        assert await s.read_file(name) == b"long name"


# ---- many processes ------------------------------------------------------------------


async def test_64_ptys_at_once_and_one_shot_exec_does_not_starve() -> None:
    async with shared_session() as s:
        threads = threading.active_count()
        starts = [s.pty_exec_start("echo r; exec cat", tty=True, until="r") for _ in range(64)]
        updates = await asyncio.gather(*starts)
        pids = [u.process_id for u in updates]
        assert None not in pids and len(set(pids)) == 64
        # 64 open streams hold no thread: the engine's pool and event reader only.
        assert threading.active_count() <= threads + 10
        # Starved, an exec would meet its own deadline (`ExecTimeoutError`).
        results = await asyncio.gather(*(s.exec(f"echo {i}", timeout=10) for i in range(4)))
        assert [r.stdout for r in results] == [f"{i}\n".encode() for i in range(4)]
        # Each window ends at its echo; the maximum only matters on a loaded machine, where
        # 64 round trips through the engine can outlast the default 0.25 s write window.
        echoes = await asyncio.gather(
            *(
                s.pty_write_stdin(
                    pid, f"n{i}\n", until=re.compile(rf"n{i}\r?\n.*n{i}", re.S), yield_time_s=20
                )
                for i, pid in enumerate(pids)
            )
        )
        assert all(f"n{i}" in e.output for i, e in enumerate(echoes))
        await s.pty_terminate_all()


# ---- faults --------------------------------------------------------------------------------


async def test_container_killed_mid_stream(api: Any, case: str) -> None:
    async with image_session(case) as s:
        update = await s.pty_exec_start("echo r; exec yes", tty=False, until="r")
        pid = update.process_id
        assert pid is not None
        quiet = await s.pty_exec_start("echo r; exec cat", tty=True, until="r")
        assert quiet.process_id is not None
        api.kill(s.container_id)
        deadlines = DeadlineCount(s)
        for process_id in (pid, quiet.process_id):
            final = await s.pty_write_stdin(process_id, "", yield_time_s=20)
            while final.process_id is not None:
                final = await s.pty_write_stdin(process_id, "", yield_time_s=20)
            assert final.exit_code == 137 or "container stopped" in final.output
        # The kill ended every poll: none ran to its 20 s deadline.
        assert deadlines.count == 0
        deadlines.close()
        with pytest.raises(sandbox.ProviderError, match="not running") as info:
            await s.exec("true")
        assert info.value.retryable is False


async def test_container_removed_underneath(api: Any, case: str) -> None:
    async with image_session(case) as s:
        update = await s.pty_exec_start("echo r; exec cat", tty=True, until="r")
        assert update.process_id is not None
        api.remove_container(s.container_id, force=True)
        final = await s.pty_write_stdin(update.process_id, "", yield_time_s=20)
        assert final.process_id is None
        assert final.exit_code == 137 or "process lost" in final.output
        with pytest.raises(sandbox.ProviderError) as info:
            await s.exec("true")
        assert info.value.retryable is False


async def test_dropped_engine_connection_ends_processes_clearly(case: str) -> None:
    proxy = EngineProxy()
    await proxy.start()
    session = open_image(case, api_url=proxy.url)
    try:
        await session.start()
        marker = unique_seconds()
        update = await session.pty_exec_start(f"echo r; exec sleep {marker}", tty=True, until="r")
        assert update.process_id is not None
        await proxy.kill()
        final = await session.pty_write_stdin(update.process_id, "", yield_time_s=20)
        assert final.process_id is None
        assert final.exit_code is None
        assert "lost the connection to the Docker engine" in final.output
        with pytest.raises(sandbox.ProviderError) as info:
            await session.exec("true")
        assert info.value.retryable is True
        with pytest.raises(sandbox.ProviderError, match="cannot reach") as info:
            await session.aclose()
        assert info.value.retryable is True
        assert await eventually(lambda: docker_threads() == [])
        assert len(containers_of(case)) == 1, "the container could not be removed: it stays"
    finally:
        await session.aclose()
        remove_containers_of(case)
    assert await eventually(lambda: not host_pids_with_arg(marker))


async def test_event_stream_dropped_exits_still_detected(case: str) -> None:
    proxy = EngineProxy()
    await proxy.start()
    try:
        async with image_session(case, api_url=proxy.url) as s:
            assert proxy.drop("/events?") == 1
            assert await eventually(lambda: not s._engine.events_alive)  # type: ignore[union-attr]
            update = await s.pty_exec_start("echo a; exit 4", tty=True)
            assert update.exit_code == 4 and update.process_id is None
            # `b` (and the exit) only once the test says so, never within the first window.
            update = await s.pty_exec_start(
                "echo r; until [ -e go ]; do sleep 0.01; done; echo b", until="r"
            )
            assert update.process_id is not None
            await s.write_file("go", "")
            final = await s.pty_write_stdin(update.process_id, "", yield_time_s=20)
            assert final.exit_code == 0 and "b" in final.output
            assert (await s.exec("echo ok")).stdout == b"ok\n"
    finally:
        await proxy.kill()


# ---- cancellation at each await point of the SDK boundary ------------------------------------


@pytest.mark.parametrize(
    ("method", "when"),
    [
        ("create_container", None),
        ("start", None),
        ("inspect_container", None),
        ("events", None),
        ("exec_create", "sandbox-probe"),
        ("exec_start", None),
    ],
)
async def test_cancel_session_start_leaves_no_container(
    case: str, method: str, when: str | None
) -> None:
    client = GatedClient(method, when)
    session = open_image(case, client=client)
    try:
        outcome = await cancel_when_blocked(client, session.start())
        assert isinstance(outcome, asyncio.CancelledError)
        assert containers_of(case) == []
        await session.aclose()
        assert await eventually(lambda: docker_threads() == [])
    finally:
        client.release.set()
        remove_containers_of(case)
        client.close()


@pytest.mark.parametrize("method", ["exec_create", "exec_start"])
@pytest.mark.parametrize("tty", [True, False], ids=["tty", "pipes"])
async def test_cancel_process_start_leaves_no_process(method: str, tty: bool) -> None:
    marker = unique_seconds()
    client = GatedClient(method, marker)
    try:
        async with shared_session(client=client) as s:
            outcome = await cancel_when_blocked(
                client, s.pty_exec_start(f"exec sleep {marker}", tty=tty)
            )
            assert isinstance(outcome, asyncio.CancelledError)
            assert s.pty_processes() == [] and s._core.processes.reserved == set()
            assert await eventually(lambda: not host_pids_with_arg(marker))
            assert (await s.exec("echo fine")).stdout == b"fine\n"
    finally:
        client.release.set()
        client.close()


@pytest.mark.parametrize("method", ["exec_create", "exec_start"])
async def test_cancel_one_shot_exec_leaves_no_process(method: str) -> None:
    marker = unique_seconds()
    client = GatedClient(method, marker)
    try:
        async with shared_session(client=client) as s:
            outcome = await cancel_when_blocked(client, s.exec(f"sleep {marker}"))
            assert isinstance(outcome, asyncio.CancelledError)
            assert await eventually(lambda: not host_pids_with_arg(marker))
    finally:
        client.release.set()
        client.close()


async def test_cancel_resize_keeps_the_process() -> None:
    client = GatedClient("exec_resize")
    try:
        async with shared_session(client=client) as s:
            update = await s.pty_exec_start("echo r; read x; stty size", tty=True, until="r")
            pid = update.process_id
            assert pid is not None
            outcome = await cancel_when_blocked(client, s.pty_resize(pid, rows=41, cols=101))
            assert isinstance(outcome, asyncio.CancelledError)
            await asyncio.wait_for(client.finished.wait(), 10)
            await s.pty_resize(pid, rows=42, cols=102)
            final = await s.pty_write_stdin(pid, "\n", until="42 102", yield_time_s=10)
            assert "42 102" in final.output
    finally:
        client.release.set()
        client.close()


async def test_cancel_write_blocked_on_a_full_socket() -> None:
    async with shared_session() as s:
        update = await s.pty_exec_start("stty -echo; echo r; exec sleep 600", tty=True, until="r")
        pid = update.process_id
        assert pid is not None
        proc = s._core.processes.lookup(pid).handle
        task = asyncio.ensure_future(s.pty_write_stdin(pid, "z" * (8 << 20)))
        # The terminal is not read, so the socket fills up and the write waits for room.
        assert await eventually(lambda: proc._stream._write_waiter is not None, timeout=20)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert [i.process_id for i in s.pty_processes()] == [pid]
        await s.pty_terminate(pid)


async def test_cancel_write_file_then_session_still_works() -> None:
    client = GatedClient("_put", armed=False)  # the start makes the workdir with a put
    try:
        async with shared_session(client=client) as s:
            client.arm()
            outcome = await cancel_when_blocked(client, s.write_file("f.txt", b"data"))
            assert isinstance(outcome, asyncio.CancelledError)
            await s.write_file("g.txt", b"more")
            assert await s.read_file("g.txt") == b"more"
    finally:
        client.release.set()
        client.close()


@pytest.mark.parametrize("method", ["exec_create", "exec_start"])
async def test_cancel_terminate_mid_kill_still_kills(method: str) -> None:
    client = GatedClient(method, "sandbox-kill")
    marker = unique_seconds()
    try:
        async with shared_session(client=client) as s:
            update = await s.pty_exec_start(f"echo r; exec sleep {marker}", until="r")
            assert update.process_id is not None
            outcome = await cancel_when_blocked(client, s.pty_terminate(update.process_id))
            assert isinstance(outcome, asyncio.CancelledError)
            assert s.pty_processes() == [] and s._core.processes.reserved == set()
            assert await eventually(lambda: not host_pids_with_arg(marker))
    finally:
        client.release.set()
        client.close()


async def test_cancel_close_still_removes_the_container(case: str) -> None:
    client = GatedClient("remove_container")
    marker = unique_seconds()
    session = open_image(case, client=client)
    try:
        await session.start()
        await session.pty_exec_start(f"echo r; exec sleep {marker}", tty=True, until="r")
        outcome = await cancel_when_blocked(client, session.aclose())
        assert isinstance(outcome, asyncio.CancelledError)
        assert session.state is sandbox.SessionState.CLOSED
        assert containers_of(case) == []
        assert await eventually(lambda: not host_pids_with_arg(marker))
    finally:
        client.release.set()
        remove_containers_of(case)
        client.close()


@pytest.mark.parametrize("after", [False, True], ids=["before-create", "after-create"])
async def test_close_while_the_container_is_being_created(case: str, after: bool) -> None:
    # The reproduction: a close during start() returned, then the start finished, the state
    # went back to running and the container stayed up, running commands on a closed session.
    from tests.helpers import HookGate

    session = open_image(case)
    try:
        gate = HookGate(session, "_start_backend", after=after)
        starting = asyncio.ensure_future(session.start())
        await gate.reached.wait()
        if after:
            assert len(containers_of(case)) == 1, "the container exists while start is parked"
        await session.aclose()
        assert containers_of(case) == [], "the close left the container"
        with pytest.raises(sandbox.SessionClosedError):
            await starting
        assert session.state is sandbox.SessionState.CLOSED
        with pytest.raises(sandbox.SessionClosedError):
            await session.exec("true")
    finally:
        remove_containers_of(case)
