"""The `modal` backend's quirks and faults, through the SDK fake (real local processes).

The fake is checked against the installed SDK first (drift), so everything below runs
against the SDK's real call shapes. Faults are injected at the SDK boundary only; every
cancellation waits for the fake to SIGNAL that a call is held (an asyncio.Event).
"""

from __future__ import annotations

import asyncio
import logging
import time
import traceback
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import modal
import pytest
from modal import exception as mx
from modal.container_process import ContainerProcess
from modal.io_streams import StreamReader, StreamWriter
from modal.sandbox.sandbox import SandboxFilesystem

import sandbox
from sandbox.arguments import build_command
from sandbox.backends.modal import ModalSession
from sandbox.backends.modal.commands import Command
from sandbox.backends.modal.session import TOKEN_ENV
from sandbox.backends.toolkit import REDACTED, normalize_exit
from sandbox.backends.toolkit.shell import KILL_NAME
from sandbox.testing import modal_fake
from sandbox.testing.drift import surface_problems
from sandbox.testing.modal_fake import FakeContainerProcess, FakeModal
from tests.helpers import (
    DeadlineCount,
    describe_pids,
    eventually,
    host_pids_with_arg,
    unique_seconds,
)

TOKEN_ID = "ak-modal-test-id"
SECRET = "as-modal-secret-5ee1b0c4"


@pytest.fixture
async def fake() -> AsyncIterator[FakeModal]:
    f = FakeModal()
    yield f
    await f.aclose()
    # The kill is sent, not finished: a SIGKILLed process leaves the table a moment later.
    assert await eventually(lambda: f.leftover_pids() == []), describe_pids(f.leftover_pids())


def open_modal(fake: FakeModal, tmp_path: Path, **options: Any) -> ModalSession:
    options.setdefault("token_id", TOKEN_ID)
    options.setdefault("token_secret", SECRET)
    options.setdefault("terminate_grace_s", 0.3)
    options.setdefault("state_dir", str(tmp_path / "state"))
    # The per-exec path's quirks and faults (the runner's: test_modal_runner.py).
    options.setdefault("runner", False)
    s = sandbox.open_session("modal", sdk=fake, workdir=str(tmp_path / "ws"), **options)
    assert isinstance(s, ModalSession)
    return s


def other_tasks() -> set[asyncio.Task[Any]]:
    current = asyncio.current_task()
    return {t for t in asyncio.all_tasks() if t is not current and not t.done()}


def running(marker: str) -> Callable[[tuple[str, ...]], bool]:
    """A fault predicate: the process whose command mentions `marker` (not a control
    exec, whose argv holds only scripts and tags)."""
    return lambda argv: not is_control(argv) and any(marker in part for part in argv)


def is_control(argv: tuple[str, ...]) -> bool:
    return KILL_NAME in argv


def fake_process(fake: FakeModal, marker: str) -> FakeContainerProcess:
    for box in fake.sandboxes.values():
        for process in box.processes:
            if running(marker)(process.argv):
                return process
    raise AssertionError(f"no process mentions {marker}")


def running_local_processes(fake: FakeModal) -> list[FakeContainerProcess]:
    """Processes of live fake sandboxes whose local process has not been seen exiting."""
    return [
        p
        for box in fake.live_sandboxes()
        for p in box.processes
        if p._local is not None and not p._local.exited
    ]


async def no_leftovers(fake: FakeModal, *markers: str) -> None:
    assert await eventually(lambda: not any(host_pids_with_arg(m) for m in markers))
    # A process that died is marked exited when the event loop reads its pidfd: later.
    assert await eventually(lambda: running_local_processes(fake) == []), [
        p.argv for p in running_local_processes(fake)
    ]


# ---- drift: the fake is exactly the installed SDK's surface -----------------------------

SURFACES = [
    (modal_fake.FakeSandbox, modal.Sandbox),
    (modal_fake.FakeContainerProcess, ContainerProcess),
    (modal_fake.FakeStreamReader, StreamReader),
    (modal_fake.FakeStreamWriter, StreamWriter),
    (modal_fake.FakeSandboxFilesystem, SandboxFilesystem),
    (modal_fake.FakeApp, modal.App),
    (modal_fake.FakeClient, modal.Client),
    (modal_fake.FakeImage, modal.Image),
]


@pytest.mark.parametrize(("fake_cls", "real_cls"), SURFACES, ids=lambda c: c.__name__)
def test_fake_matches_the_installed_sdk(fake_cls: type, real_cls: type) -> None:
    assert surface_problems(fake_cls, real_cls) == []


def test_classes_bound_to_a_fake_match_too() -> None:
    f = FakeModal()
    for bound, real in ((f.Sandbox, modal.Sandbox), (f.App, modal.App), (f.Client, modal.Client)):
        assert surface_problems(bound, real) == []


def test_drift_check_catches_each_kind_of_change() -> None:
    aio = modal_fake._AioMethod

    class ExtraParameter(modal_fake.FakeSandbox):
        @aio
        async def exec(self, *args: str, bogus: int = 0) -> None: ...

    class LostItsAio(modal_fake.FakeContainerProcess):
        async def wait(self) -> int:  # type: ignore[override]
            return 0

    class SyncAio(modal_fake.FakeStreamWriter):
        @aio
        def drain(self) -> None: ...

    class MissingRequired(modal_fake.FakeStreamWriter):
        def write(self) -> None:  # type: ignore[override]
            ...

    class NotInSdk(modal_fake.FakeSandbox):
        @aio
        async def kill(self) -> None: ...

    class BadDunder(modal_fake.FakeStreamReader):
        def __aiter__(self, extra: int) -> Any:  # type: ignore[override]
            ...

    expectations = [
        (ExtraParameter, modal.Sandbox, "'bogus' does not exist"),
        (LostItsAio, ContainerProcess, "has an .aio form only in the SDK"),
        (SyncAio, StreamWriter, "sync in the fake, async in the SDK"),
        (MissingRequired, StreamWriter, "requires parameter 'data'"),
        (NotInSdk, modal.Sandbox, "has no attribute 'kill'"),
        (BadDunder, StreamReader, "'extra' does not exist"),
    ]
    for fake_cls, real_cls, expected in expectations:
        problems = surface_problems(fake_cls, real_cls)
        assert any(expected in p for p in problems), (fake_cls.__name__, problems)


def test_blocking_forms_are_not_faked() -> None:
    f = FakeModal()
    with pytest.raises(TypeError, match=r"\.aio"):
        f.Sandbox.create()


async def test_create_options_are_checked_against_the_sdk(fake: FakeModal, tmp_path: Path) -> None:
    s = open_modal(fake, tmp_path, create_options={"cpu": 2.0, "memory": 1024})
    async with s:
        (box,) = fake.live_sandboxes()
        assert box.options["cpu"] == 2.0 and box.options["memory"] == 1024
    s = open_modal(fake, tmp_path, create_options={"cpus": 2})
    with pytest.raises(TypeError, match="cpus"):
        await s.start()
    assert fake.live_sandboxes() == []
    assert fake.open_clients() == []


@pytest.mark.parametrize("env", [{"BAD NAME": "x"}, {"V": "a\ud800"}, ["V=x"]])
def test_create_options_env_is_checked(fake: FakeModal, tmp_path: Path, env: Any) -> None:
    with pytest.raises(sandbox.InvalidArgumentError, match="create_options"):
        open_modal(fake, tmp_path, create_options={"env": env})


async def test_resource_limits_reach_the_create_as_request_and_limit(
    fake: FakeModal, tmp_path: Path
) -> None:
    s = open_modal(fake, tmp_path, memory_limit_bytes=768 * 1024 * 1024, cpu_limit=0.029)
    async with s:
        (box,) = fake.live_sandboxes()
        assert box.options["memory"] == (768, 768)
        # The SDK sends int(1000 * cpu) millicores: 29, not the 28 that 0.029 gives.
        request, limit = box.options["cpu"]
        assert request == limit and int(1000 * limit) == 29
    from modal._resources import convert_fn_config_to_resources_config

    sent = convert_fn_config_to_resources_config(cpu=(request, limit), memory=(768, 768), gpu=None)
    assert (sent.milli_cpu, sent.milli_cpu_max, sent.memory_mb, sent.memory_mb_max) == (
        29, 29, 768, 768,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("options", "error", "named"),
    [
        ({"process_limit": 64}, sandbox.UnsupportedOperationError, "process_limit"),
        ({"cpu_limit": 1.0, "sandbox_id": "sb-x"}, sandbox.UnsupportedOperationError, "cpu_limit"),
        ({"memory_limit_bytes": 1000}, sandbox.InvalidArgumentError, "memory_limit_bytes"),
        ({"cpu_limit": 0.0005}, sandbox.InvalidArgumentError, "cpu_limit"),
        ({"cpu_limit": float("nan")}, sandbox.InvalidArgumentError, "cpu_limit"),
        ({"memory_limit_bytes": True}, sandbox.InvalidArgumentError, "memory_limit_bytes"),
        (
            {"cpu_limit": 1.0, "create_options": {"cpu": 2.0}},
            sandbox.InvalidArgumentError,
            "cpu",
        ),
    ],
)
def test_limits_modal_cannot_apply_are_refused_when_opened(
    fake: FakeModal, tmp_path: Path, options: dict[str, Any], error: type, named: str
) -> None:
    with pytest.raises(error, match=named):
        open_modal(fake, tmp_path, **options)
    assert fake.live_sandboxes() == []


# ---- credentials and secrets --------------------------------------------------------------


async def test_missing_credentials_name_the_variables(
    fake: FakeModal, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("MODAL_TOKEN_ID", raising=False)
    monkeypatch.delenv("MODAL_TOKEN_SECRET", raising=False)
    s = sandbox.open_session("modal", sdk=fake, workdir=str(tmp_path))
    with pytest.raises(sandbox.CredentialsMissingError) as info:
        await s.start()
    assert "MODAL_TOKEN_ID" in str(info.value) and "MODAL_TOKEN_SECRET" in str(info.value)
    assert not info.value.retryable
    assert fake.calls == [], "nothing may be asked of Modal without a token"
    monkeypatch.setenv("MODAL_TOKEN_ID", TOKEN_ID)
    with pytest.raises(sandbox.CredentialsMissingError) as info:
        await s.start()
    assert "MODAL_TOKEN_SECRET" in str(info.value) and "MODAL_TOKEN_ID" not in str(info.value)


async def test_credentials_from_the_environment(
    fake: FakeModal, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MODAL_TOKEN_ID", TOKEN_ID)
    monkeypatch.setenv("MODAL_TOKEN_SECRET", SECRET)
    async with sandbox.open_session(
        "modal", sdk=fake, workdir=str(tmp_path / "ws"), state_dir=str(tmp_path / "st")
    ) as s:
        assert (await s.exec("echo ok")).stdout == b"ok\n"
        assert fake.clients[0]._token_id == TOKEN_ID
    assert fake.open_clients() == [] and fake.live_sandboxes() == []


async def test_a_given_client_is_used_and_not_closed(fake: FakeModal, tmp_path: Path) -> None:
    client = await fake.Client.from_credentials.aio("id", "secret")
    s = sandbox.open_session(
        "modal",
        sdk=fake,
        client=client,
        workdir=str(tmp_path / "ws"),
        state_dir=str(tmp_path / "st"),
    )
    async with s:
        await s.exec("true")
    assert fake.open_clients() == [client]


async def test_secrets_never_in_errors_reprs_tracebacks_or_logs(
    fake: FakeModal, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    fake.fail("create", mx.AuthError(f"token {TOKEN_ID}:{SECRET} was rejected"))
    s = open_modal(fake, tmp_path)
    with pytest.raises(sandbox.ProviderError) as info:
        await s.start()
    text = "".join(traceback.format_exception(info.value))
    assert REDACTED in str(info.value)
    for secret in (SECRET, TOKEN_ID):
        assert secret not in text and secret not in repr(s) and secret not in caplog.text
    assert not info.value.retryable


# ---- SDK errors: each kind, at each call ----------------------------------------------------

KINDS = [
    (mx.ResourceExhaustedError("rate limit exceeded"), True, sandbox.ProviderError),
    (mx.TimeoutError("deadline exceeded"), True, sandbox.ProviderError),
    (mx.ServiceError("service unavailable"), True, sandbox.ProviderError),
    (mx.InternalFailure("try again"), True, sandbox.ProviderError),
    (mx.ConnectionError("connection reset"), True, sandbox.ConnectionLostError),
    (mx.NotFoundError("no such sandbox"), False, sandbox.ProviderError),
    (mx.AuthError("token rejected"), False, sandbox.ProviderError),
    (mx.PermissionDeniedError("not allowed"), False, sandbox.ProviderError),
    (mx.InvalidError("bad request"), False, sandbox.ProviderError),
    (mx.ConflictError("conflict"), False, sandbox.ProviderError),
    (mx.SandboxTimeoutError("sandbox lifetime over"), False, sandbox.ProviderError),
]
KIND_IDS = [type(k[0]).__name__ for k in KINDS]


def check_mapped(error: BaseException, exc: BaseException, retryable: bool, cls: type) -> None:
    assert isinstance(error, cls), repr(error)
    assert error.retryable is retryable  # type: ignore[attr-defined]
    assert type(exc).__name__ in str(error)


@pytest.mark.parametrize(("exc", "retryable", "cls"), KINDS, ids=KIND_IDS)
async def test_create_errors_are_mapped_and_leave_nothing(
    fake: FakeModal, tmp_path: Path, exc: BaseException, retryable: bool, cls: type
) -> None:
    fake.fail("create", exc)
    s = open_modal(fake, tmp_path)
    with pytest.raises(sandbox.SandboxError) as info:
        await s.start()
    check_mapped(info.value, exc, retryable, cls)
    assert fake.live_sandboxes() == [] and fake.open_clients() == []
    assert s.state is sandbox.SessionState.NEW
    async with s:  # a failed start can be retried
        assert (await s.exec("echo again")).stdout == b"again\n"


@pytest.mark.parametrize(("exc", "retryable", "cls"), KINDS, ids=KIND_IDS)
async def test_exec_errors_are_mapped(
    fake: FakeModal, tmp_path: Path, exc: BaseException, retryable: bool, cls: type
) -> None:
    marker = unique_seconds()
    async with open_modal(fake, tmp_path) as s:
        fake.fail("exec", exc, when=running(marker))
        with pytest.raises(sandbox.SandboxError) as info:
            await s.exec(f"sleep {marker}")
        check_mapped(info.value, exc, retryable, cls)
        assert (await s.exec("echo fine")).stdout == b"fine\n"


@pytest.mark.parametrize(
    ("op", "exc", "retryable"),
    [
        ("client", mx.ServiceError("unavailable"), True),
        ("client", mx.AuthError("bad token"), False),
        ("app_lookup", mx.ResourceExhaustedError("slow down"), True),
        ("app_lookup", mx.PermissionDeniedError("no"), False),
        ("from_id", mx.NotFoundError("no such sandbox"), False),
    ],
)
async def test_connect_errors(
    fake: FakeModal, tmp_path: Path, op: str, exc: BaseException, retryable: bool
) -> None:
    existing = await fake.Sandbox.create.aio(
        app=await fake.App.lookup.aio("a", create_if_missing=True)
    )
    fake.fail(op, exc)
    s = open_modal(fake, tmp_path, sandbox_id=existing.object_id if op == "from_id" else None)
    with pytest.raises(sandbox.ProviderError) as info:
        await s.start()
    check_mapped(info.value, exc, retryable, sandbox.ProviderError)
    assert fake.live_sandboxes() == [existing] and fake.open_clients() == []


async def test_a_sandbox_created_despite_an_error_is_terminated(
    fake: FakeModal, tmp_path: Path
) -> None:
    fake.fail("create_response", mx.ServiceError("the answer was lost"))
    s = open_modal(fake, tmp_path)
    with pytest.raises(sandbox.ProviderError) as info:
        await s.start()
    assert info.value.retryable
    assert len(fake.sandboxes) == 1, "the provider created one"
    assert fake.live_sandboxes() == [], "found by its name and terminated"
    assert fake.open_clients() == []


async def test_a_process_started_despite_an_exec_error_is_killed(
    fake: FakeModal, tmp_path: Path
) -> None:
    marker = unique_seconds()
    async with open_modal(fake, tmp_path) as s:
        fake.fail("exec_response", mx.ServiceError("the answer was lost"), when=running(marker))
        with pytest.raises(sandbox.ProviderError):
            await s.pty_exec_start(f"exec sleep {marker}", tty=True)
        await no_leftovers(fake, marker)
        assert s.pty_processes() == []
        fake.fail("exec_response", mx.ServiceError("lost again"), when=running(marker))
        with pytest.raises(sandbox.ProviderError):
            await s.exec(f"sleep {marker}")
        await no_leftovers(fake, marker)


@pytest.mark.parametrize(
    ("exc", "retryable"), [(mx.ServiceError("reset"), True), (mx.InvalidError("bad"), False)]
)
async def test_write_errors_keep_the_process(
    fake: FakeModal, tmp_path: Path, exc: BaseException, retryable: bool
) -> None:
    async with open_modal(fake, tmp_path) as s:
        update = await s.pty_exec_start("echo ready; exec cat", tty=True, until="ready")
        pid = update.process_id
        assert pid is not None
        fake.fail("write", exc)
        with pytest.raises(sandbox.ProviderError) as info:
            await s.pty_write_stdin(pid, "lost\n")
        check_mapped(info.value, exc, retryable, sandbox.ProviderError)
        update = await s.pty_write_stdin(pid, "after\n", until="after", yield_time_s=20)
        assert "after" in update.output and update.process_id == pid


async def test_wait_error_in_a_one_shot_exec(fake: FakeModal, tmp_path: Path) -> None:
    marker = unique_seconds()
    async with open_modal(fake, tmp_path) as s:
        fake.fail("wait", mx.ServiceError("stream reset"), when=running(marker))
        with pytest.raises(sandbox.ProviderError) as info:
            await s.exec(f"sleep {marker}")
        assert info.value.retryable
        await no_leftovers(fake, marker)


async def test_wait_error_loses_the_process(fake: FakeModal, tmp_path: Path) -> None:
    marker = unique_seconds()
    async with open_modal(fake, tmp_path) as s:
        fake.fail("wait", mx.ServiceError("stream reset"), when=running(marker))
        update = await s.pty_exec_start(f"exec sleep {marker}", tty=True, yield_time_s=10)
        assert update.process_id is None and update.exit_code is None
        assert "process lost" in update.output and "ServiceError" in update.output
        await no_leftovers(fake, marker)


async def test_terminate_error_on_close(fake: FakeModal, tmp_path: Path) -> None:
    s = open_modal(fake, tmp_path)
    await s.start()
    fake.fail("terminate", mx.ServiceError("unavailable"))
    with pytest.raises(sandbox.ProviderError) as info:
        await s.aclose()
    assert info.value.retryable and "terminate" in str(info.value)
    assert s.state is sandbox.SessionState.CLOSED
    assert fake.open_clients() == [], "the client is closed even so"


async def test_paths_outside_the_workdir_are_refused_before_any_call(
    fake: FakeModal, tmp_path: Path
) -> None:
    async with open_modal(fake, tmp_path) as s:
        (tmp_path / "outside.txt").write_bytes(b"secret")
        stats = fake.block("stat")  # any call that reached the SDK would hang
        for path in ("../outside.txt", str(tmp_path / "outside.txt"), "/etc/hostname"):
            with pytest.raises(sandbox.WorkspacePathError, match="outside the workspace"):
                await s.read_file(path)
        with pytest.raises(sandbox.WorkspacePathError):
            await s.write_file("a/../../escape.txt", b"x")
        assert not stats.reached.is_set()
        assert not (tmp_path / "escape.txt").exists()
        stats.release()
        await s.write_file(str(tmp_path / "ws" / "a" / ".." / "in.txt"), b"inside")
        assert await s.read_file("in.txt") == b"inside"


async def test_file_errors(fake: FakeModal, tmp_path: Path) -> None:
    async with open_modal(fake, tmp_path) as s:
        with pytest.raises(sandbox.SandboxFileNotFoundError):
            await s.read_file("missing.txt")
        await s.write_file(str(tmp_path / "ws" / "abs.txt"), b"x")
        assert await s.read_file(str(tmp_path / "ws" / "abs.txt")) == b"x"
        for point in ("read_file", "stat"):  # a read asks stat first
            fake.fail(point, mx.ServiceError("unavailable"))
            with pytest.raises(sandbox.ProviderError) as info:
                await s.read_file(str(tmp_path / "ws" / "abs.txt"))
            assert info.value.retryable
        fake.fail("write_file", mx.PermissionDeniedError("read-only"))
        with pytest.raises(sandbox.ProviderError) as info:
            await s.write_file("x.txt", b"x")
        assert not info.value.retryable


async def test_after_the_sandbox_died_teardown_is_quiet(fake: FakeModal, tmp_path: Path) -> None:
    marker = unique_seconds()
    async with open_modal(fake, tmp_path) as s:
        update = await s.pty_exec_start(f"echo ready; exec sleep {marker}", until="ready")
        assert update.process_id is not None
        await fake.live_sandboxes()[0]._shutdown()  # terminated behind our back
        final = await s.pty_write_stdin(update.process_id, "", yield_time_s=10)
        assert final.process_id is None and final.exit_code == 137
        with pytest.raises(sandbox.ProviderError) as info:
            await s.exec("true")
        assert "Sandbox already finished" in str(info.value)
    await no_leftovers(fake, marker)


# ---- readers and waits that misbehave --------------------------------------------------------


@pytest.mark.parametrize("tty", [True, False], ids=["tty", "pipes"])
async def test_a_reader_that_dies(fake: FakeModal, tmp_path: Path, tty: bool) -> None:
    marker = unique_seconds()
    async with open_modal(fake, tmp_path) as s:
        before = other_tasks()
        fake.fail("read", mx.ConnectionError("stream reset"), when=running(marker))
        update = await s.pty_exec_start(f"echo hi; exec sleep {marker}", tty=tty, yield_time_s=10)
        assert update.process_id is None and update.exit_code is None
        assert "process lost: reading its output from Modal failed" in update.output
        assert "ConnectionError" in update.output
        await no_leftovers(fake, marker)
        assert other_tasks() <= before


async def test_a_reader_that_dies_in_a_one_shot_exec(fake: FakeModal, tmp_path: Path) -> None:
    marker = unique_seconds()
    async with open_modal(fake, tmp_path) as s:
        fake.fail("read", mx.ServiceError("stream reset"), when=running(marker))
        with pytest.raises(sandbox.ProviderError) as info:
            await s.exec(f"echo hi; sleep 0.2; echo {marker}")
        assert info.value.retryable and "output" in str(info.value)


async def test_a_wait_that_never_returns(fake: FakeModal, tmp_path: Path) -> None:
    marker = unique_seconds()
    async with open_modal(fake, tmp_path) as s:
        s.exit_status_timeout_s = 0.3
        before = other_tasks()
        gate = fake.block("wait", times=None, when=running(marker))  # never released
        deadlines = DeadlineCount(s)
        update = await s.pty_exec_start(f"echo {marker}", tty=True, yield_time_s=10)
        assert gate.reached.is_set()
        assert deadlines.count == 0, "the window waited for its deadline, not the wait's bound"
        deadlines.close()
        assert update.process_id is None and update.exit_code is None
        assert "did not report its exit status" in update.output
        # A running process whose wait hangs is still torn down promptly.
        update = await s.pty_exec_start(f"echo ready; exec sleep {marker}", until="ready")
        assert update.process_id is not None
        await s.pty_terminate(update.process_id)
        await no_leftovers(fake, marker)
        # A one-shot exec whose wait hangs ends at its timeout.
        with pytest.raises(sandbox.ExecTimeoutError):
            await s.exec(f"sleep {marker}", timeout=0.5)
        await no_leftovers(fake, marker)
        assert other_tasks() <= before


# ---- cancellation at each await point (when the fake signals it holds the call) ----------


async def cancel_when_reached(gate: modal_fake.Gate, coro: Any) -> BaseException | None:
    task = asyncio.ensure_future(coro)
    await gate.reached.wait()
    task.cancel()
    try:
        await task
    except BaseException as exc:  # the test inspects what came out
        return exc
    return None


@pytest.mark.parametrize("op", ["client", "app_lookup", "create", "create_response"])
async def test_cancel_during_start_leaves_nothing(fake: FakeModal, tmp_path: Path, op: str) -> None:
    gate = fake.block(op)
    s = open_modal(fake, tmp_path)
    before = other_tasks()
    outcome = await cancel_when_reached(gate, s.start())
    assert isinstance(outcome, asyncio.CancelledError)
    assert fake.live_sandboxes() == [] and fake.open_clients() == []
    assert s.state is sandbox.SessionState.NEW
    assert other_tasks() <= before
    if op == "create_response":
        assert len(fake.sandboxes) == 1, "created, then found by name and terminated"


@pytest.mark.parametrize("op", ["client", "app_lookup", "create", "create_response"])
async def test_a_start_call_that_never_answers_fails_within_its_deadline(
    fake: FakeModal, tmp_path: Path, op: str
) -> None:
    gate = fake.block(op)
    s = open_modal(fake, tmp_path, call_timeout_s=0.3, create_timeout_s=0.3)
    async with asyncio.timeout(30):  # the test's own guard: a hang fails here
        with pytest.raises(sandbox.ProviderError, match=r"did not answer within 0\.3s") as info:
            await s.start()
    assert info.value.retryable and gate.reached.is_set()
    gate.release()
    assert fake.live_sandboxes() == [] and fake.open_clients() == []


@pytest.mark.parametrize(("op", "tty"), [("exec", False), ("exec", True), ("write", False)])
async def test_a_process_start_that_never_answers_fails_within_its_deadline(
    fake: FakeModal, tmp_path: Path, op: str, tty: bool
) -> None:
    marker = unique_seconds()
    async with open_modal(fake, tmp_path, call_timeout_s=0.3) as s:
        gate = fake.block(op, when=running(marker))
        async with asyncio.timeout(30):
            with pytest.raises(sandbox.ProviderError, match=r"within 0\.3s") as info:
                await s.pty_exec_start(f"exec sleep {marker}", tty=tty)
        assert info.value.retryable
        gate.release()
        assert s.pty_processes() == []
        await no_leftovers(fake, marker)


@pytest.mark.parametrize("op", ["stat", "read_file", "write_file"])
async def test_a_file_call_that_never_answers_fails_within_its_deadline(
    fake: FakeModal, tmp_path: Path, op: str
) -> None:
    async with open_modal(fake, tmp_path, call_timeout_s=0.3) as s:
        await s.write_file("f.txt", b"data")
        gate = fake.block(op)
        async with asyncio.timeout(30):
            with pytest.raises(sandbox.ProviderError, match=r"within 0\.3s") as info:
                if op == "write_file":
                    await s.write_file("f.txt", b"more")
                else:
                    await s.read_file("f.txt")
        assert info.value.retryable
        gate.release()


async def test_cancel_during_attach(fake: FakeModal, tmp_path: Path) -> None:
    existing = await fake.Sandbox.create.aio(
        app=await fake.App.lookup.aio("a", create_if_missing=True)
    )
    gate = fake.block("from_id")
    s = open_modal(fake, tmp_path, sandbox_id=existing.object_id)
    outcome = await cancel_when_reached(gate, s.start())
    assert isinstance(outcome, asyncio.CancelledError)
    assert fake.open_clients() == []
    assert fake.live_sandboxes() == [existing], (
        "nobody else's sandbox is touched by a failed attach"
    )


@pytest.mark.parametrize("op", ["exec", "exec_response", "wait"])
async def test_cancel_one_shot_exec(fake: FakeModal, tmp_path: Path, op: str) -> None:
    marker = unique_seconds()
    async with open_modal(fake, tmp_path) as s:
        before = other_tasks()
        gate = fake.block(op, when=running(marker))
        outcome = await cancel_when_reached(gate, s.exec(f"sleep {marker}"))
        assert isinstance(outcome, asyncio.CancelledError)
        gate.release()
        await no_leftovers(fake, marker)
        assert other_tasks() <= before


@pytest.mark.parametrize(
    ("op", "tty"),
    [("exec", True), ("exec", False), ("exec_response", True), ("exec_response", False),
     ("write", False)],  # a terminal's stdin is not written at start: see test_cancel_write
)  # fmt: skip
async def test_cancel_process_start(fake: FakeModal, tmp_path: Path, op: str, tty: bool) -> None:
    marker = unique_seconds()
    async with open_modal(fake, tmp_path) as s:
        before = other_tasks()
        gate = fake.block(op, when=running(marker))
        outcome = await cancel_when_reached(gate, s.pty_exec_start(f"exec sleep {marker}", tty=tty))
        assert isinstance(outcome, asyncio.CancelledError)
        gate.release()
        assert s.pty_processes() == []
        await no_leftovers(fake, marker)
        assert other_tasks() <= before


async def test_cancel_write(fake: FakeModal, tmp_path: Path) -> None:
    async with open_modal(fake, tmp_path) as s:
        update = await s.pty_exec_start("echo ready; exec cat", tty=True, until="ready")
        pid = update.process_id
        assert pid is not None
        gate = fake.block("write")
        outcome = await cancel_when_reached(gate, s.pty_write_stdin(pid, "held\n"))
        assert isinstance(outcome, asyncio.CancelledError)
        gate.release()
        assert [i.process_id for i in s.pty_processes()] == [pid]
        update = await s.pty_write_stdin(pid, "next\n", until="next")
        assert update.process_id == pid


async def test_cancel_terminate_during_the_kill(fake: FakeModal, tmp_path: Path) -> None:
    marker = unique_seconds()
    async with open_modal(fake, tmp_path) as s:
        update = await s.pty_exec_start(f"echo ready; exec sleep {marker}", tty=True, until="ready")
        assert update.process_id is not None
        before = other_tasks()
        gate = fake.block("exec", when=is_control)
        task = asyncio.ensure_future(s.pty_terminate(update.process_id))
        await gate.reached.wait()
        task.cancel()
        await asyncio.sleep(0)
        gate.release()  # the settled teardown goes on despite the cancellation
        with pytest.raises(asyncio.CancelledError):
            await task
        assert s.pty_processes() == []
        await no_leftovers(fake, marker)
        assert other_tasks() <= before


async def test_cancel_close_during_sandbox_terminate(fake: FakeModal, tmp_path: Path) -> None:
    marker = unique_seconds()
    s = open_modal(fake, tmp_path)
    await s.start()
    await s.pty_exec_start(f"echo ready; exec sleep {marker}", until="ready")
    gate = fake.block("terminate")
    task = asyncio.ensure_future(s.aclose())
    await gate.reached.wait()
    task.cancel()
    await asyncio.sleep(0)
    assert fake.live_sandboxes() != [], "still held"
    gate.release()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert fake.live_sandboxes() == [] and fake.open_clients() == []
    assert s.state is sandbox.SessionState.CLOSED
    await no_leftovers(fake, marker)


async def test_a_process_starting_after_its_teardown_exits_at_once(
    fake: FakeModal, tmp_path: Path
) -> None:
    # The race a cancelled start leaves: the provider starts the command after the
    # teardown already ran. The teardown's marker makes the wrapper exit at once.
    marker = unique_seconds()
    async with open_modal(fake, tmp_path) as s:
        command = Command(s._commands, tty=False, keep=False, tag="0123456789abcdef01234567")
        await s._commands.control(command, "kill")  # no process yet: the marker is left
        spec = build_command(("sleep", marker), shell=False, env=None, cwd=None)
        process = await s._commands.start(spec, command, wrap=True)
        async with asyncio.timeout(10):
            assert await process.wait.aio() == 143
        assert await eventually(lambda: not host_pids_with_arg(marker), timeout=3)


# ---- quirks ----------------------------------------------------------------------------------


async def test_pipe_stdin_is_closed_at_start(fake: FakeModal, tmp_path: Path) -> None:
    marker = unique_seconds()
    async with open_modal(fake, tmp_path) as s:
        update = await s.pty_exec_start(f"cat; echo done {marker}", until="done")
        assert "done" in update.output
        process = fake_process(fake, marker)
        assert process.stdin._closed
        assert ("write", process.argv) in fake.calls
        assert process.exec_options["pty"] is False


async def test_exec_options(fake: FakeModal, tmp_path: Path) -> None:
    marker = unique_seconds()
    async with open_modal(fake, tmp_path, env={"BASE": "1"}) as s:
        await s.exec("mkdir -p sub")
        await s.exec(f"echo {marker}", timeout=2.5, cwd="sub", env={"X": "y"})
        options = fake_process(fake, marker).exec_options
        assert options["timeout"] == 5, "the server-side backstop: ceil(2.5) + 2"
        # A `cwd` is entered by the command check, from the session's workdir (Modal is
        # never handed a directory that may not exist).
        assert options["workdir"] == str(tmp_path / "ws")
        assert options["env"]["BASE"] == "1" and options["env"]["X"] == "y"
        assert TOKEN_ENV in options["env"]
        update = await s.pty_exec_start(f"echo {marker}-tty", tty=True)
        assert update.exit_code == 0
        tty_options = fake_process(fake, f"{marker}-tty").exec_options
        assert tty_options["pty"] is True and tty_options["timeout"] is None


async def test_terminate_escalates_to_sigkill(fake: FakeModal, tmp_path: Path) -> None:
    marker = unique_seconds()
    async with open_modal(fake, tmp_path) as s:
        update = await s.pty_exec_start(
            f"trap '' HUP TERM; echo ready; sleep {marker}; sleep {marker}", until="ready"
        )
        assert update.process_id is not None
        started = time.monotonic()
        await s.pty_terminate(update.process_id)
        assert time.monotonic() - started >= 0.25, "the grace before SIGKILL"
        await no_leftovers(fake, marker)


@pytest.mark.parametrize("tty", [True, False], ids=["tty", "pipes"])
async def test_terminate_kills_children_that_left_the_group(
    fake: FakeModal, tmp_path: Path, tty: bool
) -> None:
    marker = unique_seconds()
    async with open_modal(fake, tmp_path) as s:
        update = await s.pty_exec_start(
            f"setsid sleep {marker} >/dev/null 2>&1 & echo ready; exec sleep {marker}",
            tty=tty,
            until="ready",
        )
        assert update.process_id is not None
        assert await eventually(lambda: len(host_pids_with_arg(marker)) == 2)
        await s.pty_terminate(update.process_id)
        await no_leftovers(fake, marker)


@pytest.mark.parametrize("tty", [True, False], ids=["tty", "pipes"])
async def test_background_child_is_killed_when_the_leader_exits(
    fake: FakeModal, tmp_path: Path, tty: bool
) -> None:
    marker = unique_seconds()
    async with open_modal(fake, tmp_path) as s:
        # The child ignores SIGHUP: the terminal's hangup at the leader's exit is not
        # what kills it, the teardown of the finished process is.
        update = await s.pty_exec_start(
            f"(trap '' HUP; : >ignoring; exec sleep {marker}) >/dev/null 2>&1 & "
            "until [ -e ignoring ]; do sleep 0.01; done; echo bye",
            tty=tty,
        )
        assert update.process_id is None and update.exit_code == 0
        await no_leftovers(fake, marker)


async def test_one_shot_exec_with_a_child_holding_the_pipes(
    fake: FakeModal, tmp_path: Path
) -> None:
    marker = unique_seconds()
    async with open_modal(fake, tmp_path) as s:
        s.exit_output_grace_s = 0.3
        # The pipes' grace ends it (the bound only turns a wait for the sleep into a
        # failure).
        result = await asyncio.wait_for(s.exec(f"sleep {marker} & echo hi"), timeout=60)
        assert result == sandbox.ExecResult(stdout=b"hi\n", stderr=b"", exit_code=0)
        await no_leftovers(fake, marker)


async def test_one_shot_exec_leaves_a_detached_daemon(fake: FakeModal, tmp_path: Path) -> None:
    marker = unique_seconds()
    async with open_modal(fake, tmp_path) as s:
        result = await s.exec(f"sleep {marker} >/dev/null 2>&1 &")
        assert result.exit_code == 0
        # The shell has exited, but its background child may not have exec'd `sleep` yet.
        assert await eventually(lambda: bool(host_pids_with_arg(marker))), (
            "a daemon started by exec keeps running"
        )
    await no_leftovers(fake, marker)  # until the sandbox goes


async def test_attach_by_id_and_keep(fake: FakeModal, tmp_path: Path) -> None:
    s = open_modal(fake, tmp_path, keep=True, image="python:3.12-slim", app_name="my-app")
    async with s:
        sandbox_id = s.sandbox_id
        await s.write_file("kept.txt", "still here")
        gate = fake.block("exec_response")  # a start whose exec never answers leaves a marker
        outcome = await cancel_when_reached(gate, s.pty_exec_start("true"))
        assert isinstance(outcome, asyncio.CancelledError)
        assert list((tmp_path / "state").glob("*/*.kill"))
    (box,) = fake.live_sandboxes()
    assert box.object_id == sandbox_id and box.image.tag == "python:3.12-slim"
    assert not list((tmp_path / "state").glob("*/*")), "a kept sandbox keeps no markers"
    assert box._app is not None and box._app._name == "my-app"
    async with open_modal(fake, tmp_path, sandbox_id=sandbox_id) as again:
        assert await again.read_file("kept.txt") == b"still here"
        assert (await again.exec("echo attached")).stdout == b"attached\n"
    assert fake.live_sandboxes() == [], "an attached sandbox is terminated on close unless kept"


async def test_close_terminates_the_sandbox_not_each_process(
    fake: FakeModal, tmp_path: Path
) -> None:
    marker = unique_seconds()
    s = open_modal(fake, tmp_path)
    async with s:
        for tty in (True, False, True):
            await s.pty_exec_start(f"echo ready; exec sleep {marker}", tty=tty, until="ready")
        calls_before_close = len(fake.calls)
    closing_calls = fake.calls[calls_before_close:]
    assert not any(op == "exec" and is_control(argv) for op, argv in closing_calls)
    assert ("terminate", ()) in closing_calls
    await no_leftovers(fake, marker)


async def test_resize_is_unsupported(fake: FakeModal, tmp_path: Path) -> None:
    async with open_modal(fake, tmp_path) as s:
        update = await s.pty_exec_start("echo ready; exec cat", tty=True, until="ready")
        assert update.process_id is not None
        with pytest.raises(sandbox.UnsupportedOperationError):
            await s.pty_resize(update.process_id, rows=40, cols=100)


def test_exit_codes_are_normalised() -> None:
    assert [normalize_exit(c) for c in (0, 3, 130, 137, -9, -15)] == [0, 3, 130, 137, 137, 143]


# ---- provider fidelity: the terminal type ---------------------------------------------


@pytest.mark.parametrize("client_term", [None, "dumb"])
async def test_a_terminal_gets_term_whatever_the_client_has(
    fake: FakeModal, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, client_term: str | None
) -> None:
    # With pty=True the SDK copies TERM from the client process (modal._output.pty
    # .get_pty_info): a server without TERM would give the terminal none at all.
    if client_term is None:
        monkeypatch.delenv("TERM", raising=False)
    else:
        monkeypatch.setenv("TERM", client_term)
    async with open_modal(fake, tmp_path) as s:
        update = await s.pty_exec_start('echo "term=$TERM"', tty=True, yield_time_s=10)
        assert "term=xterm-256color" in update.output
        pipes = await s.exec('echo "term=${TERM-unset}"')
        assert pipes.stdout == f"term={client_term or 'unset'}\n".encode()
    async with open_modal(fake, tmp_path, term="vt100") as s:
        update = await s.pty_exec_start('echo "term=$TERM"', tty=True, yield_time_s=10)
        assert "term=vt100" in update.output
        update = await s.pty_exec_start(
            'echo "term=$TERM"', tty=True, yield_time_s=10, env={"TERM": "linux"}
        )
        assert "term=linux" in update.output
    with pytest.raises(sandbox.InvalidArgumentError):
        open_modal(fake, tmp_path, term="")


async def test_fake_copies_the_client_term_like_the_sdk(
    fake: FakeModal, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TERM", "screen")
    async with open_modal(fake, tmp_path, term="ignored-by-the-raw-sdk") as s:
        box = fake.live_sandboxes()[0]
        process = await box.exec.aio("sh", "-c", 'echo "t=$TERM"', pty=True, text=False)
        out = b"".join([chunk async for chunk in process.stdout])
        assert b"t=screen" in out
        assert s.sandbox_id is not None


# ---- side-by-side tasks: a branch that fails stops its siblings first ------------------


async def test_one_shot_reader_fails_while_the_wait_is_parked(
    fake: FakeModal, tmp_path: Path
) -> None:
    marker = unique_seconds()
    async with open_modal(fake, tmp_path) as s:
        before = other_tasks()
        fake.block("wait", times=None, when=running(marker))  # never released
        fake.fail("read", mx.ConnectionError("stream reset"), when=running(marker))
        with pytest.raises(sandbox.ConnectionLostError, match="output"):
            await s.exec(f"echo hi; exec sleep {marker}")
        # The parked wait and the stderr reader were cancelled and awaited: nothing of
        # this exec is still running, and its tree was killed.
        assert other_tasks() <= before
        await no_leftovers(fake, marker)


async def test_one_shot_wait_fails_while_a_reader_is_parked(
    fake: FakeModal, tmp_path: Path
) -> None:
    marker = unique_seconds()
    async with open_modal(fake, tmp_path) as s:
        before = other_tasks()
        gate = fake.block("read", times=None, when=running(marker))  # never released
        wait_gate = fake.block(
            "wait", when=running(marker), then_raise=mx.ServiceError("stream reset")
        )
        task = asyncio.ensure_future(s.exec(f"echo hi; exec sleep {marker}"))
        await gate.reached.wait()  # the stdout reader holds a chunk
        await wait_gate.reached.wait()
        wait_gate.release()  # now the wait fails, with the reader still parked
        with pytest.raises(sandbox.ProviderError) as info:
            await task
        assert info.value.retryable and "wait" in str(info.value)
        assert other_tasks() <= before
        await no_leftovers(fake, marker)


async def test_process_reader_fails_while_the_wait_and_other_reader_are_parked(
    fake: FakeModal, tmp_path: Path
) -> None:
    marker = unique_seconds()
    async with open_modal(fake, tmp_path) as s:
        before = other_tasks()
        gate = fake.block("wait", times=None, when=running(marker))  # never released
        fake.fail("read", mx.ConnectionError("stream reset"), when=running(marker))
        # Pipes: the stderr reader waits for output that never comes.
        update = await s.pty_exec_start(f"echo hi; exec sleep {marker}", yield_time_s=10)
        assert gate.reached.is_set()
        assert update.process_id is None and update.exit_code is None
        assert "reading its output from Modal failed" in update.output
        assert other_tasks() <= before
        await no_leftovers(fake, marker)


async def test_process_wait_fails_while_a_reader_is_parked(fake: FakeModal, tmp_path: Path) -> None:
    marker = unique_seconds()
    async with open_modal(fake, tmp_path) as s:
        before = other_tasks()
        gate = fake.block("read", times=None, when=running(marker))  # never released
        wait_gate = fake.block(
            "wait", when=running(marker), then_raise=mx.ServiceError("stream reset")
        )
        task = asyncio.ensure_future(
            s.pty_exec_start(f"echo hi; exec sleep {marker}", yield_time_s=10)
        )
        await gate.reached.wait()  # the stdout reader holds a chunk
        await wait_gate.reached.wait()
        wait_gate.release()  # now the wait fails, with the reader still parked
        update = await task
        assert update.process_id is None and update.exit_code is None
        assert "waiting for its exit failed" in update.output
        assert other_tasks() <= before
        await no_leftovers(fake, marker)
