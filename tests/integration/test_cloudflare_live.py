"""Live suite for the `cloudflare` backend: runs against a real, user-deployed Sandbox
Worker.

Runs only with `-m integration` (`make test-integration`) and both
`CLOUDFLARE_SANDBOX_WORKER_URL` and `CLOUDFLARE_SANDBOX_API_KEY`; otherwise every test
skips and says why. Each test creates its own sandbox and deletes it on close.
"""

from __future__ import annotations

import importlib.util
import os
import time

import pytest

import sandbox

pytestmark = pytest.mark.integration

URL_ENV = "CLOUDFLARE_SANDBOX_WORKER_URL"
KEY_ENV = "CLOUDFLARE_SANDBOX_API_KEY"


def _skip_reason() -> str | None:
    if importlib.util.find_spec("aiohttp") is None:
        return "aiohttp is not installed (pip install 'agent-sandbox-pty[cloudflare]')"
    missing = [name for name in (URL_ENV, KEY_ENV) if not os.environ.get(name)]
    if missing:
        return f"no Cloudflare Worker configured: set {' and '.join(missing)} to run this suite"
    return None


@pytest.fixture(autouse=True)
def _needs_worker() -> None:
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)


async def test_exec_files_and_timeout() -> None:
    async with sandbox.open_session("cloudflare") as s:
        result = await s.exec("echo out; echo err >&2; exit 3")
        assert (result.stdout, result.stderr, result.exit_code) == (b"out\n", b"err\n", 3)
        assert (await s.exec("printf '%s|' a 'b c'", cwd="/", env={"X": "1"})).stdout == (b"a|b c|")
        payload = bytes(range(256)) * 64
        await s.write_file("live/probe.bin", payload)
        assert await s.read_file("live/probe.bin") == payload
        with pytest.raises(sandbox.SandboxFileNotFoundError):
            await s.read_file("live/missing.bin")
        started = time.monotonic()
        with pytest.raises(sandbox.ExecTimeoutError):
            await s.exec("echo before; sleep 60", timeout=3)
        assert time.monotonic() - started < 20
        assert (await s.exec("echo alive")).stdout == b"alive\n", "the sandbox survived"


@pytest.mark.parametrize("tty", [True, False], ids=["tty", "pipes"])
async def test_pty_exit_codes_and_interrupt(tty: bool) -> None:
    async with sandbox.open_session("cloudflare") as s:
        for command, code in (("true", 0), ("exit 3", 3), ("kill -9 $$", 137)):
            update = await s.pty_exec_start(command, tty=tty, yield_time_s=20)
            assert (update.process_id, update.exit_code) == (None, code), command
        update = await s.pty_exec_start("echo hello", tty=tty, yield_time_s=20)
        assert update.output.replace("\r", "") == "hello\n", "nothing added shows up"
        update = await s.pty_exec_start("echo ready; exec sleep 60", tty=tty, until="ready")
        assert update.process_id is not None
        await s.pty_interrupt(update.process_id)
        final = await s.pty_write_stdin(update.process_id, "", yield_time_s=15)
        assert (final.process_id, final.exit_code) == (None, 130)


async def test_pty_round_trip_and_resize() -> None:
    async with sandbox.open_session("cloudflare") as s:
        update = await s.pty_exec_start(
            "echo ready; read x; stty size; exec cat", tty=True, until="ready"
        )
        pid = update.process_id
        assert pid is not None
        await s.pty_resize(pid, rows=40, cols=120)
        update = await s.pty_write_stdin(pid, "\n", until="40 120", yield_time_s=15)
        assert "40 120" in update.output
        update = await s.pty_write_stdin(pid, "ping\n", until="ping\r\nping", yield_time_s=15)
        assert update.output.count("ping") == 2
        await s.pty_terminate(pid)
        assert s.pty_processes() == []


async def test_wrong_key_is_an_auth_error_without_the_key() -> None:
    wrong = "definitely-not-the-key-0c1d"
    session = sandbox.open_session("cloudflare", api_key=wrong)
    with pytest.raises(sandbox.ProviderError) as info:
        await session.start()
    assert not info.value.retryable
    assert wrong not in str(info.value) and wrong not in repr(session)
