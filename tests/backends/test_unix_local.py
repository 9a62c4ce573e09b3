"""unix_local specifics: real processes, fds, zombies, terminals, the workspace."""

from __future__ import annotations

import asyncio
import json
import os
import re
import resource
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import sandbox
from sandbox.backends.unix_local import UnixLocalSession
from tests.helpers import (
    DeadlineCount,
    children_of_me,
    eventually,
    host_pids_with_arg,
    open_fds,
    unique_seconds,
)


def kept_files(session: UnixLocalSession) -> int:
    """How many `cgroup.events` files the session's leaves keep open now."""
    cgroup = session._cgroup
    return 0 if cgroup is None else sum(leaf._events_fd >= 0 for leaf in cgroup._keeping)


@pytest.fixture
async def session(tmp_path: Path):  # type: ignore[no-untyped-def]
    async with UnixLocalSession(workdir=tmp_path, terminate_grace_s=0.3) as s:
        yield s


async def test_no_fd_or_child_growth_over_many_cycles(session: UnixLocalSession) -> None:
    await session.pty_exec_start("true", tty=True)  # warm up lazily created fds
    fds, kids, kept = open_fds(), len(children_of_me()), kept_files(session)
    for i in range(300):
        update = await session.pty_exec_start("echo $0", tty=i % 2 == 0)
        assert update.process_id is None and update.exit_code == 0
        if i % 50 == 0:
            await session.exec("true")
    for i in range(20):
        update = await session.pty_exec_start("echo r; exec sleep 30", tty=i % 2 == 0, until="r")
        assert update.process_id is not None
    await session.pty_terminate_all()
    # What stays open is one events file per leaf the 20 live processes added (bounded
    # by `KEPT_EVENTS_FILES`; see the next test), for the next processes to reuse.
    assert kept_files(session) - kept <= 20  # at most one per process alive at once
    assert open_fds() == fds + kept_files(session) - kept
    assert len(children_of_me()) == kids


async def test_64_ptys_at_once_all_work(session: UnixLocalSession) -> None:
    updates = await asyncio.gather(
        *(session.pty_exec_start("echo r; exec cat", tty=True, until="r") for _ in range(64))
    )
    pids = [u.process_id for u in updates]
    assert None not in pids and len(set(pids)) == 64
    # Each window ends at its echo; the maximum only matters on a loaded machine, where 64
    # round trips can outlast the default 0.25 s write window.
    replies = await asyncio.gather(
        *(
            session.pty_write_stdin(pid, f"n{pid}\n", until=f"n{pid}\r\nn{pid}", yield_time_s=20)  # type: ignore[arg-type]
            for pid in pids
        )
    )
    assert all(r.output.count(f"n{pid}") == 2 for r, pid in zip(replies, pids, strict=True))
    assert (await session.exec("echo still fast")).ok


async def test_terminal_setup(session: UnixLocalSession) -> None:
    update = await session.pty_exec_start(
        "echo term=$TERM; tty; ps -o stat= -p $$; stty -a | head -1", tty=True, rows=30, cols=100
    )
    out = update.output
    assert re.search(r"term=\S+", out), "TERM is set (inherited, else xterm-256color)"
    assert "/dev/pts/" in out
    assert "s" in out.split("\n")[2] and "+" in out.split("\n")[2], (
        "session leader in the foreground"
    )
    assert "rows 30; columns 100" in out


async def test_pipes_have_dev_null_stdin(session: UnixLocalSession) -> None:
    update = await session.pty_exec_start("readlink /proc/self/fd/0; cat; echo after-cat")
    assert update.output == "/dev/null\nafter-cat\n"
    assert update.exit_code == 0


async def test_terminate_kills_the_group_even_if_polite_signals_are_ignored(
    session: UnixLocalSession,
) -> None:
    marker = unique_seconds()
    update = await session.pty_exec_start(
        f"trap '' HUP TERM INT; sleep {marker} & echo ready; sleep {marker}; wait",
        tty=True,
        until="ready",
    )
    assert update.process_id is not None
    assert await eventually(lambda: len(host_pids_with_arg(marker)) == 2)
    # It ends (SIGKILL after the grace) rather than waiting on the ignoring group; the
    # generous bound only turns a hang into a failure.
    await asyncio.wait_for(session.pty_terminate(update.process_id), timeout=60)
    # SIGKILL is sent to the whole group; members other than the leader die a moment later.
    assert await eventually(lambda: not host_pids_with_arg(marker), timeout=2)


async def test_interrupt_works_when_parent_ignores_sigint(tmp_path: Path) -> None:
    code = f"""
import asyncio, signal, sandbox
signal.signal(signal.SIGINT, signal.SIG_IGN)
async def main():
    async with sandbox.open_session("unix_local", workdir={str(tmp_path)!r}) as s:
        for tty in (True, False):
            u = await s.pty_exec_start("echo r; exec sleep 30", tty=tty, until="r")
            await s.pty_interrupt(u.process_id)
            print((await s.pty_write_stdin(u.process_id, "", yield_time_s=5)).exit_code)
asyncio.run(main())
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.split() == ["130", "130"], out.stderr


async def test_exit_is_reported_even_if_a_background_child_keeps_the_pty(
    session: UnixLocalSession,
) -> None:
    marker = unique_seconds()
    deadlines = DeadlineCount(session)
    update = await session.pty_exec_start(f"sleep {marker} & echo bye", tty=True, yield_time_s=10)
    assert deadlines.count == 0, "the window waited for its deadline, not the exit"
    deadlines.close()
    assert update.process_id is None and update.exit_code == 0 and "bye" in update.output
    assert await eventually(lambda: not host_pids_with_arg(marker)), "finalize kills the group"


async def test_unread_flood_keeps_memory_bounded(session: UnixLocalSession) -> None:
    update = await session.pty_exec_start("yes", yield_time_s=0.25)
    assert update.process_id is not None
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    await asyncio.sleep(1.5)  # `yes` floods while nobody reads: that is the point
    entry = session._core.processes.lookup(update.process_id)
    assert entry.output.retained <= session.output_limit_bytes
    assert entry.output.omitted > 10 * session.output_limit_bytes
    poll = await session.pty_write_stdin(update.process_id, "", until="y\n", max_output_tokens=2000)
    assert poll.original_token_count is not None
    assert len(poll.output) < 2000 * 4 + 100
    grew_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    assert grew_kib < 64 * 1024


async def test_one_shot_flood_keeps_peak_memory_small(tmp_path: Path) -> None:
    # In a fresh interpreter, so that the peak (ru_maxrss never goes down) is this exec's:
    # 600 MB of output must cost the default 16 MiB bound plus read buffers, not 600 MB.
    code = f"""
import asyncio, json, resource, sandbox
async def main():
    async with sandbox.open_session("unix_local", workdir={str(tmp_path)!r}) as s:
        await s.exec("head -c 1000000 /dev/zero")  # warm up
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        r = await s.exec("head -c 600000000 /dev/zero")
        grew = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
        print(json.dumps([grew, len(r.stdout), r.stdout_omitted, r.exit_code]))
asyncio.run(main())
"""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", code, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    async with asyncio.timeout(120):
        out, err = await proc.communicate()
    assert proc.returncode == 0, err.decode()
    grew_kib, kept, omitted, code_ = json.loads(out)
    limit = 16 * 1024 * 1024
    assert (kept, omitted, code_) == (limit, 600_000_000 - limit, 0)
    assert grew_kib < 150 * 1024, f"peak RSS grew by {grew_kib} KiB"


async def test_exec_output_limit_option(tmp_path: Path) -> None:
    async with UnixLocalSession(workdir=tmp_path, exec_output_limit_bytes=100) as s:
        result = await s.exec("seq 1 1000")
        assert len(result.stdout) == 100 and result.stdout.startswith(b"1\n2\n")
        assert result.stdout.endswith(b"999\n1000\n")
        assert result.stdout_omitted == len(b"".join(b"%d\n" % i for i in range(1, 1001))) - 100
        # The call's own bound wins over the session's.
        assert (await s.exec("seq 1 1000", max_output_bytes=10**6)).stdout_omitted == 0


async def test_start_errors_name_what_failed(session: UnixLocalSession) -> None:
    # Popen's own errors, mapped: never a raw FileNotFoundError / NotADirectoryError.
    Path(session.workdir, "a-file").touch()
    with pytest.raises(sandbox.WorkdirError, match="'missing' does not exist"):
        await session.pty_exec_start("true", cwd="missing")
    with pytest.raises(sandbox.WorkdirError, match="'a-file' is not a directory"):
        await session.exec("true", cwd="a-file")
    with pytest.raises(sandbox.CommandNotFoundError, match=r"'\./a-file' is not an executable"):
        await session.exec("./a-file", shell=False)
    with pytest.raises(sandbox.CommandNotFoundError, match="'nope-3f1' was not found"):
        await session.pty_exec_start("nope-3f1", shell=False, tty=True)
    assert session.pty_processes() == []


@pytest.mark.parametrize(
    "path", ["../outside.txt", "/etc/passwd", "a/../../outside.txt", "link/secret.txt"]
)
async def test_file_paths_cannot_escape(session: UnixLocalSession, path: str) -> None:
    os.symlink("/etc", os.path.join(session.workdir, "link"))
    with pytest.raises(sandbox.WorkspacePathError, match="outside the workspace"):
        await session.read_file(path)
    with pytest.raises(sandbox.WorkspacePathError):
        await session.write_file(path, b"x")
    assert not Path(session.workdir).parent.joinpath("outside.txt").exists()


async def test_files_inside_and_missing(session: UnixLocalSession) -> None:
    await session.write_file(os.path.join(session.workdir, "abs.txt"), "absolute ok")
    assert await session.read_file("abs.txt") == b"absolute ok"
    with pytest.raises(sandbox.SandboxFileNotFoundError):
        await session.read_file("missing.txt")


async def test_env_options(tmp_path: Path) -> None:
    os.environ["SANDBOX_TEST_PARENT_VAR"] = "from-parent"
    try:
        async with UnixLocalSession(workdir=tmp_path, env={"A": "1"}, inherit_env=False) as s:
            out = (await s.exec("echo ${SANDBOX_TEST_PARENT_VAR:-unset} $A")).stdout
            assert out == b"unset 1\n"
        async with UnixLocalSession(workdir=tmp_path) as s:
            out = (await s.exec("echo $SANDBOX_TEST_PARENT_VAR", env={"X": "y"})).stdout
            assert out == b"from-parent\n"
    finally:
        del os.environ["SANDBOX_TEST_PARENT_VAR"]


async def test_signal_death_codes(session: UnixLocalSession) -> None:
    for sig in (signal.SIGKILL, signal.SIGTERM, signal.SIGSEGV):
        result = await session.exec(f"kill -{int(sig)} $$")
        assert result.exit_code == 128 + sig


SIGNAL_COUNTER = """
import os, signal, sys
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_APPEND)
def record(sig, frame):
    os.write(fd, signal.Signals(sig).name.encode() + b"\\n")
for sig in (signal.SIGHUP, signal.SIGTERM, signal.SIGCONT):
    signal.signal(sig, record)
os.write(fd, b"ready\\n")
while True:
    signal.pause()
"""


@pytest.mark.parametrize("containment", ["auto", "tag"])
async def test_terminate_sends_each_polite_signal_once_to_every_process(
    tmp_path: Path, containment: str
) -> None:
    # The leader is in the group the terminate signals; its child left for a session of
    # its own. Both outlive the polite signals (SIGKILL ends them after the grace), so
    # each records every signal that reached it: each exactly once.
    counter = tmp_path / "counter.py"
    counter.write_text(SIGNAL_COUNTER)
    leader, child = tmp_path / "leader.txt", tmp_path / "child.txt"
    async with UnixLocalSession(
        workdir=tmp_path / "ws", containment=containment, terminate_grace_s=0.3
    ) as s:
        update = await s.pty_exec_start(
            f"setsid {sys.executable} {counter} {child} & exec {sys.executable} {counter} {leader}",
            yield_time_s=0.25,
        )
        assert update.process_id is not None

        def both_ready() -> bool:
            return all(p.exists() and p.read_text().startswith("ready") for p in (leader, child))

        assert await eventually(both_ready)
        await s.pty_terminate(update.process_id)
    for path in (leader, child):
        assert sorted(path.read_text().split()[1:]) == ["SIGCONT", "SIGHUP", "SIGTERM"], path.name
