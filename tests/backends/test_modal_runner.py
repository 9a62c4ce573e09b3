"""The `modal` backend with the runner (docs/runner.md), through the SDK fake: the runner
really runs in the fake sandbox (a local process in the sandbox's own runner folder),
put there by an exec's stdin and reached by an exec of `connect --start` whose binary
stdin and stdout carry its frames.

Delivery by content hash (a second client finds the file and the running runner),
detach and resume (every process reattached under its id, with what it printed
meanwhile), an open stdin ended by `pty_close_stdin` (also across a detach), whole-tree
kills, and the per-exec path where this install has no runner for the sandbox's
machine (`runner=None`) or a refusal (`runner=True`).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import stat
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from modal import exception as mx

import sandbox
from sandbox.backends.modal import ModalSession
from sandbox.runner import runner_binary
from sandbox.testing.modal_fake import FakeModal
from tests.helpers import (
    describe_pids,
    eventually,
    host_pids_with_arg,
    require_runner,
    runner_pid,
    unique_seconds,
)

TOKEN = {"token_id": "ak-modal-runner-id", "token_secret": "as-modal-runner-secret"}
UPLOAD = "sandbox-runner-upload"
CONNECT = "connect"


@pytest.fixture(autouse=True)
def _runner_built() -> None:
    require_runner("modal runner")


@pytest.fixture
async def fake() -> AsyncIterator[FakeModal]:
    f = FakeModal()
    yield f
    await f.aclose()
    # Terminating the sandbox ends the runner and everything it kept.
    assert await eventually(lambda: f.leftover_pids() == [], timeout=15), describe_pids(
        f.leftover_pids()
    )


def open_modal(fake: FakeModal, tmp_path: Path, **options: Any) -> ModalSession:
    options.setdefault("terminate_grace_s", 0.3)
    options.setdefault("state_dir", str(tmp_path / "state"))
    options.setdefault("runner", True)
    s = sandbox.open_session("modal", sdk=fake, workdir=str(tmp_path / "ws"), **TOKEN, **options)
    assert isinstance(s, ModalSession)
    return s


def resume(fake: FakeModal, tmp_path: Path, ref: sandbox.SessionRef) -> ModalSession:
    s = sandbox.resume_session(ref, sdk=fake, state_dir=str(tmp_path / "state"), **TOKEN)
    assert isinstance(s, ModalSession)
    return s


def execs(fake: FakeModal, word: str) -> int:
    """How many execs had `word` among their arguments."""
    return sum(1 for op, argv in fake.calls if op == "exec" and word in argv)


async def test_a_second_client_finds_the_delivered_runner_by_its_hash(
    fake: FakeModal, tmp_path: Path
) -> None:
    async with open_modal(fake, tmp_path, keep=True) as first:
        assert first.keeps_processes is True
        assert (await first.exec("echo", "one")).stdout == b"one\n"
        pid = runner_pid(first)
        sandbox_id = first.sandbox_id
    assert execs(fake, UPLOAD) == 1 and execs(fake, CONNECT) == 1
    [box] = fake.live_sandboxes()  # kept: the runner lives on in it
    binary = runner_binary()
    assert binary is not None and box._runner_dir is not None
    path = Path(box._runner_dir) / f".sandbox-runner-{binary.sha256[:16]}"
    assert hashlib.sha256(path.read_bytes()).hexdigest() == binary.sha256
    assert stat.S_IMODE(path.stat().st_mode) == 0o755

    # The same bytes are there: no upload; the running runner answers the new link.
    async with open_modal(fake, tmp_path, sandbox_id=sandbox_id, keep=True) as second:
        assert runner_pid(second) == pid
        assert (await second.exec("echo", "two")).stdout == b"two\n"
    assert execs(fake, UPLOAD) == 1 and execs(fake, CONNECT) == 2

    # Other bytes at the runner's name are replaced (the running runner is still found).
    # (A running binary's file cannot be written: it is replaced, as a rename does.)
    other = path.with_name("impostor")
    other.write_bytes(b"#!/bin/sh\necho impostor\n")
    other.replace(path)
    async with open_modal(fake, tmp_path, sandbox_id=sandbox_id) as third:
        assert runner_pid(third) == pid
        assert (await third.exec("echo", "three")).stdout == b"three\n"
        assert hashlib.sha256(path.read_bytes()).hexdigest() == binary.sha256
    assert execs(fake, UPLOAD) == 2
    assert fake.live_sandboxes() == []  # the last one did not keep it


async def test_detach_and_resume_replay_what_each_process_printed_meanwhile(
    fake: FakeModal, tmp_path: Path
) -> None:
    ws = tmp_path / "ws"
    script = (
        "echo early; while [ ! -e go ]; do sleep 0.02; done; "
        "echo late; echo err-late >&2; touch finished; exit 3"
    )
    async with open_modal(fake, tmp_path) as s:
        waiting = await s.pty_exec_start(script, yield_time_s=5, until="early")
        assert "early" in waiting.output
        ticking = await s.pty_exec_start(
            "for i in 1 2 3; do echo tick-$i; done; sleep 600", yield_time_s=5, until="tick-3"
        )
        pid = runner_pid(s)
        ref = await s.detach()
    assert ref.keeps_processes is True and ref.options["runner"] is True
    assert {p.process_id for p in ref.processes} == {waiting.process_id, ticking.process_id}
    assert all(p.running and "runner_id" in p.handle for p in ref.processes)
    # While nobody follows it, the process goes on and prints.
    (ws / "go").write_bytes(b"")
    assert await eventually(lambda: (ws / "finished").exists(), timeout=15)

    async with resume(fake, tmp_path, ref) as resumed:
        assert runner_pid(resumed) == pid and execs(fake, UPLOAD) == 1
        ids = {info.process_id for info in resumed.pty_processes()}
        assert ids == {waiting.process_id, ticking.process_id}
        last = await resumed.pty_write_stdin(waiting.process_id, "", yield_time_s=10)
        assert "late" in last.output and "err-late" in last.output
        assert "early" not in last.output  # the client had read it: not replayed
        assert last.exit_code == 3
        alive = await resumed.pty_write_stdin(ticking.process_id, "", yield_time_s=0.2)
        assert alive.exit_code is None and "tick" not in alive.output


async def test_open_stdin_is_ended_by_close_stdin_also_across_a_detach(
    fake: FakeModal, tmp_path: Path
) -> None:
    async with open_modal(fake, tmp_path) as s:
        started = await s.pty_exec_start("sort", stdin=True, yield_time_s=0.2)
        await s.pty_write_stdin(started.process_id, "pear\napple\n")
        await s.pty_close_stdin(started.process_id)
        done = await s.pty_write_stdin(started.process_id, "", yield_time_s=10)
        assert done.output == "apple\npear\n" and done.exit_code == 0

        kept = await s.pty_exec_start("sort", stdin=True, yield_time_s=0.2)
        await s.pty_write_stdin(kept.process_id, "cherry\n")
        ref = await s.detach()
    async with resume(fake, tmp_path, ref) as resumed:
        await resumed.pty_write_stdin(kept.process_id, "banana\n")
        await resumed.pty_close_stdin(kept.process_id)
        last = await resumed.pty_write_stdin(kept.process_id, "", yield_time_s=10)
        assert last.output == "banana\ncherry\n" and last.exit_code == 0


async def test_a_kill_ends_the_whole_tree_escapees_included(
    fake: FakeModal, tmp_path: Path
) -> None:
    seconds = unique_seconds()
    async with open_modal(fake, tmp_path, keep=True) as s:
        started = await s.pty_exec_start(
            f"sleep {seconds} & setsid sleep {seconds} & echo up; wait",
            yield_time_s=5,
            until="up",
        )
        assert await eventually(lambda: len(host_pids_with_arg(seconds)) == 2)
        await s.pty_terminate(started.process_id)
        # Kept sandbox: nothing but the runner ended them.
        assert await eventually(lambda: host_pids_with_arg(seconds) == [])
        assert (await s.exec("echo", "after")).stdout == b"after\n"


def _stub_machine(tmp_path: Path, machine: str) -> dict[str, str]:
    """An environment whose `uname` says the sandbox is a `machine` (no runner build)."""
    stubs = tmp_path / "bin"
    stubs.mkdir()
    uname = stubs / "uname"
    uname.write_text(f"#!/bin/sh\necho {machine}\n")
    uname.chmod(0o755)
    return {"PATH": f"{stubs}:{os.environ.get('PATH', '/usr/bin:/bin')}"}


async def test_without_a_runner_for_the_sandbox_runner_none_keeps_the_per_exec_path(
    fake: FakeModal, tmp_path: Path
) -> None:
    env = _stub_machine(tmp_path, "riscv64")
    async with open_modal(fake, tmp_path, runner=None, env=env) as s:
        assert s._runner is None and s.keeps_processes is False
        assert s.runner_fallback_reason is not None
        assert (await s.exec("echo", "per-exec")).stdout == b"per-exec\n"
        assert s.ref().options["runner"] is False
    assert execs(fake, UPLOAD) == 0 and execs(fake, CONNECT) == 0


async def test_without_a_runner_for_the_sandbox_runner_true_is_refused(
    fake: FakeModal, tmp_path: Path
) -> None:
    env = _stub_machine(tmp_path, "riscv64")
    s = open_modal(fake, tmp_path, runner=True, env=env)
    with pytest.raises(sandbox.UnsupportedOperationError, match="riscv64"):
        await s.start()
    assert fake.live_sandboxes() == []  # the failed start terminated what it created
    assert execs(fake, UPLOAD) == 0


async def test_auto_falls_back_with_its_reason_where_the_sandbox_cannot_take_it(
    fake: FakeModal, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A sandbox where the runner cannot be put in place (its `mv` refuses, as on a
    read-only folder): auto (`None`, the default) says why and keeps the per-exec path, once,
    as a warning; `runner=True` fails the start saying why."""
    stubs = tmp_path / "bin"
    stubs.mkdir()
    (stubs / "mv").write_text("#!/bin/sh\necho 'mv: Read-only file system' >&2\nexit 1\n")
    (stubs / "mv").chmod(0o755)
    env = {"PATH": f"{stubs}:{os.environ.get('PATH', '/usr/bin:/bin')}"}
    with caplog.at_level(logging.WARNING, logger="sandbox.modal"):
        async with open_modal(fake, tmp_path, env=env, runner=None) as s:
            assert not s.uses_runner and s.keeps_processes is False
            reason = s.runner_fallback_reason
            assert reason is not None
            assert reason.startswith("runner: could not be started in the sandbox"), reason
            assert (await s.exec("echo", "per-exec")).stdout == b"per-exec\n"
    assert reason in caplog.text
    strict = open_modal(fake, tmp_path, env=env, runner=True)
    with pytest.raises(sandbox.ProviderError):
        await strict.start()
    assert fake.live_sandboxes() == []


async def test_runner_none_uses_the_runner_where_there_is_one(
    fake: FakeModal, tmp_path: Path
) -> None:
    async with open_modal(fake, tmp_path, runner=None) as s:
        assert s._runner is not None and s.keeps_processes is True
        assert (await s.exec("echo", "through the runner")).stdout == b"through the runner\n"
        assert s.ref().options["runner"] is True


async def test_runner_false_is_the_per_exec_path_and_the_default_the_runner(
    fake: FakeModal, tmp_path: Path
) -> None:
    async with open_modal(fake, tmp_path, runner=False) as s:
        assert s._runner is None and s.keeps_processes is False
        assert not s.uses_runner and s.runner_fallback_reason == "runner=False"
    assert execs(fake, CONNECT) == 0
    assert open_modal(fake, tmp_path).keeps_processes is True  # runner=True, unstarted
    plain = sandbox.open_session(
        "modal", sdk=fake, workdir=str(tmp_path / "ws2"), state_dir=str(tmp_path / "st2"), **TOKEN
    )
    assert isinstance(plain, ModalSession)
    assert plain.keeps_processes is True  # what the default would pick: this install has one
    async with plain as s:
        assert s.uses_runner and s.runner_fallback_reason is None
        assert (await s.exec("echo", "through the runner")).stdout == b"through the runner\n"
    assert execs(fake, CONNECT) == 1


def test_runner_must_be_a_bool_or_none(tmp_path: Path) -> None:
    with pytest.raises(sandbox.InvalidArgumentError, match="runner"):
        sandbox.open_session("modal", sdk=FakeModal(), runner="yes", **TOKEN)


async def test_a_dropped_link_loses_the_processes_and_the_next_session_has_the_runner(
    fake: FakeModal, tmp_path: Path
) -> None:
    async with open_modal(fake, tmp_path, keep=True) as s:
        started = await s.pty_exec_start("echo up; sleep 600", yield_time_s=5, until="up")
        pid = runner_pid(s)
        sandbox_id = s.sandbox_id
        # The link's stdout fails at its next chunk (a stream Modal reset).
        fake.fail("read", mx.ConnectionError("stream reset"), when=lambda argv: CONNECT in argv)
        with pytest.raises(sandbox.ConnectionLostError):
            await s.exec("echo", "never")
        last = await s.pty_write_stdin(started.process_id, "", yield_time_s=1)
        assert "process lost" in last.output and last.exit_code is None
    # The runner did not end with its link: the next client reaches it.
    async with open_modal(fake, tmp_path, sandbox_id=sandbox_id) as again:
        assert runner_pid(again) == pid
        assert (await again.exec("echo", "back")).stdout == b"back\n"


async def test_a_start_cancelled_during_the_upload_leaves_nothing(
    fake: FakeModal, tmp_path: Path
) -> None:
    gate = fake.block("exec", when=lambda argv: UPLOAD in argv)
    s = open_modal(fake, tmp_path)
    starting = asyncio.ensure_future(s.start())
    await gate.reached.wait()
    starting.cancel()
    gate.release()
    with pytest.raises(asyncio.CancelledError):
        await starting
    await s.aclose()
    assert fake.live_sandboxes() == [] and fake.open_clients() == []
    assert execs(fake, CONNECT) == 0


async def test_an_upload_cut_short_ends_its_exec_and_renames_nothing(
    fake: FakeModal, tmp_path: Path
) -> None:
    # Held at its first drain of the binary's bytes: the exec runs, waiting for them.
    gate = fake.block("write", when=lambda argv: UPLOAD in argv)
    s = open_modal(fake, tmp_path, keep=True)
    starting = asyncio.ensure_future(s.start())
    await gate.reached.wait()
    starting.cancel()
    gate.release()
    with pytest.raises(asyncio.CancelledError):
        await starting
    [box] = fake.live_sandboxes()  # kept: the sandbox outlives the cancelled start
    [upload] = [p for p in box.processes if UPLOAD in p.argv]
    # Its stdin was ended: the exec finished instead of waiting for the rest forever.
    assert await eventually(lambda: upload._local is not None and upload._local.exited)
    assert box._runner_dir is not None
    assert [n for n in os.listdir(box._runner_dir) if not n.endswith(".tmp")] == []
    await s.aclose()
