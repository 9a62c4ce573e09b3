"""`RunnerClient` against the real runner binary, started as a local daemon: processes
on pipes and PTYs, open stdin and its end, exit codes, detach and reattach with replay,
GAP past the ring, whole-tree kills of escapees, file calls.

The binary is built once per session when missing (`make runner`); without cargo
these tests skip, or fail under SANDBOX_REQUIRE_ALL=1.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import io
import os
import platform
import shutil
import signal
import subprocess
import tarfile
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from sandbox.runner import binary as runner_binary_module
from sandbox.runner import frames, local
from sandbox.runner.client import RunnerClient
from sandbox.runner.errors import RunnerConnectionLost, RunnerError, RunnerRequestError
from sandbox.runner.frames import SignalScope, Stream
from sandbox.runner.local import connect_local, start_local
from sandbox.testing import procfs
from sandbox.testing.conformance import eventually, unique_seconds
from tests.conftest import skip_or_fail

from .peer import STEP, Sink

OUT, ERR = Stream.STDOUT, Stream.STDERR
REPO = Path(__file__).resolve().parents[2]
ENV = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C"}


@pytest.fixture(scope="session")
def runner_built() -> Path:
    """The packaged runner binary, built with `make runner` once when missing."""
    found = runner_binary_module.runner_binary()
    if found is None:
        if shutil.which("cargo") is None:
            skip_or_fail(f"{runner_binary_module.unavailable_reason()}; cargo is not installed")
        subprocess.run(["make", "runner"], cwd=REPO, check=False, timeout=900)
        found = runner_binary_module.runner_binary()
        if found is None:
            pytest.fail(
                f"make runner did not build the runner: {runner_binary_module.unavailable_reason()}"
            )
    return found.path


@pytest.fixture
def socket_path(runner_built: Path) -> Iterator[Path]:
    """A socket path in a fresh private folder (short enough for sun_path); the runner
    that listens there, if any, is stopped (SIGTERM ends its processes) afterwards."""
    folder = Path(tempfile.mkdtemp(prefix="sbrun-", dir="/tmp"))
    path = folder / "runner.sock"
    try:
        yield path
    finally:
        pid_file = folder / "pid"
        if pid_file.exists():
            pid = int(pid_file.read_text())
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + STEP
            while procfs.alive(pid) and time.monotonic() < deadline:
                time.sleep(0.01)
            assert not procfs.alive(pid), "the runner outlived its SIGTERM"
        shutil.rmtree(folder, ignore_errors=True)


@contextlib.asynccontextmanager
async def client_of(socket_path: Path) -> AsyncIterator[RunnerClient]:
    """A client of the runner on `socket_path`, started when none listens; its pid is
    noted for the fixture's teardown."""
    client = await connect_local(socket_path, orphan_timeout=120, timeout=STEP, call_timeout=STEP)
    assert client.hello is not None
    (socket_path.parent / "pid").write_text(str(client.hello.pid))
    try:
        yield client
    finally:
        await client.aclose()


async def run(client: RunnerClient, process_id: int, argv: list[str], **spawn: object) -> Sink:
    """Spawn `argv` and wait for its end: the sink holds its output and code."""
    sink = Sink()
    await client.spawn(process_id, argv, env=ENV, sink=sink, **spawn)  # type: ignore[arg-type]
    await sink.ended()
    return sink


async def until_output(sink: Sink, text: bytes, stream: Stream = OUT) -> None:
    """Wait (at most STEP) until `sink` received `text` on `stream`."""
    async with asyncio.timeout(STEP):
        while text not in sink.data[stream]:
            sink.fed.clear()
            if text in sink.data[stream]:
                return
            assert not sink.done.is_set(), (sink.data, sink.code, sink.lost_reason)
            await sink.fed.wait()


async def until_listed(
    client: RunnerClient, process_id: int, stdout_end: int
) -> frames.ProcessInfo:
    """Poll LIST until the process printed `stdout_end` bytes (it runs detached: nothing
    else can tell)."""
    async with asyncio.timeout(STEP):
        while True:
            [info] = [p for p in await client.list() if p.id == process_id]
            if info.stdout_end >= stdout_end:
                return info
            await asyncio.sleep(0.01)


# --- processes --------------------------------------------------------------------------


async def test_echo_and_exit_codes(socket_path: Path) -> None:
    async with client_of(socket_path) as client:
        echo = await run(client, 1, ["echo", "hello", "wörld"])
        assert echo.data == {OUT: "hello wörld\n".encode(), ERR: b""}
        assert echo.code == 0
        both = await run(client, 2, ["sh", "-c", "echo out; echo err >&2; exit 3"])
        assert both.data == {OUT: b"out\n", ERR: b"err\n"}
        assert both.code == 3
        merged = await run(client, 3, ["sh", "-c", "echo out; echo err >&2"], merge_stderr=True)
        assert merged.data == {OUT: b"out\nerr\n", ERR: b""}
        killed = await run(client, 4, ["sh", "-c", "kill -TERM $$"])
        assert killed.code == 128 + signal.SIGTERM


async def test_spawn_errors_are_named(socket_path: Path) -> None:
    async with client_of(socket_path) as client:
        with pytest.raises(RunnerRequestError) as missing:
            await client.spawn(1, ["/nonexistent/program"], env=ENV, sink=Sink())
        assert missing.value.kind == "command_not_found"
        with pytest.raises(RunnerRequestError) as workdir:
            await client.spawn(2, ["true"], env=ENV, sink=Sink(), cwd="/nonexistent/dir")
        assert workdir.value.kind == "workdir"
        assert client.attached == frozenset()
        # The ids are free again, and the environment is exactly the one given.
        env = await run(client, 1, ["env"])
        assert sorted(env.data[OUT].decode().splitlines()) == sorted(
            f"{k}={v}" for k, v in ENV.items()
        )
        cwd = await run(client, 2, ["pwd"], cwd="/tmp")
        assert cwd.data[OUT] == b"/tmp\n"


async def test_a_signal_ends_a_process_with_128_plus_n(socket_path: Path) -> None:
    async with client_of(socket_path) as client:
        sink = Sink()
        await client.spawn(1, ["sleep", "600"], env=ENV, sink=sink)
        assert await client.signal(1, signal.SIGKILL) is True
        await sink.ended()
        assert sink.code == 128 + signal.SIGKILL
        assert await client.signal(1, signal.SIGKILL) is False  # nobody left


async def test_open_stdin_then_its_end_lets_sort_finish(socket_path: Path) -> None:
    async with client_of(socket_path) as client:
        sink = Sink()
        await client.spawn(1, ["sort"], env=ENV, sink=sink, stdin_open=True)
        await client.write(1, b"pear\napple\n")
        await client.write(1, b"fig\n")
        assert not sink.done.is_set()
        await client.close_stdin(1)
        await sink.ended()
        assert sink.data[OUT] == b"apple\nfig\npear\n"
        assert sink.code == 0
        with pytest.raises(RunnerRequestError):
            await client.write(1, b"late\n")


async def test_a_signal_while_input_waits_gets_its_own_answer(socket_path: Path) -> None:
    """INPUT is answered once written, SIGNAL at once: a kill sent while a write waits
    on a process that reads nothing answers the kill, and the write fails on its own."""
    async with client_of(socket_path) as client:
        sink = Sink()
        await client.spawn(1, ["sleep", "600"], env=ENV, sink=sink, stdin_open=True)
        writing = asyncio.ensure_future(client.write(1, b"x" * (1 << 20)))
        # The pipe fills (64 KiB) and the runner holds the rest: the write waits.
        await until_listed(client, 1, 0)
        assert not writing.done()
        assert await client.signal(1, signal.SIGKILL, SignalScope.TREE) is True
        with pytest.raises(RunnerRequestError):
            await writing
        await sink.ended()
        assert sink.code == 128 + signal.SIGKILL


async def test_a_mebibyte_through_cat_comes_back_exactly(socket_path: Path) -> None:
    data = bytes(range(256)) * 4096
    async with client_of(socket_path) as client:
        sink = Sink()
        await client.spawn(1, ["cat"], env=ENV, sink=sink, stdin_open=True, ring_bytes=1 << 22)
        await client.write(1, data)
        await client.close_stdin(1)
        await sink.ended()
        assert bytes(sink.data[OUT]) == data
        assert sink.gaps == []


async def test_stdin_closed_at_start_reads_eof(socket_path: Path) -> None:
    async with client_of(socket_path) as client:
        sink = await run(client, 1, ["sh", "-c", "cat; echo done"])
        assert sink.data[OUT] == b"done\n"
        with pytest.raises(RunnerRequestError):
            await client.write(1, b"x")


async def test_a_pty_has_its_size_and_takes_resizes(socket_path: Path) -> None:
    async with client_of(socket_path) as client:
        sink = Sink()
        script = "stty size; read x; stty size; read y; tty >/dev/null && echo is-a-tty"
        await client.spawn(1, ["sh", "-c", script], env=ENV, sink=sink, tty=True, rows=30, cols=100)
        await until_output(sink, b"30 100")
        await client.resize(1, 50, 120)
        await client.write(1, b"\n")
        await until_output(sink, b"50 120")
        with pytest.raises(RunnerRequestError) as no_end:
            await client.close_stdin(1)
        assert no_end.value.kind == "unsupported"
        await client.write(1, b"\n")
        await sink.ended()
        assert b"is-a-tty" in sink.data[OUT]
        assert sink.code == 0


async def test_detach_then_a_new_connection_replays_what_was_printed_meanwhile(
    socket_path: Path,
) -> None:
    script = 'echo first; read x; echo "second $x"; read y; echo "third $y"'
    async with client_of(socket_path) as client:
        first = Sink()
        await client.spawn(1, ["sh", "-c", script], env=ENV, sink=first, stdin_open=True)
        await until_output(first, b"first\n")
        await client.detach(1)
        seen = len(first.data[OUT])
        await client.write(1, b"X\n")  # any connection may write
        await until_listed(client, 1, seen + len(b"second X\n"))
    assert first.lost_reason == "the client closed the connection" or not first.done.is_set()
    assert first.data[OUT] == b"first\n"  # nothing after the detach
    async with client_of(socket_path) as again:
        [info] = await again.list()
        assert (info.id, info.running, info.stdout_end) == (1, True, len(b"first\nsecond X\n"))
        second = Sink()
        await again.attach(1, second, stdout_offset=seen)
        await until_output(second, b"second X\n")
        await again.write(1, b"Y\n")
        await second.ended()
        assert second.data[OUT] == b"second X\nthird Y\n"
        assert second.gaps == []
        assert second.code == 0
        # Attached once more from 0 after the end: the whole output, then EXIT at once.
        replay = Sink()
        await again.attach(1, replay)
        await replay.ended()
        assert replay.data[OUT] == b"first\nsecond X\nthird Y\n"
        assert replay.code == 0


async def test_a_dropped_connection_kills_nothing(socket_path: Path) -> None:
    seconds = unique_seconds()
    async with client_of(socket_path) as client:
        await client.spawn(1, ["sleep", seconds], env=ENV, sink=Sink())
        pid = (await client.list())[0].pid
    assert pid is not None and procfs.alive(pid)
    async with client_of(socket_path) as again:
        [info] = await again.list()
        assert info.running and info.pid == pid
        sink = Sink()
        await again.attach(1, sink)
        await again.signal(1, signal.SIGTERM)
        await sink.ended()
        assert sink.code == 128 + signal.SIGTERM
        await again.forget(1)
        assert await again.list() == []


async def test_forget_refuses_a_running_process(socket_path: Path) -> None:
    async with client_of(socket_path) as client:
        sink = Sink()
        await client.spawn(1, ["sleep", "600"], env=ENV, sink=sink)
        with pytest.raises(RunnerRequestError):
            await client.forget(1)
        await client.signal(1, signal.SIGKILL, SignalScope.TREE)
        await sink.ended()
        # The ended process's record keeps its id until it is forgotten.
        with pytest.raises(RunnerRequestError) as taken:
            await client.spawn(1, ["true"], env=ENV, sink=Sink())
        assert taken.value.kind == "exists"
        await client.forget(1)
        with pytest.raises(RunnerRequestError) as gone:
            await client.forget(1)
        assert gone.value.kind == "not_found"
        assert (await run(client, 1, ["true"])).code == 0


async def test_output_past_the_ring_is_a_gap_then_the_ring(socket_path: Path) -> None:
    ring = 1024
    total = 5000
    async with client_of(socket_path) as client:
        sink = Sink()
        script = f"read x; head -c {total} /dev/zero | tr '\\0' a; read y || true"
        await client.spawn(
            1, ["sh", "-c", script], env=ENV, sink=sink, stdin_open=True, ring_bytes=ring
        )
        await client.detach(1)
        await client.write(1, b"go\n")
        await until_listed(client, 1, total)
        late = Sink()
        await client.attach(1, late)
        await client.close_stdin(1)
        await late.ended()
        assert late.code == 0
        kept = len(late.data[OUT])
        assert 0 < kept <= ring
        assert late.data[OUT] == b"a" * kept
        assert late.gaps == [(0, total - kept, OUT)]
        assert sink.data[OUT] == b""  # detached before anything was printed


async def test_a_tree_kill_reaches_double_forked_and_setsid_escapees(socket_path: Path) -> None:
    seconds = unique_seconds()
    script = (
        f"setsid sleep {seconds} & "  # a new session
        f"(sleep {seconds} &) ; "  # double-forked: re-parented away from the shell
        f"(exec -a renamed-{seconds} sleep {seconds} &) ; "
        f"exec sleep {seconds}"
    )
    async with client_of(socket_path) as client:
        sink = Sink()
        await client.spawn(1, ["bash", "-c", script], env=ENV, sink=sink)

        def tree() -> list[int]:
            return procfs.pids_with_arg(seconds) + procfs.pids_with_arg(f"renamed-{seconds}")

        assert await eventually(lambda: len(set(tree())) >= 4), procfs.describe(tree())
        sessions = {s.session for p in tree() if (s := procfs.stat(p)) is not None}
        assert len(sessions) >= 2  # one left the process's session
        assert await client.signal(1, signal.SIGKILL, SignalScope.TREE) is True
        await sink.ended()
        assert sink.code == 128 + signal.SIGKILL
        assert await eventually(lambda: not [p for p in tree() if procfs.alive(p)]), (
            procfs.describe(tree())
        )


async def test_a_second_client_finds_the_running_runner(socket_path: Path) -> None:
    async with client_of(socket_path) as one, client_of(socket_path) as two:
        assert one.hello is not None and two.hello is not None
        assert one.hello.pid == two.hello.pid
        await start_local(socket_path, timeout=STEP)  # "already running": exits 0 at once
        async with client_of(socket_path) as three:
            assert three.hello is not None and three.hello.pid == one.hello.pid
        await one.ping(b"x" * 64)


async def test_connect_without_start_finds_no_runner(socket_path: Path) -> None:
    with pytest.raises(RunnerConnectionLost, match="no local runner"):
        await connect_local(socket_path, start=False, timeout=STEP)


# --- files ------------------------------------------------------------------------------


async def test_file_calls(socket_path: Path, tmp_path: Path) -> None:
    async with client_of(socket_path) as client:
        folder = tmp_path / "w"
        await client.make_dir(str(folder / "sub" / "deeper"), parents=True)
        target = str(folder / "f.bin")
        data = os.urandom(700_000)
        await client.write_file(target, [data[:1000], data[1000:]], mode=0o600)
        assert (folder / "f.bin").read_bytes() == data
        assert (folder / "f.bin").stat().st_mode & 0o777 == 0o600
        assert await client.read_file(target, max_bytes=len(data)) == data
        with pytest.raises(RunnerRequestError) as large:
            await client.read_file(target, max_bytes=len(data) - 1)
        assert large.value.kind == "too_large"
        stat = await client.stat(target)
        assert (stat.kind, stat.size, stat.name) == ("file", len(data), "f.bin")
        (folder / "link").symlink_to("f.bin")
        link = await client.stat(str(folder / "link"))
        assert (link.kind, link.link_target) == ("symlink", "f.bin")
        names = {e.name: e.kind for e in await client.list_dir(str(folder))}
        assert names == {"sub": "dir", "f.bin": "file", "link": "symlink"}
        assert len(await client.list_dir(str(folder), max_entries=1)) == 1
        os.mkfifo(folder / "fifo")
        with pytest.raises(RunnerRequestError) as fifo:
            await client.read_file(str(folder / "fifo"), max_bytes=10)
        assert fifo.value.kind == "not_a_file"
        with pytest.raises(RunnerRequestError) as missing:
            await client.read_file(str(folder / "none"), max_bytes=10)
        assert missing.value.kind == "not_found"
        with pytest.raises(RunnerRequestError):
            await client.remove(str(folder / "sub"))
        await client.remove(str(folder / "sub"), recursive=True)
        await client.remove(target)
        assert sorted(p.name for p in folder.iterdir()) == ["fifo", "link"]


# --- the binary and the private folder --------------------------------------------------


def test_the_packaged_binary_and_its_hash(runner_built: Path) -> None:
    found = runner_binary_module.runner_binary()
    assert found is not None and found.path == runner_built
    assert found.sha256 == hashlib.sha256(runner_built.read_bytes()).hexdigest()
    assert found.size == runner_built.stat().st_size
    assert runner_binary_module.unavailable_reason() is None
    version = subprocess.run([str(runner_built), "version"], capture_output=True, check=True)
    assert version.stdout.decode().endswith(f"protocol {frames.PROTOCOL_VERSION}\n")


def test_an_architecture_without_a_build_says_so() -> None:
    assert runner_binary_module.binary_name("riscv64") is None
    assert runner_binary_module.runner_binary("riscv64") is None
    assert runner_binary_module.unavailable_reason("riscv64") == "runner: no build for riscv64"
    assert runner_binary_module.binary_name("amd64") == "sandbox-runner-linux-x86_64"


def test_a_missing_build_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    # No build for the other architecture is packaged here: the reason names the file...
    other = "aarch64" if platform.machine() == "x86_64" else "x86_64"
    assert runner_binary_module.runner_binary(other) is None
    assert runner_binary_module.unavailable_reason(other) == (
        f"runner: not built (no sandbox-runner-linux-{other} in the package; "
        "`make runner` builds it)"
    )
    # ...or, without cargo, the usual cause.
    monkeypatch.setenv("PATH", "/nonexistent")
    assert runner_binary_module.unavailable_reason(other) == (
        "runner: not built (cargo missing at install)"
    )


def test_the_socket_folder_must_be_private(tmp_path: Path) -> None:
    open_folder = tmp_path / "open"
    open_folder.mkdir(mode=0o755)
    open_folder.chmod(0o755)
    with pytest.raises(RunnerError, match="open to others"):
        local._private_dir(open_folder)
    link = tmp_path / "link"
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    link.symlink_to(private)
    with pytest.raises(RunnerError, match="not a folder"):
        local._private_dir(link)
    created = local._private_dir(tmp_path / "new")
    assert created.stat().st_mode & 0o777 == 0o700
    with pytest.raises(RunnerError, match="at most 107 bytes"):
        local._check_socket_path(tmp_path / ("x" * 120))


async def test_a_refused_upload_leaves_the_connection_healthy(
    socket_path: Path, tmp_path: Path
) -> None:
    """An upload refused at its start while its DATA is on the way: the call raises the
    refusal, and the connection goes on."""
    async with client_of(socket_path) as client:
        chunks = [b"x" * 100_000] * 20
        with pytest.raises(RunnerRequestError) as folder:
            await client.write_file(str(tmp_path), chunks)  # a folder is no file
        assert folder.value.kind == "not_a_file"
        with pytest.raises(RunnerRequestError) as missing:
            await client.write_file(str(tmp_path / "no" / "f"), chunks)
        assert missing.value.kind == "not_found"
        await client.ping()
        assert (await run(client, 1, ["true"])).code == 0
        assert not client.closed


async def test_archives_out_and_in(socket_path: Path, tmp_path: Path) -> None:
    source = tmp_path / "src"
    (source / "sub").mkdir(parents=True)
    (source / "a.txt").write_text("hello")
    (source / "sub" / "b.bin").write_bytes(os.urandom(300_000))
    async with client_of(socket_path) as client:
        tar = bytearray()
        size = await client.archive_out(str(source), tar.extend, max_bytes=1 << 20)
        assert size == len(tar)
        with tarfile.open(fileobj=io.BytesIO(bytes(tar))) as archive:
            members = {m.name: m for m in archive.getmembers()}
            assert set(members) >= {"a.txt", "sub", "sub/b.bin"}
            extracted = archive.extractfile(members["sub/b.bin"])
            assert extracted is not None
            assert extracted.read() == (source / "sub" / "b.bin").read_bytes()
        target = tmp_path / "dest"
        target.mkdir()
        count = await client.archive_in(str(target), [bytes(tar[:1000]), bytes(tar[1000:])])
        assert count == len(members)
        assert (target / "a.txt").read_text() == "hello"
        assert (target / "sub" / "b.bin").read_bytes() == (source / "sub" / "b.bin").read_bytes()
        # More than the caller's bound ends the connection (the runner cannot be stopped
        # midway otherwise).
        with pytest.raises(RunnerConnectionLost, match="over 1000 bytes"):
            await client.archive_out(str(source), lambda data: None, max_bytes=1000)
        assert client.closed


def test_the_orphan_timeout_comes_from_the_environment_and_is_checked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from sandbox.errors import InvalidArgumentError
    from sandbox.runner.local import ORPHAN_TIMEOUT_ENV, orphan_timeout_from_env

    monkeypatch.delenv(ORPHAN_TIMEOUT_ENV, raising=False)
    assert orphan_timeout_from_env() is None
    monkeypatch.setenv(ORPHAN_TIMEOUT_ENV, " 45 ")
    assert orphan_timeout_from_env() == 45
    monkeypatch.setenv(ORPHAN_TIMEOUT_ENV, "0")
    assert orphan_timeout_from_env() == 0
    for bad in ("-1", "1.5", "soon", str(8 * 24 * 3600)):
        monkeypatch.setenv(ORPHAN_TIMEOUT_ENV, bad)
        with pytest.raises(InvalidArgumentError, match=ORPHAN_TIMEOUT_ENV):
            orphan_timeout_from_env()


async def test_a_daemon_started_with_the_environments_timeout_says_so_in_its_argv(
    runner_built: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sandbox.runner.local import ORPHAN_TIMEOUT_ENV

    monkeypatch.setenv(ORPHAN_TIMEOUT_ENV, "7")
    folder = tmp_path / "r"
    socket = await start_local(folder / "runner.sock")
    daemons = [
        pid
        for pid in map(int, filter(str.isdigit, os.listdir("/proc")))
        if str(socket) in _cmdline(pid)
    ]
    try:
        assert len(daemons) == 1
        assert "--orphan-timeout 7" in _cmdline(daemons[0])
    finally:
        for pid in daemons:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode("utf-8", "replace")
    except OSError:
        return ""
