"""e2b specifics: the SDK fake's drift check, the shell trap, error mapping, every fault,
cancellation at each SDK await point, and nothing left behind (processes, streams, tasks,
sandboxes)."""

from __future__ import annotations

import asyncio
import importlib
import logging
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("e2b")

from e2b import (
    AuthenticationException,
    InvalidArgumentException,
    NotFoundException,
    RateLimitException,
    SandboxException,
    SandboxNotFoundException,
    SandboxNotRunningException,
    SandboxUnreachableException,
    ServiceBusyException,
    TimeoutException,
)

import sandbox
from sandbox.backends.e2b import E2BSession
from sandbox.backends.e2b.processes import text_to_bytes
from sandbox.backends.e2b.scripts import interrupt_line, kill_line, pipe_line, tty_command
from sandbox.backends.toolkit import REDACTED, TAG_VARIABLE, normalize_exit
from sandbox.testing import procfs
from sandbox.testing.drift import surface_problems
from sandbox.testing.e2b_fake import FakeE2B, FakeProcess, fake_classes
from tests.helpers import eventually, host_pids_with_arg, unique_seconds

KEY = "e2b_test_key_0123456789abcdef"


@pytest.fixture
async def fake(tmp_path: Path) -> AsyncIterator[FakeE2B]:
    root = tmp_path / "fake-e2b"
    root.mkdir()
    async with FakeE2B(api_key=KEY, root=root) as service:
        yield service


def open_e2b(fake: FakeE2B, **options: Any) -> E2BSession:
    options.setdefault("api_key", KEY)
    options.setdefault("teardown_timeout_s", 2.0)
    session = sandbox.open_session("e2b", sandbox_class=fake.AsyncSandbox, **options)
    assert isinstance(session, E2BSession)
    return session


def stray_tasks() -> list[asyncio.Task[Any]]:
    me = asyncio.current_task()
    return [t for t in asyncio.all_tasks() if t is not me and not t.done()]


async def assert_clean(fake: FakeE2B) -> None:
    """No local process, event stream or task is left behind."""
    assert await eventually(lambda: fake.leftover_pids() == []), fake.leftover_pids()
    assert fake.open_streams() == []
    assert await eventually(lambda: stray_tasks() == [], timeout=2), stray_tasks()


def pids_of(fake: FakeE2B, *, tty: bool) -> list[FakeProcess]:
    return [p for p in fake.processes if p.tty is tty]


# ---- the fake cannot drift from the SDK -----------------------------------------------


@pytest.mark.parametrize(("fake_cls", "real_path"), list(fake_classes()))
def test_fake_surface_matches_the_installed_sdk(fake_cls: type, real_path: str) -> None:
    module, _, name = real_path.rpartition(".")
    real = getattr(importlib.import_module(module), name)
    assert surface_problems(fake_cls, real) == []


def test_drift_check_sees_through_instance_or_class_methods() -> None:
    import e2b

    from sandbox.testing.e2b_fake import FakeAsyncSandbox, _InstanceOrClassMethod

    class Drifted(FakeAsyncSandbox):
        @_InstanceOrClassMethod("_cls_kill")
        def kill(self, **opts: Any) -> bool:  # sync where the SDK is async
            return True

        @classmethod
        def _cls_kill(cls, sandbox_id: str, **opts: Any) -> bool:  # ditto, class form
            return True

        @classmethod
        async def _cls_connect_sandbox(cls, timeout: int | None = None) -> Any:  # no id
            return None

    problems = surface_problems(Drifted, e2b.AsyncSandbox)
    assert "Drifted.kill: sync in the fake, async in the SDK" in problems, problems
    assert "Drifted.kill (class form): sync in the fake, async in the SDK" in problems
    assert any(
        p.startswith("Drifted.connect (class form)") and "'sandbox_id'" in p for p in problems
    ), problems

    class PlainKill(FakeAsyncSandbox):
        async def kill(self, **opts: Any) -> bool:
            return True

    assert surface_problems(PlainKill, e2b.AsyncSandbox) == [
        "PlainKill.kill: an instance-or-class method only in the SDK"
    ]


def test_every_fake_class_is_checked() -> None:
    import sandbox.testing.e2b_fake as module

    checked = {cls for cls, _ in fake_classes()}
    fakes = {
        obj
        for name, obj in vars(module).items()
        if isinstance(obj, type) and name.startswith("Fake") and obj.__module__ == module.__name__
    }
    assert fakes - {module.FakeE2B, module.FakeProcess} == checked


# ---- lifecycle, credentials, secrets ------------------------------------------------------


async def test_missing_credentials_name_the_variable(
    fake: FakeE2B, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("E2B_API_KEY", raising=False)
    session = open_e2b(fake, api_key=None)
    with pytest.raises(sandbox.CredentialsMissingError) as info:
        await session.start()
    assert "E2B_API_KEY" in str(info.value)
    assert not info.value.retryable
    assert fake.calls == []
    await session.aclose()


async def test_key_from_the_environment(fake: FakeE2B, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("E2B_API_KEY", KEY)
    async with open_e2b(fake, api_key=None) as session:
        assert (await session.exec("echo ok")).stdout == b"ok\n"
    assert fake.live_sandbox_ids() == []


async def test_secret_never_in_messages_reprs_or_causes(fake: FakeE2B) -> None:
    fake.fail("create", SandboxException(f"upstream said: bad key {KEY}"))
    session = open_e2b(fake)
    with pytest.raises(sandbox.ProviderError) as info:
        await session.start()
    assert KEY not in str(info.value) and REDACTED in str(info.value)
    assert info.value.__cause__ is None
    assert KEY not in repr(session)
    async with session:
        assert KEY not in repr(session)
        fake.fail("stream", SandboxUnreachableException(f"dropped ({KEY})"))
        update = await session.pty_exec_start("exec sleep 30", tty=True, yield_time_s=5)
        assert "process lost" in update.output
        assert KEY not in update.output
    await assert_clean(fake)


async def test_wrong_key_is_not_retryable(fake: FakeE2B) -> None:
    session = open_e2b(fake, api_key="e2b_wrong_key")
    with pytest.raises(sandbox.ProviderError) as info:
        await session.start()
    assert not info.value.retryable
    assert "AuthenticationException" in str(info.value)
    assert fake.live_sandbox_ids() == []


async def test_options_are_validated(fake: FakeE2B) -> None:
    for bad in ({"teardown_timeout_s": 0}, {"start_timeout_s": -1}, {"process_timeout_s": -5}):
        with pytest.raises(sandbox.InvalidArgumentError):
            open_e2b(fake, **bad)
    with pytest.raises(sandbox.InvalidArgumentError):
        open_e2b(fake, no_such_option=1)


async def test_env_reaches_the_commands_of_a_created_sandbox(fake: FakeE2B) -> None:
    # The shared name `env` is E2B's `envs` at the create (the sandbox's environment).
    async with open_e2b(fake, env={"SANDBOX_GREETING": "hi"}) as session:
        result = await session.exec("echo $SANDBOX_GREETING")
        assert result.stdout == b"hi\n"
    with pytest.raises(sandbox.InvalidArgumentError, match="envs= is now env="):
        open_e2b(fake, envs={"A": "1"})


@pytest.mark.parametrize(
    ("option", "value"),
    [("memory_limit_bytes", 1 << 30), ("process_limit", 64), ("cpu_limit", 2.0)],
)
def test_resource_limits_are_unsupported_and_named(fake: FakeE2B, option: str, value: Any) -> None:
    with pytest.raises(sandbox.UnsupportedOperationError, match=option):
        open_e2b(fake, **{option: value})
    with pytest.raises(sandbox.InvalidArgumentError, match=option):
        open_e2b(fake, **{option: -1})
    assert fake.live_sandbox_ids() == []


async def test_keep_then_attach_then_delete(fake: FakeE2B) -> None:
    async with open_e2b(fake, keep=True) as first:
        await first.write_file("note.txt", b"kept")
        sandbox_id = first.sandbox_id
    assert sandbox_id is not None
    assert fake.live_sandbox_ids() == [sandbox_id]
    async with open_e2b(fake, sandbox_id=sandbox_id, keep=True) as again:
        assert await again.read_file("note.txt") == b"kept"
    assert fake.live_sandbox_ids() == [sandbox_id]
    async with open_e2b(fake, sandbox_id=sandbox_id) as last:
        assert last.sandbox_id == sandbox_id
    assert fake.live_sandbox_ids() == []
    with pytest.raises(sandbox.ProviderError) as info:
        await open_e2b(fake, sandbox_id=sandbox_id).start()
    assert not info.value.retryable  # SandboxNotFoundException


async def test_close_kills_the_sandbox_not_each_process(fake: FakeE2B) -> None:
    async with open_e2b(fake) as session:
        await session.pty_exec_start("echo r; exec sleep 30", tty=True, until="r")
        await session.pty_exec_start("echo r; exec sleep 30", until="r")
        before = len(fake.calls)
    after = fake.calls[before:]
    assert "kill" in after
    assert "pty.kill" not in after and "commands.kill" not in after
    await assert_clean(fake)


# ---- the shell trap and the wrappers ------------------------------------------------------


async def test_nothing_added_shows_in_terminal_output(fake: FakeE2B) -> None:
    async with open_e2b(fake) as session:
        update = await session.pty_exec_start("echo out; echo err >&2", tty=True)
        assert update.output == "out\r\nerr\r\n"
        assert update.exit_code == 0
        # The terminal really is an interactive login bash (the trap is exercised).
        assert pids_of(fake, tty=True)[0].argv == ["/bin/bash", "-i", "-l"]


# 3000 control characters: each is typed as a 4-byte octal escape, so a typed line would
# be far beyond the 4095 bytes a terminal in canonical mode keeps of one line.
LONG_CONTROLS = "".join(chr(1 + i % 31) for i in range(3000))


@pytest.mark.parametrize("how", ["tty", "pipes", "exec"])
async def test_a_command_too_long_for_one_argument_is_an_invalid_argument(
    fake: FakeE2B, how: str
) -> None:
    async with open_e2b(fake) as session:
        command = "echo " + "x" * 200_000
        with pytest.raises(sandbox.InvalidArgumentError, match="too long"):
            if how == "exec":
                await session.exec(command)
            else:
                await session.pty_exec_start(command, tty=how == "tty")
        assert session.pty_processes() == []
        # Just below the bound still runs.
        result = await session.exec("echo " + "y" * 100_000 + " | wc -c")
        assert result.stdout == b"100001\n"
    await assert_clean(fake)


async def test_a_long_line_of_control_characters_reaches_the_terminal_command(
    fake: FakeE2B,
) -> None:
    async with open_e2b(fake) as session:
        await session.exec("mkdir", "work", shell=False)
        script = 'printf %s "$1" > ../arg.out; printf %s "$V" > ../env.out; env > ../all.env'
        update = await session.pty_exec_start(
            "sh", "-c", script, "sh", LONG_CONTROLS,
            shell=False, tty=True, env={"V": LONG_CONTROLS}, cwd="work", yield_time_s=20,
        )  # fmt: skip
        assert update.exit_code == 0, update
        assert await session.read_file("arg.out") == LONG_CONTROLS.encode()
        assert await session.read_file("env.out") == LONG_CONTROLS.encode()
        # The line handed over in the terminal's environment is not the command's.
        assert b"SANDBOX_TRAP_LINE" not in await session.read_file("all.env")
    await assert_clean(fake)


@pytest.mark.parametrize("tty", [True, False], ids=["tty", "pipes"])
async def test_signal_deaths_report_128_plus_n(fake: FakeE2B, tty: bool) -> None:
    async with open_e2b(fake) as session:
        for sig, code in (("INT", 130), ("QUIT", 131), ("HUP", 129), ("USR1", 138)):
            update = await session.pty_exec_start(f"kill -{sig} $$", tty=tty)
            assert update.exit_code == code, (sig, update)
            assert update.output == ""


async def test_wrapper_killed_by_sigkill_reports_137(fake: FakeE2B) -> None:
    async with open_e2b(fake) as session:
        update = await session.pty_exec_start("echo r; exec sleep 30", tty=True, until="r")
        assert update.process_id is not None
        os.kill(pids_of(fake, tty=True)[-1].pid, signal.SIGKILL)  # E2B then reports -1
        final = await session.pty_write_stdin(update.process_id, "", yield_time_s=10)
        assert final.exit_code == 137


async def test_processes_get_a_long_lifetime(fake: FakeE2B) -> None:
    async with open_e2b(fake) as session:
        await session.pty_exec_start("true", tty=True)
        await session.pty_exec_start("true")
        lifetimes = {p.lifetime for p in fake.processes if p.argv[1] != "-l" or p.tty}
        assert all(life is not None and life >= 86_400 for life in lifetimes), lifetimes
    async with open_e2b(fake, process_timeout_s=0) as session:
        update = await session.pty_exec_start("echo r; exec sleep 30", tty=True, until="r")
        assert update.process_id is not None
        assert not fake.processes[-1].lifetime


async def test_short_stream_lifetime_is_a_lost_process(fake: FakeE2B) -> None:
    async with open_e2b(fake, process_timeout_s=0.5) as session:
        update = await session.pty_exec_start("echo r; exec sleep 30", tty=True, yield_time_s=5)
        assert "process lost" in update.output and "TimeoutException" in update.output
        assert update.process_id is None
    await assert_clean(fake)


async def test_pipes_keep_split_utf8_and_lose_only_invalid_bytes(fake: FakeE2B) -> None:
    async with open_e2b(fake) as session:
        update = await session.pty_exec_start(r"printf 'x\303'; sleep 0.2; printf '\251y'")
        assert update.output == "x\u00e9y"
        result = await session.exec(r"printf 'a\377b'")
        assert result.stdout == "a\ufffdb".encode()  # documented: not byte-exact on pipes


@pytest.mark.parametrize("tty", [False, True], ids=["pipes", "tty"])
async def test_terminate_reaches_a_child_that_left_the_group(fake: FakeE2B, tty: bool) -> None:
    # The kill script finds the tree by the tag in its environment (no pid file), so a
    # child in a session of its own (out of the job's group) is killed too.
    marker = unique_seconds()
    async with open_e2b(fake) as session:
        update = await session.pty_exec_start(
            f"setsid sleep {marker} & echo r; exec sleep {marker}", tty=tty, until="r"
        )
        assert update.process_id is not None
        assert await eventually(lambda: len(host_pids_with_arg(marker)) == 2)
        tagged = [
            pid
            for pid in host_pids_with_arg(marker)
            if any(i.startswith(TAG_VARIABLE.encode() + b"=") for i in procfs.environ(pid) or [])
        ]
        assert len(tagged) == 2
        await session.pty_terminate(update.process_id)
        assert await eventually(lambda: not host_pids_with_arg(marker))
    await assert_clean(fake)


async def test_pipe_interrupt_reaches_the_whole_group(fake: FakeE2B) -> None:
    marker = unique_seconds()
    async with open_e2b(fake) as session:
        # Both are in the job's process group; neither is a background job of `sh`.
        update = await session.pty_exec_start(
            f"sh -c 'sleep {marker}' | sleep {marker}; echo after", until=None, yield_time_s=0.5
        )
        assert update.process_id is not None
        assert await eventually(lambda: len(host_pids_with_arg(marker)) == 2)
        await session.pty_interrupt(update.process_id)
        final = await session.pty_write_stdin(update.process_id, "", yield_time_s=10)
        assert final.exit_code == 130
        assert await eventually(lambda: not host_pids_with_arg(marker))


def test_pure_helpers() -> None:
    # envd's -1 (killed, signal unnamed), its error text when it names one, a status.
    assert normalize_exit(-1) == 137 and normalize_exit(3) == 3
    assert normalize_exit(-1, "signal: terminated") == 143
    assert text_to_bytes("\u00e9") == b"\xc3\xa9"
    assert text_to_bytes(b"\xff".decode("utf-8", "surrogateescape")) == b"\xff"
    assert text_to_bytes("\ud800") == b"?"
    assert text_to_bytes(bytearray(b"x")) == b"x"
    tag = "a1b2c3d4e5f6a7b8"
    line = pipe_line(tag, "echo a b")
    assert "set -m" in line and "'echo a b'" in line and f"{TAG_VARIABLE}={tag}" in line
    # The terminal's environment carries the tag; the wrapper replaces the login shell.
    assert tty_command(tag, "true").startswith("exec sh -c ") and TAG_VARIABLE not in (
        tty_command(tag, "true")
    )
    assert kill_line([tag, "b" * 16]).endswith(f" term 0 {tag} {'b' * 16}")
    assert tag in interrupt_line(tag) and " int 0 " in interrupt_line(tag)


# ---- SDK exceptions and their retryable mapping ------------------------------------------------

ERRORS = [
    (RateLimitException("slow down"), sandbox.ProviderError, True),
    (ServiceBusyException("busy"), sandbox.ProviderError, True),
    (TimeoutException("deadline"), sandbox.ProviderError, True),
    (SandboxUnreachableException("dropped"), sandbox.ConnectionLostError, True),
    (SandboxException("bad gateway", status_code=502), sandbox.ProviderError, True),
    (SandboxNotRunningException("gone"), sandbox.ProviderError, False),
    (AuthenticationException("who are you"), sandbox.ProviderError, False),
    (InvalidArgumentException("bad"), sandbox.ProviderError, False),
    (NotFoundException("missing"), sandbox.ProviderError, False),
    (SandboxNotFoundException("no sandbox"), sandbox.ProviderError, False),
    (SandboxException("weird"), sandbox.ProviderError, False),
]


@pytest.mark.parametrize(("exc", "kind", "retryable"), ERRORS, ids=lambda v: type(v).__name__)
async def test_create_errors_map_with_retryable(
    fake: FakeE2B, exc: BaseException, kind: type, retryable: bool
) -> None:
    fake.fail("create", exc)
    session = open_e2b(fake)
    with pytest.raises(sandbox.SandboxError) as info:
        await session.start()
    assert type(info.value) is kind
    assert info.value.retryable is retryable
    assert type(exc).__name__ in str(info.value)
    assert fake.live_sandbox_ids() == []
    async with session:  # a failed start can be retried
        assert (await session.exec("echo again")).stdout == b"again\n"


@pytest.mark.parametrize(
    ("point", "call"),
    [
        ("connect", "attach"),
        ("commands.run", "exec"),
        ("commands.run", "start_pipes"),
        ("pty.create", "start_tty"),
        ("pty.send_stdin", "write"),
        ("pty.resize", "resize"),
        ("files.read", "read"),
        ("files.get_info", "read"),
        ("files.write", "write_file"),
    ],
)
@pytest.mark.parametrize(
    ("exc", "retryable"),
    [(RateLimitException("slow"), True), (InvalidArgumentException("bad"), False)],
    ids=["ratelimit", "invalid"],
)
async def test_errors_at_every_call_map_with_retryable(
    fake: FakeE2B, point: str, call: str, exc: BaseException, retryable: bool
) -> None:
    async with open_e2b(fake, keep=True) as owner:
        update = await owner.pty_exec_start("echo r; exec cat", tty=True, until="r")
        pid = update.process_id
        assert pid is not None
        await owner.write_file("present", b"p")  # reads get past the stat first
        fake.fail(point, exc)
        with pytest.raises(sandbox.ProviderError) as info:
            if call == "attach":
                await open_e2b(fake, sandbox_id=owner.sandbox_id).start()
            elif call == "exec":
                await owner.exec("true")
            elif call == "start_pipes":
                await owner.pty_exec_start("true")
            elif call == "start_tty":
                await owner.pty_exec_start("true", tty=True)
            elif call == "write":
                await owner.pty_write_stdin(pid, "x\n")
            elif call == "resize":
                await owner.pty_resize(pid, rows=10, cols=20)
            elif call == "read":
                await owner.read_file("present")
            else:
                await owner.write_file("f", b"x")
        assert info.value.retryable is retryable
        # The session and the process are still fine afterwards.
        again = await owner.pty_write_stdin(pid, "ok\n", until="ok\r\nok")
        assert again.process_id == pid
        assert owner.pty_processes()[0].process_id == pid
    async with open_e2b(fake, sandbox_id=owner.sandbox_id):
        pass
    await assert_clean(fake)


async def test_a_failed_spawn_stops_its_waiter(fake: FakeE2B) -> None:
    # A terminal's spawn runs two branches: the waiter (parked in `wait`) and the typing
    # of the line (failing): the failure must cancel and await the waiter.
    async with open_e2b(fake) as session:
        parked = fake.block("wait", where=lambda p: p is not None and p.tty)
        typing = fake.block("pty.send_stdin")
        fake.fail("pty.send_stdin", RateLimitException("slow down"))
        spawn = asyncio.ensure_future(session.pty_exec_start("exec sleep 30", tty=True))
        await parked.reached.wait()
        await typing.reached.wait()
        typing.release()
        with pytest.raises(sandbox.ProviderError) as info:
            await spawn
        assert info.value.retryable
        assert parked.waiting == 0  # the waiter left the gate: cancelled, not parked
        assert session.pty_processes() == []
        assert fake.open_streams() == []
        assert await eventually(lambda: fake.leftover_pids() == [])
    await assert_clean(fake)


@pytest.mark.parametrize(("exc", "kind", "retryable"), ERRORS, ids=lambda v: type(v).__name__)
async def test_every_error_kind_at_wait(
    fake: FakeE2B, exc: BaseException, kind: type, retryable: bool
) -> None:
    marker = unique_seconds()
    async with open_e2b(fake) as session:
        fake.fail("wait", exc, where=lambda p: p is not None and marker in p.argv[-1])
        with pytest.raises(sandbox.SandboxError) as info:
            await session.exec(f"sleep {marker}")
        assert type(info.value) is kind
        assert info.value.retryable is retryable
        assert await eventually(lambda: not host_pids_with_arg(marker))  # killed, not left
    await assert_clean(fake)


@pytest.mark.parametrize(("exc", "kind", "retryable"), ERRORS, ids=lambda v: type(v).__name__)
async def test_every_error_kind_at_sandbox_kill(
    fake: FakeE2B, exc: BaseException, kind: type, retryable: bool
) -> None:
    session = open_e2b(fake)
    await session.start()
    fake.fail("kill", exc)
    if isinstance(exc, SandboxNotRunningException | NotFoundException):
        await session.aclose()  # already gone: that is what closing wanted
    else:
        with pytest.raises(sandbox.SandboxError) as info:
            await session.aclose()
        assert type(info.value) is kind
        assert info.value.retryable is retryable
    assert session.state is sandbox.SessionState.CLOSED


async def test_paths_outside_the_home_are_refused_before_any_call(fake: FakeE2B) -> None:
    async with open_e2b(fake) as session:
        home = Path(fake.sandbox_home(session.sandbox_id or ""))
        (home.parent / "outside.txt").write_bytes(b"secret")
        reads = fake.block("files.read")  # any read that reached the SDK would hang
        for path in ("../outside.txt", str(home.parent / "outside.txt"), "/etc/hostname"):
            with pytest.raises(sandbox.WorkspacePathError, match="outside the workspace"):
                await session.read_file(path)
        with pytest.raises(sandbox.WorkspacePathError):
            await session.write_file("a/../../escape.txt", b"x")
        assert not reads.reached.is_set()
        assert not (home.parent / "escape.txt").exists()
        reads.release()
        await session.write_file(str(home / "a" / ".." / "in.txt"), b"inside")
        assert await session.read_file("in.txt") == b"inside"
    await assert_clean(fake)


async def test_missing_file_is_file_not_found(fake: FakeE2B) -> None:
    async with open_e2b(fake) as session:
        with pytest.raises(sandbox.SandboxFileNotFoundError):
            await session.read_file("no/such/file")


async def test_kill_errors_are_reported_but_the_tree_still_dies(fake: FakeE2B) -> None:
    marker = unique_seconds()
    async with open_e2b(fake) as session:
        update = await session.pty_exec_start(f"echo r; exec sleep {marker}", tty=True, until="r")
        assert update.process_id is not None
        fake.fail("pty.kill", RateLimitException("slow down"))
        with pytest.raises(sandbox.ProviderError) as info:
            await session.pty_terminate(update.process_id)
        assert info.value.retryable
        assert session.pty_processes() == []
        assert await eventually(lambda: not host_pids_with_arg(marker))
    await assert_clean(fake)


async def test_sandbox_kill_error_on_close(fake: FakeE2B) -> None:
    session = open_e2b(fake)
    await session.start()
    fake.fail("kill", ServiceBusyException("busy"))
    with pytest.raises(sandbox.ProviderError) as info:
        await session.aclose()
    assert info.value.retryable
    assert session.state is sandbox.SessionState.CLOSED


# ---- a create whose answer is lost, or that never returns ------------------------------------


async def test_create_that_fails_after_creating_is_found_and_deleted(fake: FakeE2B) -> None:
    fake.fail("create", TimeoutException("request timed out"), after=True)
    session = open_e2b(fake)
    with pytest.raises(sandbox.ProviderError) as info:
        await session.start()
    assert info.value.retryable
    assert "list" in fake.calls and fake.calls.count("kill") == 1
    assert fake.live_sandbox_ids() == []


async def test_refused_create_is_not_searched_for(fake: FakeE2B) -> None:
    fake.fail("create", RateLimitException("slow down"))
    with pytest.raises(sandbox.ProviderError):
        await open_e2b(fake).start()
    assert "list" not in fake.calls


@pytest.mark.parametrize("after", [False, True], ids=["before-creating", "after-creating"])
async def test_create_that_never_returns(fake: FakeE2B, after: bool) -> None:
    fake.block("create", after=after)  # never released
    session = open_e2b(fake, start_timeout_s=0.3)
    with pytest.raises(sandbox.ProviderError) as info:
        await session.start()
    assert info.value.retryable
    assert fake.live_sandbox_ids() == []
    await assert_clean(fake)


# ---- cancellation at each SDK await point ----------------------------------------------


@pytest.mark.parametrize("after", [False, True], ids=["before-creating", "after-creating"])
async def test_cancel_during_create_leaves_nothing(fake: FakeE2B, after: bool) -> None:
    gate = fake.block("create", after=after)
    session = open_e2b(fake)
    task = asyncio.ensure_future(session.start())
    await gate.reached.wait()
    task.cancel()
    await asyncio.sleep(0)
    assert not task.done(), "the cleanup waits for the create it owns"
    gate.release()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert fake.live_sandbox_ids() == []
    assert session.state is sandbox.SessionState.NEW
    await assert_clean(fake)


async def test_cancel_during_connect_leaves_the_sandbox_alone(fake: FakeE2B) -> None:
    async with open_e2b(fake, keep=True) as owner:
        sandbox_id = owner.sandbox_id
    gate = fake.block("connect")
    session = open_e2b(fake, sandbox_id=sandbox_id)
    task = asyncio.ensure_future(session.start())
    await gate.reached.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    gate.release()
    assert fake.live_sandbox_ids() == [sandbox_id]  # never ours: not deleted
    await assert_clean(fake)
    async with session:
        assert (await session.exec("echo attached")).ok
    assert fake.live_sandbox_ids() == []


@pytest.mark.parametrize("tty", [True, False], ids=["tty", "pipes"])
@pytest.mark.parametrize("after", [False, True], ids=["before-starting", "after-starting"])
async def test_cancel_during_process_create(fake: FakeE2B, tty: bool, after: bool) -> None:
    marker = unique_seconds()
    point = "pty.create" if tty else "commands.run"
    async with open_e2b(fake) as session:
        gate = fake.block(point, after=after)
        task = asyncio.ensure_future(session.pty_exec_start(f"exec sleep {marker}", tty=tty))
        await gate.reached.wait()
        task.cancel()
        await asyncio.sleep(0)
        gate.release()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert session.pty_processes() == []
        assert await eventually(lambda: not host_pids_with_arg(marker))
        started = [p for p in fake.processes if p.tty is tty]
        # The marker is gone, but the rest of each session may still be dying.
        assert await eventually(lambda: all(p.session_pids() == [] for p in started))
        assert session._core.processes.reserved == set()
    await assert_clean(fake)


async def test_cancel_during_the_typed_line(fake: FakeE2B) -> None:
    async with open_e2b(fake) as session:
        gate = fake.block("pty.send_stdin")
        task = asyncio.ensure_future(session.pty_exec_start("exec sleep 30", tty=True))
        await gate.reached.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        gate.release()
        assert session.pty_processes() == []
        assert await eventually(lambda: all(p.session_pids() == [] for p in fake.processes))
    await assert_clean(fake)


async def test_cancel_during_send_keeps_the_process(fake: FakeE2B) -> None:
    async with open_e2b(fake) as session:
        update = await session.pty_exec_start("echo r; exec cat", tty=True, until="r")
        pid = update.process_id
        assert pid is not None
        gate = fake.block("pty.send_stdin")
        task = asyncio.ensure_future(session.pty_write_stdin(pid, "lost\n"))
        await gate.reached.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        gate.release()
        assert [i.process_id for i in session.pty_processes()] == [pid]
        again = await session.pty_write_stdin(pid, "next\n", until="next\r\nnext")
        assert again.process_id == pid and "lost" not in again.output
    await assert_clean(fake)


async def test_cancel_during_wait_of_a_one_shot_command(fake: FakeE2B) -> None:
    marker = unique_seconds()
    async with open_e2b(fake) as session:
        gate = fake.block("wait", where=lambda p: p is not None and marker in p.argv[-1])
        task = asyncio.ensure_future(session.exec(f"sleep {marker}"))
        await gate.reached.wait()
        assert await eventually(lambda: bool(host_pids_with_arg(marker)))
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert await eventually(lambda: not host_pids_with_arg(marker))
        assert (await session.exec("echo alive")).ok
    await assert_clean(fake)


@pytest.mark.parametrize("tty", [True, False], ids=["tty", "pipes"])
async def test_wait_that_never_returns(fake: FakeE2B, tty: bool) -> None:
    marker = unique_seconds()
    async with open_e2b(fake) as session:
        # Only this test's process (not the control commands the teardown runs).
        fake.block("wait", where=lambda p: p is not None and (p.tty or marker in p.argv[-1]))
        update = await session.pty_exec_start(
            f"echo r; sleep {marker}; exit 4", tty=tty, until="r", yield_time_s=2
        )
        pid = update.process_id
        assert pid is not None
        await session.pty_terminate(pid)  # returns although the waiter never would
        assert session.pty_processes() == []
        assert await eventually(lambda: not host_pids_with_arg(marker))
        # A one-shot command whose wait never returns still times out and dies.
        if not tty:
            with pytest.raises(sandbox.ExecTimeoutError):
                await session.exec(f"sleep {marker}", timeout=0.5)
            assert await eventually(lambda: not host_pids_with_arg(marker))
    fake.release_all()
    await assert_clean(fake)


@pytest.mark.parametrize("tty", [True, False], ids=["tty", "pipes"])
async def test_cancel_during_kill_still_kills(fake: FakeE2B, tty: bool) -> None:
    marker = unique_seconds()
    point = "pty.kill" if tty else "commands.kill"
    async with open_e2b(fake) as session:
        # The background child ignores SIGHUP: only a kill of the whole group ends it.
        update = await session.pty_exec_start(
            f"nohup sleep {marker} >/dev/null 2>&1 & echo r; sleep {marker}; wait",
            tty=tty,
            until="r",
        )
        pid = update.process_id
        assert pid is not None
        assert await eventually(lambda: len(host_pids_with_arg(marker)) == 2)
        gate = fake.block(point)
        task = asyncio.ensure_future(session.pty_terminate(pid))
        await gate.reached.wait()
        task.cancel()
        await asyncio.sleep(0)
        assert not task.done(), "the teardown is settled: it outlives the cancellation"
        gate.release()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert session.pty_processes() == []
        assert await eventually(lambda: not host_pids_with_arg(marker))
        assert session._core.processes.reserved == set()
    await assert_clean(fake)


@pytest.mark.parametrize(
    "point", ["files.get_info", "files.read", "files.write", "pty.send_stdin", "pty.resize"]
)
async def test_a_call_that_never_answers_fails_within_its_deadline(
    fake: FakeE2B, point: str
) -> None:
    async with open_e2b(fake, call_timeout_s=0.3) as session:
        await session.write_file("f.txt", b"data")
        update = await session.pty_exec_start("cat", tty=True, yield_time_s=0.2)
        assert update.process_id is not None
        gate = fake.block(point)
        async with asyncio.timeout(30):  # the test's own guard: a hang fails here
            with pytest.raises(sandbox.ProviderError, match="did not answer") as info:
                if point.startswith("files."):
                    if point == "files.write":
                        await session.write_file("f.txt", b"more")
                    else:
                        await session.read_file("f.txt")
                elif point == "pty.send_stdin":  # the typed line of a new terminal
                    await session.pty_exec_start("true", tty=True, yield_time_s=5)
                else:
                    await session.pty_resize(update.process_id, rows=30, cols=90)
        assert info.value.retryable
        assert gate.reached.is_set()
        gate.release()
    await assert_clean(fake)


async def test_a_file_that_grew_after_its_stat_is_read_within_the_limit(fake: FakeE2B) -> None:
    import tracemalloc

    limit = 1 << 20
    async with open_e2b(fake, read_limit_bytes=limit) as session:
        await session.write_file("grows.bin", b"small")
        gate = fake.block("files.read")
        read = asyncio.ensure_future(session.read_file("grows.bin"))
        await gate.reached.wait()  # stat said 5 bytes; now the file grows to 32 MiB
        path = Path(fake.sandbox_home(session.sandbox_id or "")) / "grows.bin"
        with path.open("ab") as handle:
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
        # What the client kept stays near the limit, not the 32 MiB the server had.
        assert peak < limit + (4 << 20), peak
    await assert_clean(fake)


async def test_kill_that_never_returns_is_bounded(fake: FakeE2B) -> None:
    marker = unique_seconds()
    async with open_e2b(fake, teardown_timeout_s=0.3) as session:
        update = await session.pty_exec_start(f"echo r; exec sleep {marker}", tty=True, until="r")
        assert update.process_id is not None
        fake.block("pty.kill")  # never released
        with pytest.raises(sandbox.ProviderError) as info:
            await session.pty_terminate(update.process_id)
        assert info.value.retryable
        assert await eventually(lambda: not host_pids_with_arg(marker))  # the group kill ran
    await assert_clean(fake)


async def test_cancel_during_sandbox_kill_on_close(fake: FakeE2B) -> None:
    marker = unique_seconds()
    session = open_e2b(fake)
    await session.start()
    await session.pty_exec_start(f"echo r; exec sleep {marker}", tty=True, until="r")
    gate = fake.block("kill")
    task = asyncio.ensure_future(session.aclose())
    await gate.reached.wait()
    task.cancel()
    await asyncio.sleep(0)
    gate.release()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert session.state is sandbox.SessionState.CLOSED
    assert fake.live_sandbox_ids() == []
    assert await eventually(lambda: not host_pids_with_arg(marker))
    await assert_clean(fake)


# ---- a reader that dies --------------------------------------------------------------------


@pytest.mark.parametrize("tty", [True, False], ids=["tty", "pipes"])
async def test_reader_that_dies_reports_lost_and_kills(fake: FakeE2B, tty: bool) -> None:
    marker = unique_seconds()
    async with open_e2b(fake) as session:
        update = await session.pty_exec_start(f"echo r; exec sleep {marker}", tty=tty, until="r")
        pid = update.process_id
        assert pid is not None
        fake.processes[-1].break_stream(SandboxUnreachableException("connection reset"))
        final = await session.pty_write_stdin(pid, "", yield_time_s=10)
        assert final.process_id is None and final.exit_code is None
        assert "process lost" in final.output and "SandboxUnreachableException" in final.output
        # The process was still running in the sandbox: collecting the entry killed it.
        assert await eventually(lambda: not host_pids_with_arg(marker))
    await assert_clean(fake)


async def test_stream_that_dies_at_start(fake: FakeE2B) -> None:
    async with open_e2b(fake) as session:
        fake.fail("stream", SandboxUnreachableException("gone at once"))
        update = await session.pty_exec_start("echo hi", yield_time_s=5)
        assert update.process_id is None and update.exit_code is None
        assert "process lost" in update.output
        assert (await session.exec("echo fine")).stdout == b"fine\n"
    await assert_clean(fake)


async def test_sandbox_killed_underneath(fake: FakeE2B) -> None:
    async with open_e2b(fake, keep=True) as session:
        update = await session.pty_exec_start("echo r; exec sleep 30", tty=True, until="r")
        assert update.process_id is not None
        assert session.sandbox_id is not None
        await fake.AsyncSandbox.kill(session.sandbox_id, api_key=KEY)
        final = await session.pty_write_stdin(update.process_id, "", yield_time_s=10)
        assert "SandboxNotRunningException" in final.output
        with pytest.raises(sandbox.ProviderError) as info:
            await session.exec("true")
        assert not info.value.retryable
    await assert_clean(fake)


async def test_a_prune_victims_failed_teardown_does_not_fail_the_start(
    fake: FakeE2B, caplog: pytest.LogCaptureFixture
) -> None:
    marker = unique_seconds()
    async with open_e2b(fake, max_processes=9) as s:
        for _ in range(9):
            await s.pty_exec_start(f"echo r; exec sleep {marker}", until="r")
        oldest = s.pty_processes()[0].process_id
        fake.fail("commands.kill", SandboxException("kill refused by envd"), times=5)
        with caplog.at_level(logging.WARNING, logger="sandbox"):
            update = await s.pty_exec_start("echo tenth", until="tenth")
        assert "tenth" in update.output
        assert oldest not in {p.process_id for p in s.pty_processes()}
        assert any("teardown failed" in r.getMessage() for r in caplog.records)
    await assert_clean(fake)


async def test_close_reports_every_failed_teardown_together(fake: FakeE2B) -> None:
    s = open_e2b(fake, keep=True)  # kept: close kills each process itself
    await s.start()
    for _ in range(2):
        await s.pty_exec_start("echo r; exec cat", tty=True, until="r")
    fake.fail("pty.kill", SandboxException("kill refused by envd"), times=2)
    with pytest.raises(sandbox.CleanupError) as info:
        await s.aclose()
    assert len(info.value.errors) == 2
    assert s.state is sandbox.SessionState.CLOSED
    await fake.aclose()


# ---- provider fidelity: what the SDK does that the backend must account for ------------


async def test_background_commands_do_not_keep_their_output_in_the_sdk(fake: FakeE2B) -> None:
    # The SDK keeps every character a command printed in its handle unless the command
    # was started with `retain_output=False`; a long-running process would grow forever.
    async with open_e2b(fake) as session:
        update = await session.pty_exec_start(
            "head -c 200000 /dev/zero | tr '\\0' a; echo done; exec sleep 30", until="done"
        )
        assert update.process_id is not None
        assert "done" in update.output
        assert fake.retained_output_chars() == 0
        result = await session.exec("head -c 100000 /dev/zero | tr '\\0' b; echo e >&2")
        assert len(result.stdout) == 100000 and result.stderr == b"e\n"
        assert fake.retained_output_chars() == 0
    await assert_clean(fake)


async def test_fake_retains_output_like_the_sdk_unless_told_not_to(fake: FakeE2B) -> None:
    sdk_sandbox = await fake.AsyncSandbox.create(api_key=KEY)
    kept = await sdk_sandbox.commands.run("printf abc")
    assert kept.stdout == "abc"
    dropped = await sdk_sandbox.commands.run("printf abc", retain_output=False)
    assert dropped.stdout is None and dropped.stderr is None and dropped.exit_code == 0
    await sdk_sandbox.kill(api_key=KEY)


async def test_a_create_retried_by_the_sdk_makes_one_sandbox(fake: FakeE2B) -> None:
    # The SDK's transport retries a create answered by a gateway error; without an
    # idempotency key the first sandbox would live on, owned by nobody.
    fake.retry_creates(2)
    async with open_e2b(fake) as session:
        assert fake.live_sandbox_ids() == [session.sandbox_id]
        assert (await session.exec("echo one")).stdout == b"one\n"
    assert fake.live_sandbox_ids() == []
    assert len(fake.created) == 1


async def test_fake_duplicates_retried_creates_without_an_idempotency_key(fake: FakeE2B) -> None:
    fake.retry_creates(1)
    first = await fake.AsyncSandbox.create(api_key=KEY, metadata={"t": "1"})
    assert len(fake.live_sandbox_ids()) == 2  # what the SDK's retry does to a bare create
    await fake.AsyncSandbox.kill(fake.created[0], api_key=KEY)
    await first.kill(api_key=KEY)
    with pytest.raises(InvalidArgumentException):
        await fake.AsyncSandbox.create(api_key=KEY, idempotency_key="Not Valid")


def _transport_failure(code: Any, cause: BaseException | None) -> BaseException:
    from connectrpc.errors import ConnectError

    error = ConnectError(code, "the connection to the sandbox was reset")
    error.__cause__ = cause
    return error


@pytest.mark.parametrize(
    ("case", "kind", "retryable"),
    [
        ("read-error", sandbox.ConnectionLostError, True),
        ("reset", sandbox.ConnectionLostError, True),
        ("unavailable", sandbox.ConnectionLostError, True),
        ("deadline", sandbox.ProviderError, True),
        ("internal", sandbox.ProviderError, False),
        ("httpx-read", sandbox.ConnectionLostError, True),
    ],
)
@pytest.mark.parametrize("point", ["commands.run", "pty.send_stdin", "files.get_info"])
async def test_envd_transport_failures_are_classified(
    fake: FakeE2B, case: str, kind: type, retryable: bool, point: str
) -> None:
    import httpx
    from connectrpc.code import Code
    from pyqwest import ReadError

    exc = {
        "read-error": lambda: _transport_failure(Code.UNKNOWN, ReadError("stream closed")),
        "reset": lambda: _transport_failure(Code.UNKNOWN, ConnectionResetError(104, "reset")),
        "unavailable": lambda: _transport_failure(Code.UNAVAILABLE, None),
        "deadline": lambda: _transport_failure(Code.DEADLINE_EXCEEDED, TimeoutError()),
        "internal": lambda: _transport_failure(Code.INTERNAL, None),
        "httpx-read": lambda: httpx.ReadError("connection reset"),
    }[case]()
    async with open_e2b(fake) as session:
        update = await session.pty_exec_start("echo r; exec cat", tty=True, until="r")
        assert update.process_id is not None
        fake.fail(point, exc)
        with pytest.raises(sandbox.SandboxError) as info:
            if point == "commands.run":
                await session.exec("true")
            elif point == "pty.send_stdin":
                await session.pty_write_stdin(update.process_id, "x\n")
            else:
                await session.read_file("anything")
        assert type(info.value) is kind, info.value
        assert info.value.retryable is retryable
    await assert_clean(fake)


def test_drift_check_catches_order_defaults_returns_and_overloads() -> None:
    from e2b.sandbox_async.commands.pty import Pty
    from e2b.sandbox_async.filesystem.filesystem import Filesystem

    from sandbox.testing.e2b_fake import FakeFilesystem, FakePty

    class WrongOrder(FakePty):
        async def send_stdin(  # type: ignore[override]
            self, data: bytes, pid: int, request_timeout: float | None = None
        ) -> None: ...

    class WrongDefault(FakePty):
        async def kill(self, pid: int, request_timeout: float | None = 5) -> bool:  # type: ignore[override]
            return True

    class WrongReturn(FakePty):
        async def kill(self, pid: int, request_timeout: float | None = None) -> int:  # type: ignore[override]
            return 1

    class RequiredHere(FakePty):
        async def kill(self, pid: int, request_timeout: float | None) -> bool:  # type: ignore[override]
            return True

    class NoOverloads(FakeFilesystem):
        async def read(self, path: str, format: str = "text") -> Any:  # type: ignore[override]
            return ""

    assert any(
        "'data' is positional parameter 1 in the fake, 2 in the SDK" in p
        for p in surface_problems(WrongOrder, Pty)
    ), surface_problems(WrongOrder, Pty)
    assert (
        "WrongDefault.kill: parameter 'request_timeout' defaults to 5 in the fake, None in the SDK"
        in surface_problems(WrongDefault, Pty)
    )
    assert "WrongReturn.kill: returns int in the fake, bool in the SDK" in surface_problems(
        WrongReturn, Pty
    )
    assert (
        "RequiredHere.kill: parameter 'request_timeout' is required only in the fake"
        in surface_problems(RequiredHere, Pty)
    )
    assert "NoOverloads.read: 0 overloads in the fake, 3 in the SDK" in surface_problems(
        NoOverloads, Filesystem
    )
