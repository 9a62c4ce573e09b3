"""Live suite for the `e2b` backend: runs against the real E2B service.

Runs only with `-m integration` (`make test-integration`) and `E2B_API_KEY`; otherwise
every test skips and says why. One sandbox (template `E2B_TEST_TEMPLATE`, default the
SDK's `base`) serves the whole module and is always killed at the end; a short sandbox
lifetime is the backstop should that kill never run.

The common flow is `LiveSuite` (tests/integration/live_flow.py).
"""

from __future__ import annotations

import asyncio
import os
import re

import pytest

import sandbox
from tests.helpers import unique_seconds
from tests.integration.live_flow import LiveSuite, Requirements, assert_gone, live_session

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="module")]

REQUIRES = Requirements("E2B", "e2b", {"e2b": "the e2b SDK"}, ("E2B_API_KEY",))


async def _already_killed(sandbox_id: str) -> None:
    from e2b import AsyncSandbox

    # The close killed it: a second kill finds nothing (and would clean up if not).
    assert await AsyncSandbox.kill(sandbox_id) is False


live = live_session(
    REQUIRES,
    lambda: sandbox.open_session(
        "e2b", image=os.environ.get("E2B_TEST_TEMPLATE") or None, sandbox_timeout_s=900
    ),
    after_close=_already_killed,
)


class TestE2B(LiveSuite):
    exit_codes = (*LiveSuite.exit_codes, ("kill -TERM $$", 143))
    # A setsid child would leave the recorded process group: nohup stays in it.
    tree_escape = "nohup"

    async def test_exec_utf8_split_across_chunks(self, live: sandbox.BaseSandboxSession) -> None:
        result = await live.exec(r"printf 'x\303'; sleep 0.3; printf '\251y'")
        assert result.stdout == "x\u00e9y".encode()

    async def test_terminal_shows_only_output_and_interrupts(
        self, live: sandbox.BaseSandboxSession
    ) -> None:
        update = await live.pty_exec_start("echo ready; exec cat", tty=True, until="ready")
        assert update.output == "ready\r\n"
        pid = update.process_id
        assert pid is not None
        update = await live.pty_write_stdin(
            pid, "ping\n", until=re.compile(r"ping\r?\n.*ping", re.S)
        )
        assert update.output.count("ping") == 2
        await live.pty_interrupt(pid)
        final = await live.pty_write_stdin(pid, "", yield_time_s=20)
        assert final.process_id is None and final.exit_code == 130

    async def test_cancelled_start_leaves_nothing(self, live: sandbox.BaseSandboxSession) -> None:
        mark = unique_seconds()
        for tty in (True, False):
            task = asyncio.ensure_future(live.pty_exec_start(f"exec sleep {mark}", tty=tty))
            await asyncio.sleep(0.05)
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass
        assert live.pty_processes() == []
        await assert_gone(live, mark, at_once=False)
