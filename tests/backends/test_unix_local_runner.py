"""unix_local with `runner=True`: the same commands as the direct path, through the local
runner daemon; what it refuses; processes that outlive their client (detach, resume)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import sandbox
from sandbox.backends.toolkit.shell import TAG_VARIABLE
from sandbox.backends.unix_local import UnixLocalSession, confine
from sandbox.runner import unavailable_reason
from sandbox.testing.conformance import eventually
from tests.conftest import skip_or_fail
from tests.helpers import host_pids_with_arg, unique_seconds


@pytest.fixture(autouse=True)
def need_runner() -> None:
    reason = unavailable_reason()
    if reason is not None:
        skip_or_fail(f"no runner: {reason}")


@pytest.mark.parametrize(
    ("option", "value"),
    [("memory_limit_bytes", 1 << 28), ("process_limit", 64), ("cpu_limit", 1.0)],
)
def test_a_cgroup_limit_is_refused_not_dropped(option: str, value: object) -> None:
    with pytest.raises(sandbox.UnsupportedOperationError, match=option):
        UnixLocalSession(runner=True, **{option: value})  # type: ignore[arg-type]


@pytest.mark.parametrize("containment", ["cgroup", "tag"])
def test_a_containment_by_hand_is_refused(containment: str) -> None:
    with pytest.raises(sandbox.InvalidArgumentError, match="containment"):
        UnixLocalSession(runner=True, containment=containment)


def test_runner_must_be_a_bool() -> None:
    with pytest.raises(sandbox.InvalidArgumentError, match="runner"):
        UnixLocalSession(runner="yes")  # type: ignore[arg-type]


def _environment(output: bytes) -> dict[str, str]:
    pairs = (line.split("=", 1) for line in output.decode().split("\0") if "=" in line)
    # The direct path tags its processes (the runner contains them itself instead); the
    # shell sets a few variables of its own.
    return {k: v for k, v in pairs if k not in (TAG_VARIABLE, "SHLVL", "_")}


async def test_same_environment_and_cwd_as_the_direct_path(tmp_path: Path) -> None:
    (tmp_path / "ws" / "sub").mkdir(parents=True)
    seen = {}
    for runner in (False, True):
        async with sandbox.open_session(
            "unix_local", workdir=tmp_path / "ws", env={"EXTRA": "x y"}, runner=runner
        ) as s:
            one_shot = await s.exec("cat /proc/self/environ; pwd >&2", cwd="sub")
            pty = await s.pty_exec_start(
                "python3",
                "-c",
                "import os, sys; names = set(os.environ) - {sys.argv[1]}; "
                "print(len(names), os.environ['TERM'], os.getcwd())",
                TAG_VARIABLE,
                tty=True,
                yield_time_s=10,
            )
            seen[runner] = (_environment(one_shot.stdout), one_shot.stderr, pty.output)
    assert seen[True] == seen[False]
    env, cwd, _ = seen[True]
    assert env["EXTRA"] == "x y" and env["HOME"] == str(tmp_path / "ws")
    assert cwd == f"{tmp_path / 'ws' / 'sub'}\n".encode()


async def test_a_missing_program_or_cwd_is_the_same_error(tmp_path: Path) -> None:
    async with sandbox.open_session("unix_local", workdir=tmp_path / "ws", runner=True) as s:
        with pytest.raises(sandbox.SandboxError, match="no-such-program"):
            await s.pty_exec_start("no-such-program", shell=False)
        with pytest.raises(sandbox.SandboxError, match="nowhere"):
            await s.exec("true", cwd="nowhere")


async def test_confined_through_the_runner_is_the_same_jail(tmp_path: Path) -> None:
    ok, reason = confine.availability()
    if not ok:
        skip_or_fail(f"confinement unavailable: {reason}")
    outside = tmp_path / "outside"
    outside.mkdir()
    async with sandbox.open_session(
        "unix_local", workdir=tmp_path / "ws", confine=True, runner=True
    ) as s:
        result = await s.exec(f"ls {outside} 2>&1; echo rc=$?; echo $$; touch in-ws")
        lines = result.stdout.decode().split()
        assert "rc=0" not in lines  # the host's folders are hidden in the jail
        update = await s.pty_exec_start("echo $$", yield_time_s=10)
    assert (tmp_path / "ws" / "in-ws").exists()
    # Its own PID namespace: the command is a low pid there, not the host's.
    assert int(lines[-1]) < 10 and int(update.output.split()[0]) < 10


async def test_detach_keeps_processes_and_resume_replays_what_they_printed(
    tmp_path: Path,
) -> None:
    seconds = unique_seconds()
    async with sandbox.open_session(
        "unix_local", workdir=tmp_path / "ws", runner=True, output_limit_bytes=4096
    ) as s:
        assert s.keeps_processes
        talker = await s.pty_exec_start(
            f"echo first; while [ ! -e go ]; do sleep 0.02; done; head -c 100000 /dev/zero "
            f"| tr '\\0' x; echo; echo last; sleep {seconds}",
            tty=False,
            until="first",
            yield_time_s=10,
        )
        quitter = await s.pty_exec_start(
            "while [ ! -e go ]; do sleep 0.02; done; echo bye; exit 7", yield_time_s=0.1
        )
        ref = await s.detach()
    assert [p.running for p in ref.processes] == [True, True]
    (tmp_path / "ws" / "go").touch()
    async with sandbox.resume_session(ref) as resumed:
        assert resumed.keeps_processes
        late = await resumed.pty_write_stdin(talker.process_id, "", until="last", yield_time_s=30)
        # Past the ring (4096 bytes here): the omission marker, then its latest output.
        assert "first" not in late.output and "bytes of output omitted" in late.output
        assert late.output.rstrip().endswith("last") and late.exit_code is None
        ended = await resumed.pty_write_stdin(quitter.process_id, "", yield_time_s=30)
        assert "bye" in ended.output and ended.exit_code == 7
        # The shell starts its `sleep` just after printing "last": looked for until it is.
        assert await eventually(lambda: len(host_pids_with_arg(seconds)) == 1)
    assert host_pids_with_arg(seconds) == []


async def test_close_ends_the_processes_not_the_daemon(tmp_path: Path) -> None:
    seconds = unique_seconds()
    async with sandbox.open_session("unix_local", workdir=tmp_path / "ws", runner=True) as s:
        await s.pty_exec_start(f"setsid sleep {seconds} & sleep {seconds}", yield_time_s=0.2)
        [pid, _] = sorted(host_pids_with_arg(seconds))
        assert os.getpid() not in _ancestors(pid)  # the runner's, not this client's
    assert host_pids_with_arg(seconds) == []
    async with sandbox.open_session("unix_local", workdir=tmp_path / "ws", runner=True) as s:
        assert (await s.exec("echo", "again")).stdout == b"again\n"


def _ancestors(pid: int) -> set[int]:
    found = set()
    while pid > 1:
        with open(f"/proc/{pid}/stat") as f:
            pid = int(f.read().rsplit(")", 1)[1].split()[1])
        found.add(pid)
    return found


async def test_a_sigkilled_client_leaves_its_processes_to_the_next_one(tmp_path: Path) -> None:
    from tests.durable.crash import crash_with_a_process

    seconds = unique_seconds()
    ref_file = tmp_path / "ref.json"
    process_id = await crash_with_a_process(
        "unix_local",
        {"workdir": str(tmp_path / "ws"), "runner": True},
        ref_file,
        ["sh", "-c", f"echo before; read line; echo got $line; sleep {seconds}"],
        tty=True,
    )
    # Its client is gone; it waits for its line (so its sleep has not started yet).
    assert host_pids_with_arg(seconds) == []
    async with sandbox.resume_session(sandbox.read_ref_file(ref_file)) as s:
        [info] = s.pty_processes()
        assert info.process_id == process_id and info.running
        update = await s.pty_write_stdin(process_id, "it\n", until="got it", yield_time_s=30)
        assert "got it" in update.output
        # The shell printed before it forked the sleep: look until it did.
        assert await eventually(lambda: len(host_pids_with_arg(seconds)) == 1)
    assert await eventually(lambda: host_pids_with_arg(seconds) == [])
