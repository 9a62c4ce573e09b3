"""daytona specifics: the SDK fake's drift check, the shell trap, error mapping, every
fault, cancellation at each SDK await point, and nothing left behind (local processes,
streams, tasks, sandboxes)."""

from __future__ import annotations

import asyncio
import copy
import logging
import re
import subprocess
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("daytona")

import daytona
from daytona import (
    AsyncDaytona,
    AsyncSandbox,
    CreateSandboxFromSnapshotParams,
    DaytonaAuthenticationError,
    DaytonaBadGatewayError,
    DaytonaConfig,
    DaytonaConflictError,
    DaytonaConnectionError,
    DaytonaError,
    DaytonaForbiddenError,
    DaytonaGoneError,
    DaytonaInternalServerError,
    DaytonaNotFoundError,
    DaytonaRateLimitError,
    DaytonaServiceUnavailableError,
    DaytonaTimeoutError,
    DaytonaUnprocessableEntityError,
    DaytonaValidationError,
    SessionExecuteRequest,
)
from daytona._async.filesystem import AsyncFileSystem
from daytona._async.process import AsyncProcess
from daytona._async.snapshot import AsyncSnapshotService
from daytona.common.errors import DaytonaConnectionTimeoutError
from daytona.common.process import ExecuteResponse, SessionExecuteResponse
from daytona.common.pty import PtyResult
from daytona.handle.async_pty_handle import AsyncPtyHandle
from daytona_toolbox_api_client_async import Command

import sandbox
from sandbox.backends.daytona import DaytonaSession
from sandbox.backends.daytona.errors import is_retryable
from sandbox.backends.daytona.scripts import kill_script
from sandbox.backends.daytona.terminal import MAX_TYPED_LINE, pty_exit_status
from sandbox.testing import daytona_fake, procfs
from sandbox.testing.daytona_fake import (
    FakeAsyncDaytona,
    FakeAsyncFileSystem,
    FakeAsyncProcess,
    FakeAsyncPtyHandle,
    FakeAsyncSandbox,
    FakeAsyncSnapshotService,
    FakeDaytona,
)
from sandbox.testing.drift import surface_problems
from tests.helpers import eventually, host_pids_with_arg, unique_seconds

KEY = "dtn_test_key_0123456789abcdef"


@pytest.fixture
async def fake(tmp_path: Path) -> AsyncIterator[FakeDaytona]:
    root = tmp_path / "fake-daytona"
    root.mkdir()
    async with FakeDaytona(api_key=KEY, root=root) as service:
        yield service


def open_daytona(fake: FakeDaytona, **options: Any) -> DaytonaSession:
    options.setdefault("api_key", KEY)
    options.setdefault("terminate_grace_s", 0.3)
    options.setdefault("teardown_timeout_s", 5.0)
    session = sandbox.open_session("daytona", daytona_class=fake.AsyncDaytona, **options)
    assert isinstance(session, DaytonaSession)
    return session


def wait_until(predicate: Any, timeout: float = 5.0) -> bool:
    """`eventually` for synchronous tests."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def other_tasks() -> list[asyncio.Task[Any]]:
    current = asyncio.current_task()
    return [t for t in asyncio.all_tasks() if t is not current and not t.done()]


async def nothing_left(fake: FakeDaytona, session: DaytonaSession | None = None) -> None:
    """No local process alive, no stream or task running, no process registered; the
    sandbox (when the session is still open) has no terminal or session left."""
    assert await eventually(lambda: fake.leftover_pids() == []), fake.leftover_pids()
    assert await eventually(lambda: fake.open_streams() == []), fake.open_streams()
    assert await eventually(lambda: other_tasks() == []), other_tasks()
    if session is not None and session.sandbox_id in fake.sandboxes:
        assert session.pty_processes() == []
        assert session._core.processes.reserved == set()
        assert await eventually(lambda: fake.pty_ids(session.sandbox_id or "") == [])
        assert fake.session_ids(session.sandbox_id or "") == []


async def cancel_when(gate: daytona_fake.Gate, task: asyncio.Task[Any]) -> BaseException | Any:
    """Cancel `task` once the fake signals that the call is held at the gate."""
    await gate.reached.wait()
    task.cancel()
    try:
        return await task
    except BaseException as exc:
        return exc


# ---- the fake cannot drift from the SDK ------------------------------------------------

FAKE_PAIRS = [
    (FakeAsyncDaytona, AsyncDaytona),
    (FakeAsyncSandbox, AsyncSandbox),
    (FakeAsyncProcess, AsyncProcess),
    (FakeAsyncFileSystem, AsyncFileSystem),
    (FakeAsyncPtyHandle, AsyncPtyHandle),
    (FakeAsyncSnapshotService, AsyncSnapshotService),
]


@pytest.mark.parametrize(("fake_cls", "real_cls"), FAKE_PAIRS, ids=lambda c: c.__name__)
def test_fake_surface_matches_the_installed_sdk(fake_cls: type, real_cls: type) -> None:
    assert surface_problems(fake_cls, real_cls) == []


def test_every_fake_class_is_checked() -> None:
    faked = {
        obj
        for name, obj in vars(daytona_fake).items()
        if isinstance(obj, type) and name.startswith("FakeAsync")
    }
    assert faked == {fake for fake, _ in FAKE_PAIRS}


def test_drift_check_can_fail() -> None:
    class Renamed(FakeAsyncProcess):
        async def create_session(self, session: str, request_timeout: float | None = None) -> None:
            """A parameter renamed."""

    class MadeSync(FakeAsyncPtyHandle):
        def send_input(self, data: str | bytes) -> None:  # type: ignore[override]
            """No longer async."""

    class Invented(FakeAsyncFileSystem):
        async def download_everything(self) -> None:
            """Not in the SDK."""

    assert any("session" in p for p in surface_problems(Renamed, AsyncProcess))
    assert any("sync in the fake" in p for p in surface_problems(MadeSync, AsyncPtyHandle))
    assert any("download_everything" in p for p in surface_problems(Invented, AsyncFileSystem))


def test_sdk_data_types_keep_the_fields_the_backend_uses() -> None:
    assert {"api_key", "api_url", "target"} <= set(DaytonaConfig.model_fields)
    assert {"name", "snapshot", "labels"} <= set(CreateSandboxFromSnapshotParams.model_fields)
    assert {"command", "run_async"} <= set(SessionExecuteRequest.model_fields)
    assert "cmd_id" in SessionExecuteResponse.model_fields
    assert "exit_code" in Command.model_fields
    assert {"exit_code", "result"} <= set(ExecuteResponse.model_fields)
    assert {"exit_code", "error"} <= set(PtyResult.__dataclass_fields__)
    assert {"rows", "cols"} <= set(daytona.PtySize.__dataclass_fields__)
    assert {"id", "name", "state"} <= set(AsyncSandbox.model_fields)


# ---- credentials, secrets, options -------------------------------------------------------


def test_missing_credentials_name_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DAYTONA_API_KEY", raising=False)
    with pytest.raises(sandbox.CredentialsMissingError, match="DAYTONA_API_KEY"):
        sandbox.open_session("daytona")


async def test_key_from_the_environment(fake: FakeDaytona, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DAYTONA_API_KEY", KEY)
    session = sandbox.open_session("daytona", daytona_class=fake.AsyncDaytona)
    async with session:
        assert (await session.exec("echo ok")).stdout == b"ok\n"


async def test_wrong_key_is_not_retryable_and_never_shown(
    fake: FakeDaytona, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    wrong = "dtn_wrong_key_SECRET_987654"
    session = open_daytona(fake, api_key=wrong)
    assert wrong not in repr(session)
    with pytest.raises(sandbox.ProviderError) as info:
        await session.start()
    assert not info.value.retryable
    assert "API key" in str(info.value)
    assert wrong not in str(info.value)
    assert info.value.__cause__ is None and info.value.__suppress_context__
    assert all(wrong not in r.getMessage() for r in caplog.records)
    assert fake.live_sandbox_ids() == []


async def test_options_are_validated(fake: FakeDaytona) -> None:
    with pytest.raises(sandbox.InvalidArgumentError):
        open_daytona(fake, teardown_timeout_s=0)
    with pytest.raises(sandbox.InvalidArgumentError):
        open_daytona(fake, terminate_grace_s=-1)


@pytest.mark.parametrize(
    "create_options",
    [{"env_vars": {"BAD NAME": "x"}}, {"env_vars": {"V": "a\ud800"}}, {"labels": {"": "x"}}],
)
def test_create_options_reaching_env_or_labels_are_checked(
    fake: FakeDaytona, create_options: dict[str, Any]
) -> None:
    with pytest.raises(sandbox.InvalidArgumentError, match="create_options"):
        open_daytona(fake, create_options=create_options)


async def test_caller_labels_join_ours(fake: FakeDaytona) -> None:
    async with open_daytona(fake, create_options={"labels": {"team": "a"}}) as session:
        labels = fake.sandboxes[session.sandbox_id or ""].params.labels
        assert labels == {
            "created-by": "agent-sandbox-pty",
            "team": "a",
            "sandbox.session": session.ref().session_id,
        }


async def test_resource_limits_reach_the_create_from_an_image(fake: FakeDaytona) -> None:
    from daytona import CreateSandboxFromImageParams

    options = {"image": "debian:12", "memory_limit_bytes": 4 << 30, "cpu_limit": 2}
    async with open_daytona(fake, **options) as session:
        params = fake.sandboxes[session.sandbox_id or ""].params
        assert isinstance(params, CreateSandboxFromImageParams)
        assert params.image == "debian:12"
        assert params.resources is not None
        assert (params.resources.cpu, params.resources.memory) == (2, 4)


@pytest.mark.parametrize(
    ("options", "error", "named"),
    [
        ({"image": "debian:12", "process_limit": 8}, "UnsupportedOperationError", "process_limit"),
        ({"memory_limit_bytes": 1 << 30}, "UnsupportedOperationError", "memory_limit_bytes"),
        (
            {"image": "debian:12", "cpu_limit": 1, "sandbox_id": "x"},
            "UnsupportedOperationError",
            "cpu_limit",
        ),
        (
            {"image": "debian:12", "memory_limit_bytes": 3 << 29},
            "InvalidArgumentError",
            "memory_limit_bytes",
        ),
        ({"image": "debian:12", "cpu_limit": 1.5}, "InvalidArgumentError", "cpu_limit"),
        ({"image": "debian:12", "snapshot": "s"}, "InvalidArgumentError", "snapshot"),
    ],
)
def test_limits_daytona_cannot_apply_are_refused_when_opened(
    fake: FakeDaytona, options: dict[str, Any], error: str, named: str
) -> None:
    with pytest.raises(getattr(sandbox, error), match=named):
        open_daytona(fake, **options)
    assert fake.live_sandbox_ids() == []


@pytest.mark.parametrize(
    "point",
    [
        "get_file_info",
        "download_file",
        "upload_file",
        "create_pty_session",
        "send_input",
        "create_session",
        "execute_session_command",
        "exec",
    ],
)
async def test_a_call_that_never_answers_fails_within_its_deadline(
    fake: FakeDaytona, point: str
) -> None:
    async with open_daytona(fake, call_timeout_s=0.3) as session:
        await session.write_file("f.txt", b"data")
        gate = fake.block(point)
        async with asyncio.timeout(30):  # the test's own guard: a hang fails here
            with pytest.raises(sandbox.ProviderError, match=r"within 0\.3s") as info:
                if point == "get_file_info" or point == "download_file":
                    await session.read_file("f.txt")
                elif point == "upload_file":
                    await session.write_file("f.txt", b"more")
                elif point in ("create_pty_session", "send_input"):
                    await session.pty_exec_start("true", tty=True, yield_time_s=5)
                elif point == "exec":
                    await session.write_file("sub/f.txt", b"more")  # mkdir -p first
                else:
                    await session.exec("true")
        assert info.value.retryable
        assert gate.reached.is_set()
        gate.release()
    await nothing_left(fake)


async def test_paths_outside_the_workdir_are_refused_before_any_call(fake: FakeDaytona) -> None:
    async with open_daytona(fake) as session:
        root = Path(session.workdir)
        (root.parent / "outside.txt").write_bytes(b"secret")
        stats = fake.block("get_file_info")  # any call that reached the SDK would hang
        for path in ("../outside.txt", str(root.parent / "outside.txt"), "/etc/hostname"):
            with pytest.raises(sandbox.WorkspacePathError, match="outside the workspace"):
                await session.read_file(path)
        with pytest.raises(sandbox.WorkspacePathError):
            await session.write_file("a/../../escape.txt", b"x")
        assert not stats.reached.is_set()
        assert not (root.parent / "escape.txt").exists()
        stats.release()
        await session.write_file(str(root / "a" / ".." / "in.txt"), b"inside")
        assert await session.read_file("in.txt") == b"inside"
    await nothing_left(fake)


async def test_a_file_that_grew_after_its_stat_is_read_within_the_limit(
    fake: FakeDaytona,
) -> None:
    import tracemalloc

    limit = 1 << 20
    async with open_daytona(fake, read_limit_bytes=limit) as session:
        await session.write_file("grows.bin", b"small")
        gate = fake.block("download_file")
        read = asyncio.ensure_future(session.read_file("grows.bin"))
        await gate.reached.wait()  # stat said 5 bytes; now the file grows to 32 MiB
        with (Path(session.workdir) / "grows.bin").open("ab") as handle:
            for _ in range(32):
                handle.write(b"x" * (1 << 20))
        tracemalloc.start()
        try:
            gate.release()
            with pytest.raises(sandbox.FileTooLargeError):
                await read
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        # What the client kept stays near the limit, not the 32 MiB the daemon had.
        assert peak < limit + (4 << 20), peak
        await session.write_file("empty.bin", b"")
        assert await session.read_file("empty.bin") == b""
    await nothing_left(fake)


async def test_a_download_stream_whose_request_fails_is_a_lost_connection(
    fake: FakeDaytona,
) -> None:
    import aiohttp

    async with open_daytona(fake) as session:
        await session.write_file("f.txt", b"data")
        # The stream's request runs in its iterator, past the SDK's error mapping.
        fake.fail("download_file", aiohttp.ClientConnectionError("connection reset"))
        with pytest.raises(sandbox.ConnectionLostError) as info:
            await session.read_file("f.txt")
        assert info.value.retryable
        assert await session.read_file("f.txt") == b"data"
    await nothing_left(fake)


# ---- lifecycle ------------------------------------------------------------------------------


async def test_create_and_close_deletes_the_sandbox(fake: FakeDaytona) -> None:
    async with open_daytona(fake) as session:
        assert fake.live_sandbox_ids() == [session.sandbox_id]
        assert session.workdir == fake.sandboxes[session.sandbox_id or ""].root
    assert fake.live_sandbox_ids() == []
    await nothing_left(fake)


async def test_keep_then_attach_keeps_then_delete(fake: FakeDaytona) -> None:
    async with open_daytona(fake, keep=True) as session:
        await session.write_file("note.txt", "kept")
        sandbox_id = session.sandbox_id
    assert fake.live_sandbox_ids() == [sandbox_id]
    async with open_daytona(fake, sandbox_id=sandbox_id, keep=True) as attached:
        assert await attached.read_file("note.txt") == b"kept"
    assert fake.live_sandbox_ids() == [sandbox_id]
    async with open_daytona(fake, sandbox_id=sandbox_id):
        pass
    assert fake.live_sandbox_ids() == [], "closing deletes an attached sandbox unless kept"


async def test_attach_to_a_missing_sandbox(fake: FakeDaytona) -> None:
    with pytest.raises(sandbox.ProviderError) as info:
        await open_daytona(fake, sandbox_id="no-such-sandbox").start()
    assert not info.value.retryable
    assert "no-such-sandbox" in str(info.value)


async def test_attach_starts_a_stopped_sandbox(fake: FakeDaytona) -> None:
    sandbox_id = fake.add_sandbox("stopped-one")
    fake.sandboxes[sandbox_id].state = daytona.SandboxState.STOPPED
    async with open_daytona(fake, sandbox_id="stopped-one", keep=True) as session:
        assert (await session.exec("echo up")).stdout == b"up\n"
    assert "start" in fake.calls
    assert fake.live_sandbox_ids() == [sandbox_id]


# Every SDK error kind, with whether a retry may help.
ERROR_KINDS = [
    (DaytonaRateLimitError("slow down", status_code=429), True),
    (DaytonaTimeoutError("took too long"), True),
    (DaytonaConnectionError("connection refused"), True),
    (DaytonaConnectionTimeoutError("read timed out"), True),
    (DaytonaServiceUnavailableError("busy", status_code=503), True),
    (DaytonaBadGatewayError("upstream", status_code=502), True),
    (DaytonaNotFoundError("gone missing", status_code=404), False),
    (DaytonaAuthenticationError("bad key", status_code=401), False),
    (DaytonaForbiddenError("not yours", status_code=403), False),
    (DaytonaValidationError("bad request", status_code=400), False),
    (DaytonaUnprocessableEntityError("nonsense", status_code=422), False),
    (DaytonaConflictError("already exists", status_code=409), False),
    (DaytonaGoneError("ended", status_code=410), False),
    (DaytonaInternalServerError("bug", status_code=500), False),
    (DaytonaError("plain 503", status_code=503), True),
    (DaytonaError("plain, no status"), False),
]
ERROR_IDS = [f"{type(e).__name__}-{e.message[:8]}" for e, _ in ERROR_KINDS]


def test_retryable_follows_typed_causes() -> None:
    for exc, retryable in ERROR_KINDS:
        assert is_retryable(exc) is retryable, exc
    wrapped = DaytonaError("Failed to kill PTY: rate limited")
    wrapped.__cause__ = DaytonaRateLimitError("rate limited", status_code=429)
    assert is_retryable(wrapped)


@pytest.mark.parametrize(("exc", "retryable"), ERROR_KINDS, ids=ERROR_IDS)
async def test_create_errors_map_with_retryable(
    fake: FakeDaytona, exc: DaytonaError, retryable: bool
) -> None:
    fake.fail("create", copy.copy(exc))
    session = open_daytona(fake)
    with pytest.raises(sandbox.ProviderError) as info:
        await session.start()
    assert info.value.retryable is retryable
    assert exc.message in str(info.value)
    assert isinstance(info.value, sandbox.ConnectionLostError) == isinstance(
        exc, DaytonaConnectionError
    )
    assert fake.live_sandbox_ids() == []
    # A failed start can be retried.
    async with session:
        assert (await session.exec("echo again")).stdout == b"again\n"


@pytest.mark.parametrize(
    "point",
    [
        "create_pty_session",
        "send_input",
        "create_session",
        "execute_session_command",
    ],
)
@pytest.mark.parametrize(("exc", "retryable"), ERROR_KINDS[::3], ids=ERROR_IDS[::3])
async def test_process_start_errors_map_and_leave_nothing(
    fake: FakeDaytona, point: str, exc: DaytonaError, retryable: bool
) -> None:
    async with open_daytona(fake) as session:
        fake.fail(point, copy.copy(exc))
        with pytest.raises(sandbox.ProviderError) as info:
            await session.pty_exec_start(
                "exec sleep 30", tty=point.endswith(("pty_session", "input"))
            )
        assert info.value.retryable is retryable
        await nothing_left(fake, session)


@pytest.mark.parametrize(("exc", "retryable"), ERROR_KINDS[1::3], ids=ERROR_IDS[1::3])
async def test_errors_of_running_processes_map(
    fake: FakeDaytona, exc: DaytonaError, retryable: bool
) -> None:
    async with open_daytona(fake) as session:
        update = await session.pty_exec_start("echo ready; exec cat", tty=True, until="ready")
        pid = update.process_id
        assert pid is not None
        await session.write_file("any.txt", b"a")  # reads get past the stat first
        calls = {
            "send_input": lambda: session.pty_write_stdin(pid, "x\n"),
            "resize_pty_session": lambda: session.pty_resize(pid, rows=30, cols=100),
            "create_session": lambda: session.exec("true"),
            "download_file": lambda: session.read_file("any.txt"),
            "get_file_info": lambda: session.read_file("any.txt"),
            "upload_file": lambda: session.write_file("any.txt", b"x"),
        }
        for point, call in calls.items():
            fake.fail(point, copy.copy(exc))
            with pytest.raises(sandbox.ProviderError) as info:
                await call()
            assert info.value.retryable is retryable, point
        # The process survived every failed call.
        update = await session.pty_write_stdin(
            pid, "still\n", until=re.compile("still.*still", re.S)
        )
        assert update.process_id == pid
        await session.pty_terminate(pid)
        await nothing_left(fake, session)


@pytest.mark.parametrize(("exc", "retryable"), ERROR_KINDS, ids=ERROR_IDS)
async def test_every_error_kind_at_wait_is_a_lost_process(
    fake: FakeDaytona, exc: DaytonaError, retryable: bool
) -> None:
    marker = unique_seconds()
    async with open_daytona(fake) as session:
        fake.fail("wait", copy.copy(exc))
        update = await session.pty_exec_start(f"exec sleep {marker}", tty=True, yield_time_s=10)
        assert (update.process_id, update.exit_code) == (None, None)
        assert "process lost" in update.output and exc.message in update.output
        assert await eventually(lambda: not host_pids_with_arg(marker))
        await nothing_left(fake, session)


@pytest.mark.parametrize("tty", [True, False], ids=["tty", "pipes"])
@pytest.mark.parametrize(("exc", "retryable"), ERROR_KINDS, ids=ERROR_IDS)
async def test_every_error_kind_at_kill(
    fake: FakeDaytona, exc: DaytonaError, retryable: bool, tty: bool
) -> None:
    marker = unique_seconds()
    async with open_daytona(fake) as session:
        update = await session.pty_exec_start(
            f"sleep {marker} & echo ready; exec sleep {marker}", tty=tty, until="ready"
        )
        assert update.process_id is not None
        # The signal-based kill (and, for a terminal, the PTY kill) fail once.
        fake.fail("exec", copy.copy(exc))
        if tty:
            fake.fail("kill_pty_session", copy.copy(exc))
        if retryable:  # tried again, and then it works
            await session.pty_terminate(update.process_id)
            assert await eventually(lambda: not host_pids_with_arg(marker))
            await nothing_left(fake, session)
            return
        if tty and isinstance(exc, DaytonaNotFoundError):
            # "No such PTY session" is taken at its word: the shell is gone already.
            await session.pty_terminate(update.process_id)
        else:
            with pytest.raises(sandbox.ProviderError) as info:
                await session.pty_terminate(update.process_id)
            assert not info.value.retryable
            assert exc.message in str(info.value)
        assert session.pty_processes() == []
    # Nothing could kill it; deleting the sandbox did.
    assert await eventually(lambda: not host_pids_with_arg(marker))
    await nothing_left(fake)


async def test_pipe_interrupt_errors_map(fake: FakeDaytona) -> None:
    async with open_daytona(fake) as session:
        update = await session.pty_exec_start("echo ready; exec sleep 30", until="ready")
        assert update.process_id is not None
        fake.fail("exec", DaytonaRateLimitError("slow down", status_code=429))
        with pytest.raises(sandbox.ProviderError) as info:
            await session.pty_interrupt(update.process_id)
        assert info.value.retryable
        await session.pty_interrupt(update.process_id)
        final = await session.pty_write_stdin(update.process_id, "", yield_time_s=10)
        assert final.exit_code == 130


async def test_file_errors(fake: FakeDaytona) -> None:
    async with open_daytona(fake) as session:
        with pytest.raises(sandbox.SandboxFileNotFoundError):
            await session.read_file("missing.txt")
        # A read asks get_file_info first (a download of a FIFO would never end).
        fake.fail("get_file_info", DaytonaServiceUnavailableError("busy", status_code=503))
        with pytest.raises(sandbox.ProviderError) as info:
            await session.read_file("missing.txt")
        assert info.value.retryable
        fake.fail("upload_file", DaytonaForbiddenError("read-only", status_code=403))
        with pytest.raises(sandbox.ProviderError) as info:
            await session.write_file("a/b/c.txt", b"x")
        assert not info.value.retryable
        await session.write_file(f"{session.workdir}/abs/olute.txt", b"abs")
        assert (await session.exec("cat abs/olute.txt")).stdout == b"abs"


async def test_create_that_fails_after_creating_is_found_and_deleted(fake: FakeDaytona) -> None:
    fake.fail("create", DaytonaTimeoutError("sandbox did not start in time"), after=True)
    with pytest.raises(sandbox.ProviderError) as info:
        await open_daytona(fake).start()
    assert info.value.retryable
    assert fake.live_sandbox_ids() == []
    assert fake.calls[-1] == "delete"


async def test_failed_preparation_deletes_the_created_sandbox(fake: FakeDaytona) -> None:
    fake.fail("exec", DaytonaConnectionError("dropped"))
    with pytest.raises(sandbox.ConnectionLostError):
        await open_daytona(fake).start()
    assert fake.live_sandbox_ids() == []


async def test_failed_preparation_keeps_an_attached_sandbox(fake: FakeDaytona) -> None:
    sandbox_id = fake.add_sandbox()
    fake.fail("exec", DaytonaConnectionError("dropped"))
    with pytest.raises(sandbox.ConnectionLostError):
        await open_daytona(fake, sandbox_id=sandbox_id).start()
    assert fake.live_sandbox_ids() == [sandbox_id]


@pytest.mark.parametrize("after", [False, True], ids=["before-create", "after-create"])
async def test_cancel_during_create_leaves_nothing(fake: FakeDaytona, after: bool) -> None:
    gate = fake.block("create", after=after)
    session = open_daytona(fake)
    outcome = await cancel_when(gate, asyncio.ensure_future(session.start()))
    assert isinstance(outcome, asyncio.CancelledError)
    assert fake.live_sandbox_ids() == []
    await nothing_left(fake)
    gate.release()


async def test_cancel_during_attach_leaves_the_sandbox_alone(fake: FakeDaytona) -> None:
    sandbox_id = fake.add_sandbox()
    gate = fake.block("get")
    session = open_daytona(fake, sandbox_id=sandbox_id)
    outcome = await cancel_when(gate, asyncio.ensure_future(session.start()))
    assert isinstance(outcome, asyncio.CancelledError)
    assert fake.live_sandbox_ids() == [sandbox_id]
    gate.release()
    async with session:  # the session can start after all
        assert (await session.exec("echo ok")).stdout == b"ok\n"
    assert fake.live_sandbox_ids() == [], "a started session deletes it on close"


async def test_delete_error_on_close_is_reported(fake: FakeDaytona) -> None:
    session = open_daytona(fake)
    await session.start()
    fake.fail("delete", DaytonaServiceUnavailableError("busy", status_code=503))
    with pytest.raises(sandbox.ProviderError) as info:
        await session.aclose()
    assert info.value.retryable
    assert session.state is sandbox.SessionState.CLOSED


async def test_delete_that_never_returns_is_bounded(fake: FakeDaytona) -> None:
    session = open_daytona(fake, teardown_timeout_s=0.3)
    await session.start()
    gate = fake.block("delete")
    with pytest.raises(sandbox.ProviderError, match="did not finish") as info:
        await session.aclose()
    assert info.value.retryable
    assert gate.reached.is_set()
    gate.release()


# ---- the terminal: shell trap, exit codes, bytes ------------------------------------------


async def test_nothing_added_shows_in_terminal_output(fake: FakeDaytona) -> None:
    async with open_daytona(fake) as session:
        update = await session.pty_exec_start("echo hi", tty=True)
        assert update.output == "hi\r\n"
        assert update.exit_code == 0
        update = await session.pty_exec_start("printf 'a\\tb'; exit 5", tty=True)
        assert update.output == "a\tb"
        assert update.exit_code == 5


@pytest.mark.parametrize("style", ["go", "shell"])
async def test_signal_deaths_report_128_plus_n_whatever_the_daemon_style(
    tmp_path: Path, style: str
) -> None:
    async with FakeDaytona(api_key=KEY, root=tmp_path, signal_exit=style) as fake:
        async with open_daytona(fake) as session:
            for command, code in (("kill -INT $$", 130), ("kill -KILL $$", 137)):
                update = await session.pty_exec_start(command, tty=True, yield_time_s=10)
                assert (update.exit_code, update.process_id) == (code, None)


def test_pty_exit_status_parsing() -> None:
    assert pty_exit_status(0, None) == 0
    assert pty_exit_status(3, "exit status 3") == 3
    assert pty_exit_status(130, None) == 130
    assert pty_exit_status(-1, "signal: killed") == 137
    assert pty_exit_status(-1, "signal: terminated") == 143
    assert pty_exit_status(-1, "signal: interrupt") == 130
    assert pty_exit_status(None, "killed by SIGSEGV") == 139
    assert pty_exit_status(-1, "signal 15") == 143
    # Go's -1 without a signal it names: the toolkit's rule (`normalize_exit`) reads it
    # as SIGKILL, the one signal a wrapper that traps the others can die of.
    assert pty_exit_status(-1, "no idea") == 137
    assert pty_exit_status(None, "Unexpected error: connection reset") is None
    assert pty_exit_status(None, None) is None


async def test_split_utf8_is_kept_whole_on_both_kinds(tmp_path: Path) -> None:
    text = "héllo wörld ✓ 日本"
    async with FakeDaytona(api_key=KEY, root=tmp_path, max_chunk=1) as fake:
        async with open_daytona(fake) as session:
            tty = await session.pty_exec_start(f"printf '%s' '{text}'", tty=True)
            assert tty.output == text
            pipe = await session.pty_exec_start(f"printf '%s' '{text}'")
            assert pipe.output == text
            result = await session.exec(f"printf '%s' '{text}'; printf '%s' '{text}' >&2")
            assert result.stdout == result.stderr == text.encode()


async def test_pipe_output_loses_only_invalid_bytes(fake: FakeDaytona) -> None:
    # The SDK decodes session logs to text: bytes that are not UTF-8 become U+FFFD.
    async with open_daytona(fake) as session:
        result = await session.exec(r"printf 'a\377b'")
        assert result.stdout == "a\ufffdb".encode()


async def test_long_terminal_command_goes_through_a_file(fake: FakeDaytona) -> None:
    word = "x" * (MAX_TYPED_LINE * 3)
    async with open_daytona(fake) as session:
        update = await session.pty_exec_start(f"echo {word} | wc -c", tty=True)
        assert update.output.strip() == str(len(word) + 1)
        assert update.exit_code == 0
        assert "upload_file" in fake.calls
        listing = await session.exec(f"ls -A {session._state_dir}")
        # Only this `ls`'s own pid file: the script and the terminal's pid file are gone.
        assert [n.split("-")[2] for n in listing.stdout.decode().split()] == ["exec"]


async def test_terminal_env_and_cwd(fake: FakeDaytona) -> None:
    async with open_daytona(fake) as session:
        await session.exec("mkdir -p sub/dir")
        update = await session.pty_exec_start(
            "echo $GREETING $TERM; pwd", tty=True, env={"GREETING": "hola"}, cwd="sub/dir"
        )
        assert update.output.replace("\r", "") == (
            f"hola xterm-256color\n{session.workdir}/sub/dir\n"
        )
        update = await session.pty_exec_start("pwd", cwd="sub")
        assert update.output == f"{session.workdir}/sub\n"
        with pytest.raises(sandbox.WorkdirError, match="nowhere"):
            await session.pty_exec_start("true", tty=True, cwd="nowhere")
        assert session.pty_processes() == []


async def test_pipe_stdin_is_closed_although_the_session_shell_has_one(fake: FakeDaytona) -> None:
    # The daemon's session shell keeps a stdin pipe open: without </dev/null `cat` hangs.
    async with open_daytona(fake) as session:
        update = await session.pty_exec_start("cat; echo after-cat", yield_time_s=10)
        assert update.output == "after-cat\n"
        assert update.exit_code == 0


async def test_interrupt_right_after_start_reaches_the_group(fake: FakeDaytona) -> None:
    marker = unique_seconds()
    async with open_daytona(fake) as session:
        update = await session.pty_exec_start(
            f"sleep {marker} & sleep {marker}; wait", yield_time_s=0.25
        )
        assert update.process_id is not None
        await session.pty_interrupt(update.process_id)
        final = await session.pty_write_stdin(update.process_id, "", yield_time_s=10)
        assert final.exit_code == 130
        assert await eventually(lambda: not host_pids_with_arg(marker))


@pytest.mark.parametrize("tty", [True, False], ids=["tty", "pipes"])
async def test_children_that_outlive_the_command_are_killed(fake: FakeDaytona, tty: bool) -> None:
    # `kill_pty_session`/`delete_session` kill only the leader, and SIGHUP does not reach
    # a nohup'd child: only killing the group does.
    marker = unique_seconds()
    async with open_daytona(fake) as session:
        update = await session.pty_exec_start(
            f"nohup sleep {marker} >/dev/null 2>&1 & echo started", tty=tty, yield_time_s=10
        )
        assert update.exit_code == 0
        assert await eventually(lambda: not host_pids_with_arg(marker))
        await nothing_left(fake, session)


async def test_terminal_terminate_kills_other_groups_of_its_session(fake: FakeDaytona) -> None:
    marker = unique_seconds()
    async with open_daytona(fake) as session:
        update = await session.pty_exec_start(
            f"set -m; sleep {marker} & echo started; exec sleep {marker}",
            tty=True,
            until="started",
        )
        assert update.process_id is not None
        assert await eventually(lambda: len(host_pids_with_arg(marker)) == 2)
        await session.pty_terminate(update.process_id)
        assert await eventually(lambda: not host_pids_with_arg(marker))
        await nothing_left(fake, session)


def test_kill_script_never_signals_group_zero_or_one(tmp_path: Path) -> None:
    for content in ("", "0", "1", "-1", "12abc", "1 2", "0 123"):
        pidfile = tmp_path / "p.pid"
        pidfile.write_text(content)
        script = kill_script(str(pidfile), wait_s=0, grace_s=0)
        result = subprocess.run(["sh", "-c", script], capture_output=True, timeout=10)
        assert result.stdout.strip() == b"none", content


def _start_time(pid: int) -> str:
    info = procfs.stat(pid)
    assert info is not None, pid
    return str(info.start_time)


def test_kill_script_spares_a_reused_pid_and_kills_the_whole_tree(tmp_path: Path) -> None:
    marker = unique_seconds()
    # A tree: a leader in its own session, a child, and a grandchild that left with setsid.
    tree = subprocess.Popen(
        ["sh", "-c", f"sleep {marker} & setsid sleep {marker} & sleep {marker}; wait"],
        start_new_session=True,
    )
    try:
        assert wait_until(lambda: len(host_pids_with_arg(marker)) == 3)
        pidfile = tmp_path / "p.pid"
        # Same pid, another start time: the pid now belongs to someone else.
        pidfile.write_text(f"{tree.pid} 12345")
        script = kill_script(str(pidfile), wait_s=0, grace_s=0.2)
        result = subprocess.run(["sh", "-c", script], capture_output=True, timeout=10)
        assert result.stdout.strip() == b"none"
        assert len(host_pids_with_arg(marker)) == 3
        pidfile.write_text(f"{tree.pid} {_start_time(tree.pid)}")
        result = subprocess.run(["sh", "-c", script], capture_output=True, timeout=10)
        assert result.stdout.strip() == b"done"
        tree.wait(timeout=10)
        assert wait_until(lambda: not host_pids_with_arg(marker))
        assert not pidfile.exists()
    finally:
        tree.kill()
        tree.wait()
        subprocess.run(["pkill", "-KILL", "-f", f"sleep {marker}"], check=False)


@pytest.mark.parametrize("tty", [True, False], ids=["tty", "pipes"])
async def test_terminate_kills_children_that_left_the_group(fake: FakeDaytona, tty: bool) -> None:
    marker = unique_seconds()
    async with open_daytona(fake) as session:
        update = await session.pty_exec_start(
            f"sleep {marker} & setsid sleep {marker} & echo ready; sleep {marker}; wait",
            tty=tty,
            until="ready",
        )
        assert update.process_id is not None
        assert await eventually(lambda: len(host_pids_with_arg(marker)) == 3)
        await session.pty_terminate(update.process_id)
        assert await eventually(lambda: not host_pids_with_arg(marker))
        await nothing_left(fake, session)


# ---- faults: a reader that dies, a wait that never returns ---------------------------------


@pytest.mark.parametrize("tty", [True, False], ids=["tty", "pipes"])
async def test_reader_that_dies_reports_lost_and_kills(fake: FakeDaytona, tty: bool) -> None:
    marker = unique_seconds()
    async with open_daytona(fake) as session:
        update = await session.pty_exec_start(
            f"echo ready; exec sleep {marker}", tty=tty, until="ready"
        )
        pid = update.process_id
        assert pid is not None
        assert fake.drop_streams("connection reset by peer") == 1
        final = await session.pty_write_stdin(pid, "", yield_time_s=10)
        assert final.process_id is None
        assert final.exit_code is None
        assert "process lost" in final.output and "connection reset by peer" in final.output
        # The remote process was still running: discarding the entry killed it.
        assert await eventually(lambda: not host_pids_with_arg(marker))
        await nothing_left(fake, session)


@pytest.mark.parametrize("tty", [True, False], ids=["tty", "pipes"])
async def test_stream_that_dies_at_start(fake: FakeDaytona, tty: bool) -> None:
    marker = unique_seconds()
    async with open_daytona(fake) as session:
        fake.fail("stream", DaytonaConnectionError("websocket closed"))
        update = await session.pty_exec_start(f"exec sleep {marker}", tty=tty, yield_time_s=10)
        assert update.process_id is None and update.exit_code is None
        assert "websocket closed" in update.output
        assert await eventually(lambda: not host_pids_with_arg(marker))
        await nothing_left(fake, session)


async def test_pipe_stream_dies_after_the_command_ended(fake: FakeDaytona) -> None:
    async with open_daytona(fake) as session:
        gate = fake.block("get_session_command_logs_async")
        task = asyncio.ensure_future(session.pty_exec_start("exit 4", yield_time_s=10))
        await gate.reached.wait()
        [state] = fake.sandboxes[session.sandbox_id or ""].sessions.values()
        [command] = state.commands.values()
        await command.done.wait()
        fake.fail("stream", DaytonaConnectionError("websocket closed"))
        gate.release()
        update = await task
        assert update.exit_code == 4
        assert "output may be incomplete" in update.output
        await nothing_left(fake, session)


@pytest.mark.parametrize(
    ("tty", "point"), [(True, "wait"), (False, "get_session_command")], ids=["tty", "pipes"]
)
async def test_wait_that_never_returns(fake: FakeDaytona, tty: bool, point: str) -> None:
    async with open_daytona(fake) as session:
        gate = fake.block(point)
        update = await session.pty_exec_start("echo done", tty=tty, yield_time_s=0.5)
        assert gate.reached.is_set()
        pid = update.process_id
        assert pid is not None, "without an exit status the process still counts as running"
        assert update.output.replace("\r", "") == "done\n"
        await asyncio.wait_for(session.pty_terminate(pid), timeout=10)
        await nothing_left(fake, session)
        gate.release()


async def test_exec_whose_exit_code_never_comes_times_out(fake: FakeDaytona) -> None:
    async with open_daytona(fake) as session:
        gate = fake.block("get_session_command")
        with pytest.raises(sandbox.ExecTimeoutError) as info:
            await session.exec("echo out", timeout=1)
        assert info.value.stdout == b"out\n"
        await nothing_left(fake, session)
        gate.release()


# ---- cancellation at each SDK await point --------------------------------------------------


@pytest.mark.parametrize("after", [False, True], ids=["before", "after"])
@pytest.mark.parametrize(
    ("tty", "point"),
    [
        (True, "create_pty_session"),
        (True, "send_input"),
        (True, "wait"),
        (False, "create_session"),
        (False, "execute_session_command"),
        (False, "get_session_command_logs_async"),
        (False, "get_session_command"),
    ],
)
async def test_cancel_during_start_leaves_nothing(
    fake: FakeDaytona, tty: bool, point: str, after: bool
) -> None:
    marker = unique_seconds()
    # Calls that only come (or only return) once the command ended need one that ends.
    ends = point == "get_session_command" or (
        after and point in ("wait", "get_session_command_logs_async")
    )
    async with open_daytona(fake) as session:
        gate = fake.block(point, after=after)
        command = "echo started; sleep 0.1" if ends else f"echo started; exec sleep {marker}"
        task = asyncio.ensure_future(session.pty_exec_start(command, tty=tty, yield_time_s=30))
        outcome = await cancel_when(gate, task)
        assert isinstance(outcome, asyncio.CancelledError)
        assert await eventually(lambda: not host_pids_with_arg(marker))
        await nothing_left(fake, session)
        gate.release()


@pytest.mark.parametrize(
    ("point", "after"),
    [
        ("create_session", True),
        ("execute_session_command", True),
        ("get_session_command_logs_async", False),
        ("get_session_command", False),
    ],
)
async def test_cancel_during_one_shot_exec_leaves_nothing(
    fake: FakeDaytona, point: str, after: bool
) -> None:
    marker = unique_seconds()
    async with open_daytona(fake) as session:
        gate = fake.block(point, after=after)
        command = "echo quick" if point == "get_session_command" else f"sleep {marker}"
        task = asyncio.ensure_future(session.exec(command))
        outcome = await cancel_when(gate, task)
        assert isinstance(outcome, asyncio.CancelledError)
        assert await eventually(lambda: not host_pids_with_arg(marker))
        await nothing_left(fake, session)
        gate.release()


async def test_cancel_during_send_keeps_the_process(fake: FakeDaytona) -> None:
    async with open_daytona(fake) as session:
        update = await session.pty_exec_start("echo ready; exec cat", tty=True, until="ready")
        pid = update.process_id
        assert pid is not None
        gate = fake.block("send_input")
        outcome = await cancel_when(
            gate, asyncio.ensure_future(session.pty_write_stdin(pid, "x\n"))
        )
        assert isinstance(outcome, asyncio.CancelledError)
        gate.release()
        update = await session.pty_write_stdin(pid, "y\n", until=re.compile("y.*y", re.S))
        assert update.process_id == pid
        await session.pty_terminate(pid)
        await nothing_left(fake, session)


@pytest.mark.parametrize(
    ("tty", "point", "after"),
    [
        (True, "exec", False),  # the signal-based kill of the group never starts
        (True, "exec", True),  # the group is killed, the answer never comes
        (True, "kill_pty_session", True),  # the shell is killed, the answer never comes
        (False, "exec", True),
        (False, "delete_session", False),
    ],
)
async def test_cancel_during_kill_still_leaves_nothing(
    fake: FakeDaytona, tty: bool, point: str, after: bool
) -> None:
    marker = unique_seconds()
    # A deadline far past the kill's own work: the gate after it must be reached on a
    # loaded machine too (with 0.5 s the kill script could time out before its answer).
    # The test never waits it out: the gate is released right after the cancellation.
    async with open_daytona(fake, teardown_timeout_s=30.0) as session:
        update = await session.pty_exec_start(
            f"sleep {marker} & echo ready; exec sleep {marker}", tty=tty, until="ready"
        )
        pid = update.process_id
        assert pid is not None
        if point == "kill_pty_session":
            # Make the group kill fail so that the PTY kill is needed.
            fake.fail("exec", DaytonaConnectionError("dropped"), times=2)
        gate = fake.block(point, after=after)
        task = asyncio.ensure_future(session.pty_terminate(pid))
        await gate.reached.wait()
        # The kill runs settled: the cancelled caller waits for it while its provider
        # call is parked, and the kill ends once the answer comes. `cancel()` cancels
        # the future the caller awaits at once, so the cancellation is delivered to
        # it whatever the release lets run first.
        task.cancel()
        gate.release()
        outcome = await asyncio.gather(task, return_exceptions=True)
        assert isinstance(outcome[0], asyncio.CancelledError), outcome
        assert session.pty_processes() == []
        assert await eventually(lambda: not host_pids_with_arg(marker))
        # A session whose deletion never got an answer may still exist on the provider.
        await nothing_left(fake, None if point == "delete_session" else session)
        assert session._core.processes.reserved == set()


async def test_kill_that_never_returns_is_reported_for_pipes(fake: FakeDaytona) -> None:
    # Without an answer to the group kill nothing else can reach a pipe process's group;
    # the error says so, and deleting the sandbox removes it.
    marker = unique_seconds()
    async with open_daytona(fake, teardown_timeout_s=0.3) as session:
        update = await session.pty_exec_start(f"echo ready; exec sleep {marker}", until="ready")
        assert update.process_id is not None
        gate = fake.block("exec")
        with pytest.raises(sandbox.ProviderError, match="did not finish") as info:
            await session.pty_terminate(update.process_id)
        assert info.value.retryable
        gate.release()
    assert await eventually(lambda: not host_pids_with_arg(marker))
    await nothing_left(fake)


async def test_cancel_during_close_still_deletes(fake: FakeDaytona) -> None:
    marker = unique_seconds()
    session = open_daytona(fake, teardown_timeout_s=0.5)
    await session.start()
    await session.pty_exec_start(f"echo ready; exec sleep {marker}", tty=True, until="ready")
    gate = fake.block("delete", after=True)
    outcome = await cancel_when(gate, asyncio.ensure_future(session.aclose()))
    assert isinstance(outcome, asyncio.CancelledError | sandbox.ProviderError)
    gate.release()
    assert fake.live_sandbox_ids() == []
    assert await eventually(lambda: not host_pids_with_arg(marker))
    await nothing_left(fake)


# ---- provider fidelity ------------------------------------------------------------------


async def test_write_to_a_terminal_whose_process_exited_is_process_exited(
    fake: FakeDaytona,
) -> None:
    # The SDK's handle stops being "connected" when the daemon reports the exit, and
    # then raises DaytonaConnectionError("PTY is not connected"): not a lost connection.
    async with open_daytona(fake) as session:
        gate = fake.block("wait", after=True)  # the exit is not reported to us yet
        update = await session.pty_exec_start("read x; exit 3", tty=True, yield_time_s=0.5)
        pid = update.process_id
        assert pid is not None
        await session.pty_write_stdin(pid, "go\n")
        assert await eventually(lambda: any(h.exit_code is not None for h in fake._handles))
        with pytest.raises(sandbox.ProcessExitedError) as info:
            await session.pty_write_stdin(pid, "more\n")
        assert not info.value.retryable
        gate.release()
        final = await session.pty_write_stdin(pid, "", yield_time_s=5)
        assert final.exit_code == 3
    await nothing_left(fake)


async def test_a_dropped_terminal_connection_is_still_connection_lost(fake: FakeDaytona) -> None:
    async with open_daytona(fake) as session:
        update = await session.pty_exec_start("echo r; exec cat", tty=True, until="r")
        assert update.process_id is not None
        fake.fail("send_input", DaytonaConnectionError("Failed to send input to PTY: reset"))
        with pytest.raises(sandbox.ConnectionLostError):
            await session.pty_write_stdin(update.process_id, "x\n")
    await nothing_left(fake)


async def test_download_failure_without_error_details_maps_by_what_is_there(
    tmp_path: Path,
) -> None:
    # Without error details the SDK raises a plain DaytonaError (no status, no code):
    # a file removed after the stat is still "not found", not an opaque provider error.
    root = tmp_path / "legacy"
    root.mkdir()
    async with FakeDaytona(api_key=KEY, root=root, download_error_details=False) as fake:
        async with open_daytona(fake) as session:
            await session.write_file("gone.txt", b"x")
            gate = fake.block("download_file")
            read = asyncio.ensure_future(session.read_file("gone.txt"))
            await gate.reached.wait()
            await session.exec("rm gone.txt")
            gate.release()
            with pytest.raises(sandbox.SandboxFileNotFoundError):
                await read
            fake.fail("download_file", DaytonaError("Failed to download file: No data received"))
            await session.write_file("here.txt", b"x")
            with pytest.raises(sandbox.ProviderError) as info:
                await session.read_file("here.txt")
            assert not isinstance(info.value, sandbox.SandboxFileNotFoundError)
        await nothing_left(fake)
