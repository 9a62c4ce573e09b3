"""The /proc reader (`sandbox.testing.procfs`) against real processes of this test."""

from __future__ import annotations

import mmap
import os
import subprocess
import sys
import time
from collections.abc import Callable

from sandbox.testing import procfs
from tests.helpers import unique_seconds


def _soon(predicate: Callable[[], bool], timeout: float = 10.0) -> bool:
    """Poll a state only /proc shows (no event announces an exec)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


def test_finds_a_process_by_argument_and_environment_until_it_is_reaped() -> None:
    marker = unique_seconds()
    tag = f"procfs-{marker}"
    child = subprocess.Popen(["sleep", marker], env={**os.environ, "PROCFS_TEST_TAG": tag})
    try:
        # Popen may return before the child's exec; its argv shows once it happened.
        assert _soon(lambda: procfs.cmdline(child.pid) == [b"sleep", marker.encode()])
        assert procfs.pids_with_arg(marker) == [child.pid]
        assert procfs.pids_with_arg(marker[:-1]) == []  # whole arguments only
        assert procfs.pids_with_env("PROCFS_TEST_TAG", tag) == [child.pid]
        assert procfs.pids_with_env("PROCFS_TEST_TAG", tag[:-2], prefix=True) == [child.pid]
        assert procfs.pids_with_env("PROCFS_TEST_TAG", tag[:-2]) == []
        info = procfs.stat(child.pid)
        assert info is not None and info.ppid == os.getpid() and not info.zombie
        assert child.pid in procfs.children()
        assert procfs.cmdline(child.pid) == [b"sleep", marker.encode()]
        assert f"{child.pid} S sleep {marker}" in procfs.describe([child.pid])
        child.kill()
        os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)  # exited, not reaped
        assert procfs.stat(child.pid).zombie  # type: ignore[union-attr]
        assert not procfs.alive(child.pid)
        assert procfs.pids_with_arg(marker) == []  # a zombie is not live
        assert child.pid in procfs.children()  # but still a child
    finally:
        child.kill()
        child.wait()
    assert procfs.stat(child.pid) is None
    assert procfs.describe([child.pid]) == f"{child.pid} - (gone)"
    assert procfs.describe([]) == "(none)"


def test_pids_where_reads_sessions_and_leaves_this_process_out() -> None:
    marker = unique_seconds()
    leader = subprocess.Popen(
        [sys.executable, "-c", f"import subprocess; subprocess.run(['sleep', '{marker}'])"],
        start_new_session=True,
    )
    try:
        assert procfs.pids_where(lambda p: p.pid == os.getpid()) == []
        assert procfs.pids_where(lambda p: p.pid == os.getpid(), include_self=True)
        # The grandchild appears once python has started it.
        assert _soon(lambda: len(procfs.pids_where(lambda p: p.session == leader.pid)) == 2)
        assert leader.pid in procfs.pids_where(lambda p: p.session == leader.pid)
    finally:
        for pid in procfs.pids_where(lambda p: p.session == leader.pid):
            os.kill(pid, 9)
        leader.wait()


def test_fds_are_listed_with_their_targets() -> None:
    read_end, write_end = os.pipe()
    try:
        assert {str(read_end), str(write_end)} <= set(procfs.open_fds())
        assert any(t.startswith(f"{read_end}->pipe:") for t in procfs.fd_targets())
    finally:
        os.close(read_end)
        os.close(write_end)
    assert str(read_end) not in procfs.fd_targets() and str(write_end) not in procfs.open_fds()


def test_rss_follows_memory_this_process_touches() -> None:
    # A fresh anonymous mapping, each page written: an allocation from the heap could
    # reuse pages a long-lived process (the whole suite) already holds resident.
    size = 64 * 1024 * 1024
    with mmap.mmap(-1, size) as block:
        before = procfs.rss_bytes()
        for offset in range(0, size, mmap.PAGESIZE):
            block[offset] = 1
        grown = procfs.rss_bytes()
    assert grown - before >= 60 * 1024 * 1024
