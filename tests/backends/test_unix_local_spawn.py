"""How unix_local starts a process: the clone3 helper and the `Popen` fallback.

Each behaviour test runs on both start paths (the `path` fixture): the helper (the C
extension `sandbox._native._spawn` built at install time, `sandbox.local.spawn_helper`)
and `Popen` (what runs where it was not built, or with `SANDBOX_NO_EXTENSIONS=1`).
Which one a process selects is tests/test_native.py's subject.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

import sandbox
from sandbox.backends.unix_local import UnixLocalSession
from sandbox.local import spawn_helper as sh
from tests.helpers import children_of_me, open_fds

HELPER = sh.loaded()  # None where it was not built, or with SANDBOX_NO_EXTENSIONS=1
SKIP_HELPER = None if HELPER is not None else f"no spawn helper here: {sh.reason()}"


@contextlib.contextmanager
def _helper_state(helper: sh.Helper | None, why: str = "") -> Iterator[None]:
    """Run with the helper on (`helper`) or off, and put the process's own back."""
    saved = (sh._helper, sh._why)
    sh._helper, sh._why = helper, why
    try:
        yield
    finally:
        sh._helper, sh._why = saved


@pytest.fixture(params=["helper", "popen"])
def path(request: pytest.FixtureRequest) -> Iterator[str]:
    if request.param == "helper" and HELPER is None:
        pytest.skip(SKIP_HELPER or "")
    with _helper_state(HELPER if request.param == "helper" else None, "off for this test"):
        yield request.param


def _proc_stat(text: str) -> list[str]:
    # After "pid (comm) ": state ppid pgrp session tty_nr tpgid ...
    return text.rsplit(")", 1)[1].split()


async def test_a_terminal_process_leads_its_session_with_the_terminal(
    tmp_path: Path, path: str
) -> None:
    async with UnixLocalSession(workdir=tmp_path) as s:
        update = await s.pty_exec_start("echo $$; cat /proc/$$/stat; tty", tty=True, yield_time_s=5)
        assert update.exit_code == 0, update.output
        pid_line, stat_line, tty_line = update.output.splitlines()[:3]
        fields = _proc_stat(stat_line)
        pid = int(pid_line)
        assert int(fields[2]) == pid and int(fields[3]) == pid, "its own group and session"
        assert int(fields[5]) == pid, "the terminal's foreground group is its group"
        assert tty_line.startswith("/dev/pts/")


async def test_pipes_get_dev_null_stdin_and_their_own_session(tmp_path: Path, path: str) -> None:
    async with UnixLocalSession(workdir=tmp_path) as s:
        result = await s.exec("echo $$; cat /proc/$$/stat; readlink /proc/self/fd/0; cat")
        assert result.exit_code == 0
        pid_line, stat_line, stdin = result.stdout.decode().splitlines()
        fields = _proc_stat(stat_line)
        assert int(fields[3]) == int(pid_line)
        assert int(fields[4]) == 0, "no controlling terminal"
        assert stdin == "/dev/null"


async def test_only_the_standard_fds_reach_the_command(tmp_path: Path, path: str) -> None:
    leak_r, leak_w = os.pipe()
    os.set_inheritable(leak_r, True)
    os.set_inheritable(leak_w, True)
    try:
        async with UnixLocalSession(workdir=tmp_path) as s:
            for tty in (True, False):
                update = await s.pty_exec_start("exec ls /proc/self/fd", tty=tty, yield_time_s=5)
                # 3 is the directory ls reads.
                assert update.output.split() == ["0", "1", "2", "3"], update.output
    finally:
        os.close(leak_r)
        os.close(leak_w)


async def test_signals_this_process_ignores_are_default_again_in_the_command(
    tmp_path: Path, path: str
) -> None:
    before = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGQUIT)}
    try:
        async with UnixLocalSession(workdir=tmp_path) as s:
            for tty in (True, False):
                update = await s.pty_exec_start(
                    "exec grep SigIgn /proc/self/status", tty=tty, yield_time_s=5
                )
                mask = int(update.output.split()[1], 16)
                for sig in (signal.SIGINT, signal.SIGQUIT, signal.SIGPIPE):
                    assert not mask & (1 << (sig - 1)), (sig, update.output)
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


async def test_start_errors_name_the_program_and_the_directory(tmp_path: Path, path: str) -> None:
    async with UnixLocalSession(workdir=tmp_path) as s:
        with pytest.raises(sandbox.SandboxError, match="no-such-program-xyz"):
            await s.pty_exec_start("no-such-program-xyz", shell=False, tty=True)
        with pytest.raises(sandbox.SandboxError, match="no-such-dir"):
            await s.exec("true", cwd="no-such-dir")
        (tmp_path / "plain").write_text("not a program")
        with pytest.raises(sandbox.SandboxError, match="plain"):
            await s.exec("./plain", shell=False)
        # Nothing of the failed starts is left behind, and the session still runs.
        assert (await s.exec("echo", "ok", shell=False)).stdout == b"ok\n"


async def test_many_starts_leak_no_fd_and_no_child(tmp_path: Path, path: str) -> None:
    async with UnixLocalSession(workdir=tmp_path) as s:
        await s.pty_exec_start("true", tty=True)
        fds, kids = open_fds(), children_of_me()
        for i in range(40):
            update = await s.pty_exec_start("true", tty=i % 2 == 0)
            assert update.exit_code == 0
        assert open_fds() == fds
        assert children_of_me() == kids


@pytest.mark.skipif(HELPER is None, reason=SKIP_HELPER or "")
async def test_the_helper_starts_processes_inside_their_leaf(tmp_path: Path) -> None:
    with _helper_state(HELPER):
        async with UnixLocalSession(workdir=tmp_path) as s:
            if s.containment != "cgroup":
                pytest.skip("no cgroup can be made here")
            cgroup = s._cgroup
            assert cgroup is not None
            for tty in (True, False):
                update = await s.pty_exec_start("cat /proc/self/cgroup", tty=tty, yield_time_s=5)
                line = next(x for x in update.output.splitlines() if x.startswith("0::"))
                assert os.path.basename(cgroup.path) + "/p" in line, line
            # The helper never moved this process (no hop): it stayed where it was.
            own = next(
                x for x in Path("/proc/self/cgroup").read_text().splitlines() if x[:3] == "0::"
            )
            assert os.path.basename(cgroup.path) not in own


@pytest.mark.skipif(HELPER is None, reason=SKIP_HELPER or "")
def test_a_refused_clone3_is_reported_not_run(tmp_path: Path) -> None:
    assert HELPER is not None
    # A plain directory is no cgroup: clone3 fails, and the caller falls back.
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with pytest.raises(sh.CloneRefused):
            HELPER.spawn(
                ["true"],
                env={"PATH": os.defpath},
                cwd=None,
                fds=(-1, 1, 2),
                tty=False,
                cgroup_fd=fd,
            )
    finally:
        os.close(fd)


@pytest.mark.skipif(HELPER is None, reason=SKIP_HELPER or "")
def test_bad_strings_are_refused_before_the_start() -> None:
    assert HELPER is not None
    env = {"PATH": os.defpath}
    with pytest.raises(ValueError, match="null"):
        HELPER.spawn(["echo", "a\0b"], env=env, cwd=None, fds=(-1, 1, 2), tty=False)
    with pytest.raises(ValueError, match="variable name"):
        HELPER.spawn(["true"], env={"A=B": "1"}, cwd=None, fds=(-1, 1, 2), tty=False)


async def test_each_start_sees_the_host_environment_of_its_moment(
    tmp_path: Path, path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The decoded copy of os.environ is reused between starts (`local.host_env`): a
    # change, a removal or an undecodable value must still reach the next start.
    async with sandbox.open_session("unix_local", workdir=tmp_path / "ws") as s:
        monkeypatch.setenv("SANDBOX_ENV_PROBE", "one")
        first = await s.pty_exec_start('printf "%s" "$SANDBOX_ENV_PROBE"')
        monkeypatch.setenv("SANDBOX_ENV_PROBE", "two é")
        second = await s.pty_exec_start('printf "%s" "$SANDBOX_ENV_PROBE"')
        monkeypatch.delenv("SANDBOX_ENV_PROBE")
        third = await s.pty_exec_start('printf "%s" "${SANDBOX_ENV_PROBE-unset}"')
        os.environb[b"SANDBOX_ENV_RAW"] = b"\xff\xfe"
        try:
            raw = await s.exec('printf "%s" "$SANDBOX_ENV_RAW" | od -An -tx1')
        finally:
            del os.environb[b"SANDBOX_ENV_RAW"]
    assert [first.output, second.output, third.output] == ["one", "two é", "unset"]
    assert raw.stdout.split() == [b"ff", b"fe"]
