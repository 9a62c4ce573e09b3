"""Live suite for the `e2b` backend: runs against the real E2B service.

Runs only with `-m integration` (`make test-integration`) and `E2B_API_KEY`; otherwise
every test skips and says why. One sandbox (template `E2B_TEST_TEMPLATE`, default the
SDK's `base`) serves the whole module and is always killed at the end; a short sandbox
lifetime is the backstop should that kill never run.
"""

from __future__ import annotations

import asyncio
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
    if importlib.util.find_spec("e2b") is None:
        return "the e2b SDK is not installed (pip install 'agent-sandbox-pty[e2b]')"
    if not os.environ.get("E2B_API_KEY"):
        return "no E2B credentials: set E2B_API_KEY to run the live E2B suite"
    return None


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def live() -> AsyncIterator[sandbox.BaseSandboxSession]:
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    from e2b import AsyncSandbox

    session = sandbox.open_session(
        "e2b", template=os.environ.get("E2B_TEST_TEMPLATE") or None, sandbox_timeout_s=900
    )
    sandbox_id = None
    try:
        await session.start()
        sandbox_id = session.sandbox_id  # type: ignore[attr-defined]
        yield session
    finally:
        await session.aclose()
        if sandbox_id is not None:
            # The close killed it: a second kill finds nothing (and would clean up if not).
            assert await AsyncSandbox.kill(sandbox_id) is False


def marker() -> str:
    return str(600_000 + secrets.randbelow(300_000))


async def alive(session: sandbox.BaseSandboxSession, mark: str) -> int:
    """How many processes in the sandbox run `sleep <mark>` (the bracket keeps grep from
    matching itself)."""
    script = (
        "for f in /proc/[0-9]*/cmdline; do tr '\\000' ' ' <\"$f\" 2>/dev/null; echo; done"
        f" | grep -c 'slee[p] {mark}' || true"
    )
    result = await session.exec(script)
    return int(result.stdout.strip() or b"0")


async def eventually_none(session: sandbox.BaseSandboxSession, mark: str) -> bool:
    for _ in range(50):
        if await alive(session, mark) == 0:
            return True
        await asyncio.sleep(0.2)
    return False


async def test_exec(live: sandbox.BaseSandboxSession) -> None:
    result = await live.exec("echo out; echo err >&2; exit 7")
    assert result == sandbox.ExecResult(stdout=b"out\n", stderr=b"err\n", exit_code=7)
    result = await live.exec("echo $GREETING; pwd", env={"GREETING": "hola"}, cwd="/tmp")
    assert result.stdout == b"hola\n/tmp\n"
    result = await live.exec("printf", "%s|", "a b", "$HOME", shell=False)
    assert result.stdout == b"a b|$HOME|"
    result = await live.exec(r"printf 'x\303'; sleep 0.3; printf '\251y'")
    assert result.stdout == "x\u00e9y".encode()


async def test_exec_timeout_kills_the_tree_not_the_sandbox(
    live: sandbox.BaseSandboxSession,
) -> None:
    mark = marker()
    started = time.monotonic()
    with pytest.raises(sandbox.ExecTimeoutError) as info:
        await live.exec(f"echo before; sleep {mark} & sleep {mark}; wait", timeout=2)
    assert time.monotonic() - started < 30
    assert b"before" in info.value.stdout
    assert await eventually_none(live, mark)
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
    ("command", "code"), [("true", 0), ("exit 3", 3), ("kill -9 $$", 137), ("kill -TERM $$", 143)]
)
async def test_exit_codes(
    live: sandbox.BaseSandboxSession, command: str, code: int, tty: bool
) -> None:
    update = await live.pty_exec_start(command, tty=tty, yield_time_s=20)
    assert update.process_id is None
    assert update.exit_code == code
    assert update.output == ""  # nothing the shell trap added shows


async def test_terminal_round_trip_resize_and_interrupt(live: sandbox.BaseSandboxSession) -> None:
    update = await live.pty_exec_start("echo ready; exec cat", tty=True, until="ready")
    assert update.output == "ready\r\n"
    pid = update.process_id
    assert pid is not None
    update = await live.pty_write_stdin(pid, "ping\n", until=re.compile(r"ping\r?\n.*ping", re.S))
    assert update.output.count("ping") == 2
    await live.pty_interrupt(pid)
    final = await live.pty_write_stdin(pid, "", yield_time_s=20)
    assert final.process_id is None and final.exit_code == 130

    update = await live.pty_exec_start(
        "echo ready; read x; stty size", tty=True, rows=24, cols=80, until="ready"
    )
    assert update.process_id is not None
    await live.pty_resize(update.process_id, rows=40, cols=120)
    final = await live.pty_write_stdin(update.process_id, "\n", until="40 120", yield_time_s=20)
    assert "40 120" in final.output
    await live.pty_terminate_all()


async def test_pipes_interrupt_and_stdin_closed(live: sandbox.BaseSandboxSession) -> None:
    mark = marker()
    update = await live.pty_exec_start(f"echo ready; exec sleep {mark}", until="ready")
    pid = update.process_id
    assert pid is not None
    with pytest.raises(sandbox.StdinClosedError):
        await live.pty_write_stdin(pid, "x\n")
    await live.pty_interrupt(pid)
    final = await live.pty_write_stdin(pid, "", yield_time_s=20)
    assert final.exit_code == 130
    assert await eventually_none(live, mark)


async def test_terminate_kills_whole_trees(live: sandbox.BaseSandboxSession) -> None:
    mark = marker()
    for tty in (True, False):
        await live.pty_exec_start(
            f"nohup sleep {mark} >/dev/null 2>&1 & echo ready; sleep {mark}; wait",
            tty=tty,
            until="ready",
        )
    assert await alive(live, mark) >= 4  # the sleeps (and the shells running them)
    await live.pty_terminate_all()
    assert live.pty_processes() == []
    assert await eventually_none(live, mark)


async def test_cancelled_start_leaves_nothing(live: sandbox.BaseSandboxSession) -> None:
    mark = marker()
    for tty in (True, False):
        task = asyncio.ensure_future(live.pty_exec_start(f"exec sleep {mark}", tty=tty))
        await asyncio.sleep(0.05)
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass
    assert live.pty_processes() == []
    assert await eventually_none(live, mark)
