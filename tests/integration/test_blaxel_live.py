"""Live suite for the `blaxel` backend: runs against the real Blaxel service.

Runs only with `-m integration` (`make test-integration`) and both `BL_API_KEY` and
`BL_WORKSPACE`; otherwise every test skips and says why. One sandbox serves the whole
module and is deleted at the end (a one-hour TTL is the backstop should that never run).
Optional: `BL_TEST_IMAGE` (sandbox image), `BL_REGION` (region), `BL_TEST_WORKDIR`
(working directory, default `/workspace`), `BL_TEST_API_URL` (another control-plane URL,
e.g. a `BlaxelServer` for a dry run of this suite).

The common flow is `LiveSuite` (tests/integration/live_flow.py).
"""

from __future__ import annotations

import os
import secrets

import pytest

import sandbox
from tests.integration.live_flow import LiveSuite, Requirements, live_session

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="module")]

REQUIRES = Requirements(
    "Blaxel", "blaxel", {"blaxel": "blaxel", "aiohttp": "aiohttp"}, ("BL_API_KEY", "BL_WORKSPACE")
)


def _options() -> dict[str, object]:
    options: dict[str, object] = {
        "sandbox_id": f"sbx-live-{secrets.token_hex(4)}",
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


live = live_session(REQUIRES, lambda: sandbox.open_session("blaxel", **_options()))


class TestBlaxel(LiveSuite):
    timeout_kills_tree = False  # never checked on the real service (the loopback passes)

    async def test_a_long_silent_exec_outlives_the_edge_cut(
        self, live: sandbox.BaseSandboxSession
    ) -> None:
        # The edge answers 504 to a request silent for about 60 s (SDK docstring of
        # `SandboxProcess.exec`); the session follows the process to its end.
        result = await live.exec("sleep 75; echo done; exit 3", timeout=150)
        assert result == sandbox.ExecResult(stdout=b"done\n", stderr=b"", exit_code=3)

    @pytest.mark.parametrize(("kill", "status"), [("kill -TERM $$", 143), ("kill -9 $$", 137)])
    async def test_one_shot_signal_exit_codes(
        self, live: sandbox.BaseSandboxSession, kill: str, status: int
    ) -> None:
        # The server reports -1 (Go's ExitCode()); the wrapper makes it 128+N.
        result = await live.exec(f"echo before; {kill}")
        assert result == sandbox.ExecResult(stdout=b"before\n", stderr=b"", exit_code=status)

    async def test_split_utf8_becomes_one_replacement_per_byte(
        self, live: sandbox.BaseSandboxSession
    ) -> None:
        # The terminal sends each 4096-byte PTY read through Go's JSON encoder: the bytes
        # of a character split between reads become U+FFFD, one each, never more.
        count = 20000
        update = await live.pty_exec_start(
            f"yes \"$(printf '\\342\\202\\254')\" | head -n {count} | tr -d '\\n'",
            tty=True,
            yield_time_s=60,
            max_output_tokens=None,
        )
        assert (update.process_id, update.exit_code) == (None, 0)
        assert set(update.output) <= {"\u20ac", "\ufffd"}
        assert update.output.count("\u20ac") * 3 + update.output.count("\ufffd") == 3 * count

    async def test_bad_key_is_refused_and_not_retryable(self) -> None:
        REQUIRES.skip_if_missing()
        session = sandbox.open_session("blaxel", api_key="bl-not-a-real-key", **_options())
        with pytest.raises(sandbox.ProviderError) as info:
            await session.start()
        assert not info.value.retryable
        assert "bl-not-a-real-key" not in str(info.value)

    async def test_close_deletes_the_sandbox(self) -> None:
        REQUIRES.skip_if_missing()
        from blaxel.core.sandbox import SandboxInstance

        options = _options()
        async with sandbox.open_session("blaxel", **options) as session:
            assert (await session.exec("true")).ok
        try:
            box = await SandboxInstance.get(str(options["sandbox_id"]))
        except Exception as exc:  # gone already
            assert getattr(exc, "status_code", None) == 404 or getattr(exc, "status", None) == 404
        else:
            assert str(box.status) in ("TERMINATED", "DELETING")

    async def test_detach_and_resume_reattach_a_terminal_session(self) -> None:
        # The facts docs/providers.md (Blaxel, durable sessions) takes from the server's
        # source: a terminal session outlives its socket, a reconnect by `sessionId`
        # replays its ring, and the lingering wrapper keeps a finished command's exit.
        REQUIRES.skip_if_missing()
        async with sandbox.open_session("blaxel", **_options()) as first:
            running = await first.pty_exec_start(
                "echo one; while [ ! -e go-live ]; do sleep 0.1; done; echo two; sleep 2; exit 6",
                yield_time_s=30,
                until="one",
            )
            ref = await first.detach()
        assert os.environ["BL_API_KEY"] not in ref.to_json()
        async with sandbox.resume_session(ref) as resumed:
            assert [p.process_id for p in resumed.pty_processes()] == [running.process_id]
            await resumed.write_file("go-live", b"")
            last = await resumed.pty_write_stdin(running.process_id, "", yield_time_s=60)
            assert "two" in last.output and "one" not in last.output
            assert last.exit_code == 6
