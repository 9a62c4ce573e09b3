"""Live suite for the `daytona` backend: runs against the real Daytona service.

Runs only with `-m integration` (`make test-integration`) and `DAYTONA_API_KEY` (plus
`DAYTONA_API_URL` / `DAYTONA_TARGET` if your account needs them); otherwise every test
skips and says why. One sandbox serves the whole module and is always deleted at the end
(it is also created with a short auto-stop as a backstop). It checks what the fake can
only assume: how the daemon reports exit codes and signal deaths, that the interactive
shell of a PTY session is really trapped, and that the group kills reach everything.
"""

from __future__ import annotations

import importlib.util
import os
import re
import secrets
import time
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

import sandbox

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="module")]


def _skip_reason() -> str | None:
    if importlib.util.find_spec("daytona") is None:
        return "the daytona SDK is not installed (pip install 'agent-sandbox-pty[daytona]')"
    if not os.environ.get("DAYTONA_API_KEY"):
        return "no Daytona credentials: set DAYTONA_API_KEY to run the live Daytona suite"
    return None


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def live() -> AsyncIterator[sandbox.BaseSandboxSession]:
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    session = sandbox.open_session(
        "daytona",
        create_options={"auto_stop_interval": 15},  # a backstop should the delete never run
        teardown_timeout_s=60,
    )
    try:
        await session.start()
        yield session
    finally:
        await session.aclose()


def marker() -> str:
    return str(600_000 + secrets.randbelow(300_000))


async def alive(session: sandbox.BaseSandboxSession, mark: str) -> int:
    """How many processes in the sandbox are `sleep <mark>` (not shells whose command
    line mentions it; the bracket keeps the searching grep from matching itself)."""
    script = (
        "for f in /proc/[0-9]*/cmdline; do tr '\\000' ' ' <\"$f\" 2>/dev/null; echo; done"
        f" | grep -c '^slee[p] {mark} *$' || true"
    )
    result = await session.exec(script)
    return int(result.stdout.strip() or b"0")


async def test_exec(live: sandbox.BaseSandboxSession) -> None:
    result = await live.exec("echo out; echo err >&2; exit 7")
    assert result == sandbox.ExecResult(stdout=b"out\n", stderr=b"err\n", exit_code=7)
    result = await live.exec("echo $GREETING; pwd", env={"GREETING": "hola"}, cwd="/tmp")
    assert result.stdout == b"hola\n/tmp\n"
    result = await live.exec("printf", "%s|", "a b", "$HOME", shell=False)
    assert result.stdout == b"a b|$HOME|"
    result = await live.exec("cat; echo after-cat")
    assert result.stdout == b"after-cat\n", "stdin of a command must be closed"


async def test_exec_timeout_kills_the_command_not_the_sandbox(
    live: sandbox.BaseSandboxSession,
) -> None:
    mark = marker()
    started = time.monotonic()
    with pytest.raises(sandbox.ExecTimeoutError) as info:
        await live.exec(f"echo before; sleep {mark} & sleep {mark}; wait", timeout=3)
    assert time.monotonic() - started < 30
    assert b"before" in info.value.stdout
    assert await alive(live, mark) == 0
    assert (await live.exec("echo still-here")).stdout == b"still-here\n"


async def test_files(live: sandbox.BaseSandboxSession) -> None:
    payload = bytes(range(256)) * 64
    await live.write_file("sub/dir/data.bin", payload)
    assert await live.read_file("sub/dir/data.bin") == payload
    assert (await live.exec("wc -c < sub/dir/data.bin")).stdout.strip() == b"16384"
    with pytest.raises(sandbox.SandboxFileNotFoundError):
        await live.read_file("no/such/file")


@pytest.mark.parametrize("tty", [True, False], ids=["tty", "pipes"])
@pytest.mark.parametrize(
    ("command", "code"),
    [("true", 0), ("exit 3", 3), ("kill -9 $$", 137), ("kill -TERM $$", 143)],
)
async def test_exit_codes(
    live: sandbox.BaseSandboxSession, command: str, code: int, tty: bool
) -> None:
    update = await live.pty_exec_start(command, tty=tty, yield_time_s=20)
    assert (update.process_id, update.exit_code) == (None, code)


async def test_nothing_added_shows_in_terminal_output(live: sandbox.BaseSandboxSession) -> None:
    update = await live.pty_exec_start("echo hi", tty=True, yield_time_s=20)
    assert (update.output, update.exit_code) == ("hi\r\n", 0)
    word = "y" * 3000
    update = await live.pty_exec_start(f"echo {word} | wc -c", tty=True, yield_time_s=20)
    assert update.output.strip() == "3001"


async def test_tty_round_trip_size_and_utf8(live: sandbox.BaseSandboxSession) -> None:
    update = await live.pty_exec_start("stty size", tty=True, rows=33, cols=91, yield_time_s=20)
    assert "33 91" in update.output
    update = await live.pty_exec_start(
        "echo ready; read x; stty size; exec cat", tty=True, until="ready", yield_time_s=20
    )
    pid = update.process_id
    assert pid is not None
    await live.pty_resize(pid, rows=40, cols=120)
    update = await live.pty_write_stdin(pid, "\n", until="40 120", yield_time_s=20)
    assert "40 120" in update.output
    update = await live.pty_write_stdin(
        pid, "h\u00e9llo\n", until=re.compile("h\u00e9llo\r?\n(.|\n)*h\u00e9llo"), yield_time_s=20
    )
    assert update.output.count("h\u00e9llo") == 2
    await live.pty_terminate(pid)


@pytest.mark.parametrize("tty", [True, False], ids=["tty", "pipes"])
async def test_interrupt(live: sandbox.BaseSandboxSession, tty: bool) -> None:
    mark = marker()
    update = await live.pty_exec_start(
        f"echo ready; exec sleep {mark}", tty=tty, until="ready", yield_time_s=20
    )
    pid = update.process_id
    assert pid is not None
    await live.pty_interrupt(pid)
    final = await live.pty_write_stdin(pid, "", yield_time_s=20)
    assert (final.process_id, final.exit_code) == (None, 130)


async def test_terminate_kills_the_tree(live: sandbox.BaseSandboxSession) -> None:
    marks = [marker(), marker()]
    pids = []
    for tty, mark in zip((True, False), marks, strict=True):
        update = await live.pty_exec_start(
            f"sleep {mark} & setsid sleep {mark} & echo ready; sleep {mark}; wait",
            tty=tty,
            until="ready",
            yield_time_s=20,
        )
        assert update.process_id is not None
        pids.append(update.process_id)
    for mark in marks:
        assert await alive(live, mark) == 3
    await live.pty_terminate(pids[0])
    assert await alive(live, marks[0]) == 0
    await live.pty_terminate_all()
    assert await alive(live, marks[1]) == 0
    assert live.pty_processes() == []


async def test_output_is_complete(live: sandbox.BaseSandboxSession) -> None:
    update = await live.pty_exec_start("seq 1 100000", yield_time_s=30)
    assert update.exit_code == 0
    assert update.output == "".join(f"{i}\n" for i in range(1, 100001))
