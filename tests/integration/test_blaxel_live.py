"""Live suite for the `blaxel` backend: runs against the real Blaxel service.

Runs only with `-m integration` (`make test-integration`) and both `BL_API_KEY` and
`BL_WORKSPACE`; otherwise every test skips and says why. One sandbox serves the whole
module and is deleted at the end (a one-hour TTL is the backstop should that never run).
Optional: `BL_TEST_IMAGE` (sandbox image), `BL_REGION` (region), `BL_TEST_WORKDIR`
(working directory, default `/workspace`), `BL_TEST_API_URL` (another control-plane URL,
e.g. a `BlaxelServer` for a dry run of this suite).
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
    for module in ("blaxel", "aiohttp"):
        if importlib.util.find_spec(module) is None:
            return f"{module} is not installed (pip install 'agent-sandbox-pty[blaxel]')"
    missing = [v for v in ("BL_API_KEY", "BL_WORKSPACE") if not os.environ.get(v)]
    if missing:
        return f"no Blaxel credentials: set {' and '.join(missing)} to run the live Blaxel suite"
    return None


def _options() -> dict[str, object]:
    options: dict[str, object] = {
        "name": f"sbx-live-{secrets.token_hex(4)}",
        "ttl": "1h",
        "terminate_grace_s": 0.5,
    }
    for env, option in (
        ("BL_TEST_IMAGE", "image"),
        ("BL_REGION", "region"),
        ("BL_TEST_WORKDIR", "workdir"),
        ("BL_TEST_API_URL", "api_url"),
    ):
        if os.environ.get(env):
            options[option] = os.environ[env]
    return options


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def live() -> AsyncIterator[sandbox.BaseSandboxSession]:
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    session = sandbox.open_session("blaxel", **_options())
    async with session:
        yield session


def _unique() -> str:
    return str(600_000 + secrets.randbelow(300_000))


async def _pids_with_arg(session: sandbox.BaseSandboxSession, arg: str) -> list[str]:
    """Pids of `sleep <arg>` processes in the sandbox (an exact argv match, so the
    script looking for them does not find itself)."""
    script = (
        "for d in /proc/[0-9]*; do "
        "c=$(tr '\\000' ' ' < \"$d/cmdline\" 2>/dev/null); "
        f'[ "$c" = "sleep {arg} " ] && echo "${{d#/proc/}}"; '
        "done; true"
    )
    return (await session.exec(script)).stdout.decode().split()


async def test_exec(live: sandbox.BaseSandboxSession) -> None:
    result = await live.exec("echo out; echo err >&2; exit 7")
    assert (result.stdout, result.stderr, result.exit_code) == (b"out\n", b"err\n", 7)
    result = await live.exec("echo $GREETING; pwd", env={"GREETING": "hola"}, cwd="/")
    assert result.stdout == b"hola\n/\n"
    result = await live.exec("printf", "%s|", "a b", "$HOME", shell=False)
    assert result.stdout == b"a b|$HOME|"


async def test_exec_timeout(live: sandbox.BaseSandboxSession) -> None:
    marker = _unique()
    started = time.monotonic()
    with pytest.raises(sandbox.ExecTimeoutError):
        await live.exec(f"echo before; sleep {marker} & sleep {marker}; wait", timeout=2)
    assert time.monotonic() - started < 30
    assert (await live.exec("echo still-here")).stdout == b"still-here\n"


async def test_files(live: sandbox.BaseSandboxSession) -> None:
    payload = bytes(range(256)) * 400
    await live.write_file("sub/dir/data.bin", payload)
    assert await live.read_file("sub/dir/data.bin") == payload
    assert (await live.exec("wc -c < sub/dir/data.bin")).stdout.strip() == b"102400"
    with pytest.raises(sandbox.SandboxFileNotFoundError):
        await live.read_file("no/such/file")


@pytest.mark.parametrize("tty", [True, False], ids=["tty", "pipes"])
@pytest.mark.parametrize(("command", "code"), [("true", 0), ("exit 3", 3), ("kill -9 $$", 137)])
async def test_exit_codes_come_back(
    live: sandbox.BaseSandboxSession, command: str, code: int, tty: bool
) -> None:
    update = await live.pty_exec_start(command, tty=tty, yield_time_s=20)
    assert (update.process_id, update.exit_code, update.output) == (None, code, "")


async def test_tty_echo_and_size(live: sandbox.BaseSandboxSession) -> None:
    update = await live.pty_exec_start("stty size", tty=True, rows=33, cols=91, yield_time_s=20)
    assert "33 91" in update.output
    update = await live.pty_exec_start("echo ready; exec cat", tty=True, until="ready")
    assert update.process_id is not None
    reply = await live.pty_write_stdin(
        update.process_id, "ping\n", until=re.compile(r"ping\r?\n(.|\n)*ping"), yield_time_s=20
    )
    assert reply.output.count("ping") == 2
    with pytest.raises(sandbox.UnsupportedOperationError):
        await live.pty_resize(update.process_id, rows=40, cols=120)
    await live.pty_terminate(update.process_id)


@pytest.mark.parametrize("tty", [True, False], ids=["tty", "pipes"])
async def test_interrupt(live: sandbox.BaseSandboxSession, tty: bool) -> None:
    marker = _unique()
    update = await live.pty_exec_start(f"echo ready; exec sleep {marker}", tty=tty, until="ready")
    assert update.process_id is not None
    await live.pty_interrupt(update.process_id)
    final = await live.pty_write_stdin(update.process_id, "", yield_time_s=20)
    assert (final.process_id, final.exit_code) == (None, 130)


async def test_terminate_leaves_nothing(live: sandbox.BaseSandboxSession) -> None:
    marker = _unique()
    update = await live.pty_exec_start(
        f"sleep {marker} & echo ready; sleep {marker}; wait", tty=True, until="ready"
    )
    assert update.process_id is not None
    assert await _pids_with_arg(live, marker)
    await live.pty_terminate(update.process_id)
    deadline = time.monotonic() + 20
    while await _pids_with_arg(live, marker):
        assert time.monotonic() < deadline, "terminate left processes behind"


async def test_bad_key_is_refused_and_not_retryable() -> None:
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    session = sandbox.open_session("blaxel", api_key="bl-not-a-real-key", **_options())
    with pytest.raises(sandbox.ProviderError) as info:
        await session.start()
    assert not info.value.retryable
    assert "bl-not-a-real-key" not in str(info.value)


async def test_close_deletes_the_sandbox() -> None:
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    from blaxel.core.sandbox import SandboxInstance

    options = _options()
    async with sandbox.open_session("blaxel", **options) as session:
        assert (await session.exec("true")).ok
    try:
        box = await SandboxInstance.get(str(options["name"]))
    except Exception as exc:  # gone already
        assert getattr(exc, "status_code", None) == 404 or getattr(exc, "status", None) == 404
    else:
        assert str(box.status) in ("TERMINATED", "DELETING")
