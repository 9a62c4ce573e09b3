"""The `e2b` backend with the runner (docs/runner.md), through the SDK fake: the runner
really runs in the fake sandbox (a local process in the sandbox's own runner folder),
written there by `files.write` and reached by a background command, `connect --text
--start`, whose text stdin and stdout carry its frames as base64 lines.

Delivery by content hash (a second client finds the file and the running runner), the
headline (a process's output printed while no client was connected is replayed after a
resume, which envd cannot do), byte-exact output (all 256 byte values, which the SDK's
text decoding of a command's stdout would replace), an open stdin ended by
`pty_close_stdin` (also across a detach), whole-tree kills, and envd's own processes
where this install has no runner for the sandbox's machine (`runner=None`) or a
refusal (`runner=True`).
"""

from __future__ import annotations

import hashlib
import os
import stat
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

import sandbox
from sandbox.backends.e2b import E2BSession
from sandbox.backends.toolkit import RUNNER_INSTALL_SCRIPT
from sandbox.runner import runner_binary
from sandbox.testing.e2b_fake import FakeE2B
from tests.helpers import (
    describe_pids,
    eventually,
    host_pids_with_arg,
    require_runner,
    runner_pid,
    unique_seconds,
)

KEY = "e2b_runner_test_key_0123456789"
ALL_BYTES = bytes(range(256))


@pytest.fixture(autouse=True)
def _runner_built() -> None:
    require_runner("e2b runner")


@pytest.fixture
async def fake(tmp_path: Path) -> AsyncIterator[FakeE2B]:
    root = tmp_path / "fake-e2b"
    root.mkdir()
    f = FakeE2B(api_key=KEY, root=root)
    yield f
    folders = [state.runner_dir for state in f._sandboxes.values()]
    await f.aclose()
    # Killing the sandbox ends the runner and everything it kept, and its folder.
    assert await eventually(lambda: f.leftover_pids() == [], timeout=15), describe_pids(
        f.leftover_pids()
    )
    assert not [folder for folder in folders if os.path.exists(folder)]


def open_e2b(fake: FakeE2B, **options: Any) -> E2BSession:
    options.setdefault("runner", True)
    s = sandbox.open_session("e2b", api_key=KEY, sandbox_class=fake.AsyncSandbox, **options)
    assert isinstance(s, E2BSession)
    return s


def resume(fake: FakeE2B, ref: sandbox.SessionRef) -> E2BSession:
    s = sandbox.resume_session(ref, api_key=KEY, sandbox_class=fake.AsyncSandbox)
    assert isinstance(s, E2BSession)
    return s


def uploads(fake: FakeE2B) -> int:
    """How many files the fake was asked to write (only the runner, in these tests)."""
    return fake.faults.calls.count("files.write")


def links(fake: FakeE2B) -> int:
    """How many commands bridged to the runner."""
    return sum(1 for p in fake.processes if "connect --text --start" in p.argv[-1])


async def test_a_second_client_finds_the_delivered_runner_by_its_hash(fake: FakeE2B) -> None:
    async with open_e2b(fake, keep=True) as first:
        assert first.keeps_processes is True
        assert (await first.exec("echo", "one")).stdout == b"one\n"
        pid = runner_pid(first)
        sandbox_id = first.sandbox_id
    assert uploads(fake) == 1 and links(fake) == 1
    [state] = [fake._sandboxes[i] for i in fake.live_sandbox_ids()]  # kept: the runner lives
    binary = runner_binary()
    assert binary is not None
    path = Path(state.runner_dir) / f".sandbox-runner-{binary.sha256[:16]}"
    assert hashlib.sha256(path.read_bytes()).hexdigest() == binary.sha256
    assert stat.S_IMODE(path.stat().st_mode) == 0o755
    assert [p.name for p in path.parent.iterdir() if p.name.endswith(".tmp")] == []

    # The same bytes are there: no upload; the running runner answers the new link.
    async with open_e2b(fake, sandbox_id=sandbox_id, keep=True) as second:
        assert runner_pid(second) == pid
        assert (await second.exec("echo", "two")).stdout == b"two\n"
    assert uploads(fake) == 1 and links(fake) == 2

    # Other bytes at the runner's name are replaced (the running runner is still found).
    other = path.with_name("impostor")
    other.write_bytes(b"#!/bin/sh\necho impostor\n")
    other.replace(path)
    async with open_e2b(fake, sandbox_id=sandbox_id) as third:
        assert runner_pid(third) == pid
        assert (await third.exec("echo", "three")).stdout == b"three\n"
        assert hashlib.sha256(path.read_bytes()).hexdigest() == binary.sha256
    assert uploads(fake) == 2
    assert fake.live_sandbox_ids() == []  # the last one did not keep it


@pytest.mark.parametrize(
    ("written", "installed"),
    [(b"runner bytes", True), (b"runner byte", False), (b"runner bytez", False)],
    ids=["right", "cut-short", "other-bytes"],
)
def test_the_install_script_puts_only_the_right_bytes_in_place(
    tmp_path: Path, written: bytes, installed: bool
) -> None:
    expected = b"runner bytes"
    digest = hashlib.sha256(expected).hexdigest()
    temporary, path = tmp_path / "runner.123.tmp", tmp_path / "runner"
    temporary.write_bytes(written)
    argv = [str(temporary), str(path), digest, str(len(expected))]
    done = subprocess.run(
        ["sh", "-c", RUNNER_INSTALL_SCRIPT, "sandbox-runner-install", *argv],
        capture_output=True,
        text=True,
        check=False,
    )
    assert (done.returncode == 0) is installed, done.stderr
    assert not temporary.exists()  # removed whatever happened
    assert path.exists() is installed
    if installed:
        assert done.stdout == digest and stat.S_IMODE(path.stat().st_mode) == 0o755


@pytest.mark.parametrize("tty", [True, False], ids=["tty", "pipes"])
async def test_output_printed_while_detached_is_replayed_after_resume(
    fake: FakeE2B, tty: bool
) -> None:
    script = (
        "echo early; while [ ! -e go ]; do sleep 0.02; done; "
        "echo late-1; echo late-2; touch finished; exit 3"
    )
    async with open_e2b(fake) as s:
        waiting = await s.pty_exec_start(script, tty=tty, yield_time_s=5, until="early")
        assert "early" in waiting.output
        ticking = await s.pty_exec_start(
            "for i in 1 2 3; do echo tick-$i; done; exec sleep 600",
            tty=tty,
            yield_time_s=5,
            until="tick-3",
        )
        pid = runner_pid(s)
        assert s.sandbox_id is not None
        home = Path(fake.sandbox_home(s.sandbox_id))
        ref = await s.detach()
    assert ref.keeps_processes is True and ref.options["runner"] is True
    assert all(p.running and "runner_id" in p.handle for p in ref.processes)
    # While nobody follows it, the process goes on and prints.
    (home / "go").write_bytes(b"")
    assert await eventually(lambda: (home / "finished").exists(), timeout=15)

    async with resume(fake, ref) as resumed:
        assert runner_pid(resumed) == pid and uploads(fake) == 1
        ids = {info.process_id for info in resumed.pty_processes()}
        assert ids == {waiting.process_id, ticking.process_id}
        last = await resumed.pty_write_stdin(waiting.process_id, "", yield_time_s=10)
        # Replayed from the runner's ring, not envd's "printed meanwhile is lost" note.
        assert "late-1" in last.output and "late-2" in last.output
        assert "early" not in last.output  # the client had read it: not replayed
        assert "not shown" not in last.output
        assert last.exit_code == 3
        alive = await resumed.pty_write_stdin(ticking.process_id, "", yield_time_s=0.2)
        assert alive.exit_code is None and "tick" not in alive.output


async def test_every_byte_value_comes_back_exact_where_envd_would_replace_it(
    fake: FakeE2B,
) -> None:
    async with open_e2b(fake) as s:
        await s.write_file("bytes.bin", ALL_BYTES)
        result = await s.exec("cat bytes.bin; cat bytes.bin >&2")
        assert result.stdout == ALL_BYTES and result.stderr == ALL_BYTES
        large = await s.exec("head -c 300000 /dev/urandom | tee sent.bin")
        assert large.stdout == await s.read_file("sent.bin")
    async with open_e2b(fake, runner=False) as plain:
        await plain.write_file("bytes.bin", ALL_BYTES)
        # What the runner is for: envd's stdout reaches the SDK's callbacks as text.
        assert (await plain.exec("cat bytes.bin")).stdout != ALL_BYTES


async def test_open_stdin_is_ended_by_close_stdin_also_across_a_detach(fake: FakeE2B) -> None:
    async with open_e2b(fake) as s:
        started = await s.pty_exec_start("sort", stdin=True, yield_time_s=0.2)
        await s.pty_write_stdin(started.process_id, "pear\napple\n")
        await s.pty_close_stdin(started.process_id)
        done = await s.pty_write_stdin(started.process_id, "", yield_time_s=10)
        assert done.output == "apple\npear\n" and done.exit_code == 0

        kept = await s.pty_exec_start("sort", stdin=True, yield_time_s=0.2)
        await s.pty_write_stdin(kept.process_id, "cherry\n")
        ref = await s.detach()
    async with resume(fake, ref) as resumed:
        await resumed.pty_write_stdin(kept.process_id, "banana\n")
        await resumed.pty_close_stdin(kept.process_id)
        last = await resumed.pty_write_stdin(kept.process_id, "", yield_time_s=10)
        assert last.output == "banana\ncherry\n" and last.exit_code == 0


async def test_a_dropped_link_loses_the_processes_and_the_next_session_has_the_runner(
    fake: FakeE2B,
) -> None:
    async with open_e2b(fake, keep=True) as s:
        started = await s.pty_exec_start("echo up; sleep 600", yield_time_s=5, until="up")
        pid = runner_pid(s)
        sandbox_id = s.sandbox_id
        # The link's stream dies (a connection E2B dropped): the reader ends it.
        [link] = [p for p in fake.processes if "connect --text --start" in p.argv[-1]]
        link.break_stream(ConnectionResetError("stream reset"))
        with pytest.raises(sandbox.ConnectionLostError):
            await s.exec("echo", "never")
        last = await s.pty_write_stdin(started.process_id, "", yield_time_s=1)
        assert "process lost" in last.output and last.exit_code is None
    # The runner did not end with its link: the next client reaches it.
    async with open_e2b(fake, sandbox_id=sandbox_id) as again:
        assert runner_pid(again) == pid
        assert (await again.exec("echo", "back")).stdout == b"back\n"


async def test_a_kill_ends_the_whole_tree_escapees_included(fake: FakeE2B) -> None:
    seconds = unique_seconds()
    async with open_e2b(fake, keep=True) as s:
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


async def test_a_terminal_resizes_and_processes_start_in_the_home(fake: FakeE2B) -> None:
    async with open_e2b(fake) as s:
        assert s.sandbox_id is not None
        home = fake.sandbox_home(s.sandbox_id)
        assert (await s.exec("pwd")).stdout.decode().strip() == home
        (Path(home) / "sub").mkdir()
        assert (await s.exec("pwd", cwd="sub")).stdout.decode().strip() == f"{home}/sub"
        started = await s.pty_exec_start(
            "echo ready; read line; stty size", tty=True, rows=24, cols=80, until="ready"
        )
        await s.pty_resize(started.process_id, rows=33, cols=101)
        size = await s.pty_write_stdin(started.process_id, "\n", yield_time_s=5, until="33")
        assert "33 101" in size.output


async def _sandbox_of_machine(fake: FakeE2B, tmp_path: Path, machine: str) -> str:
    """A kept sandbox whose `uname` says it is a `machine` (no runner build): envd runs
    every command in a login bash, which reads the home's `.bash_profile`."""
    stubs = tmp_path / "bin"
    stubs.mkdir()
    uname = stubs / "uname"
    uname.write_text(f"#!/bin/sh\necho {machine}\n")
    uname.chmod(0o755)
    async with open_e2b(fake, runner=False, keep=True) as s:
        await s.write_file(".bash_profile", f'PATH="{stubs}:$PATH"\n')
        assert s.sandbox_id is not None
        return s.sandbox_id


async def test_without_a_runner_for_the_sandbox_runner_none_keeps_envds_processes(
    fake: FakeE2B, tmp_path: Path
) -> None:
    sandbox_id = await _sandbox_of_machine(fake, tmp_path, "riscv64")
    uploaded = uploads(fake)
    async with open_e2b(fake, runner=None, sandbox_id=sandbox_id) as s:
        assert s._runner is None and s.keeps_processes is True
        assert (await s.exec("echo", "envd")).stdout == b"envd\n"
        assert s.ref().options["runner"] is False
    assert uploads(fake) == uploaded and links(fake) == 0


async def test_without_a_runner_for_the_sandbox_runner_true_is_refused(
    fake: FakeE2B, tmp_path: Path
) -> None:
    sandbox_id = await _sandbox_of_machine(fake, tmp_path, "riscv64")
    uploaded = uploads(fake)
    s = open_e2b(fake, runner=True, sandbox_id=sandbox_id)
    with pytest.raises(sandbox.UnsupportedOperationError, match="riscv64"):
        await s.start()
    assert uploads(fake) == uploaded and links(fake) == 0


async def test_runner_none_uses_the_runner_where_there_is_one(fake: FakeE2B) -> None:
    async with open_e2b(fake, runner=None) as s:
        assert s._runner is not None
        assert (await s.exec("echo", "through the runner")).stdout == b"through the runner\n"
        assert s.ref().options["runner"] is True


async def test_the_default_is_envds_processes(fake: FakeE2B) -> None:
    async with sandbox.open_session("e2b", api_key=KEY, sandbox_class=fake.AsyncSandbox) as s:
        assert isinstance(s, E2BSession) and s._runner is None
        assert (await s.exec("echo", "plain")).stdout == b"plain\n"
        assert s.ref().options["runner"] is False
    assert uploads(fake) == 0 and links(fake) == 0


def test_runner_must_be_a_bool_or_none() -> None:
    with pytest.raises(sandbox.InvalidArgumentError, match="runner"):
        sandbox.open_session("e2b", api_key=KEY, runner="yes")
