"""Live suite for the `daytona` backend: runs against the real Daytona service.

Runs only with `-m integration` (`make test-integration`) and `DAYTONA_API_KEY` (plus
`DAYTONA_API_URL` / `DAYTONA_TARGET` if your account needs them); otherwise every test
skips and says why. One sandbox serves the whole module and is always deleted at the end
(it is also created with a short auto-stop as a backstop). It checks what the fake can
only assume: how the daemon reports exit codes and signal deaths, that the interactive
shell of a PTY session is really trapped, and that the group kills reach everything.

The common flow is `LiveSuite` (tests/integration/live_flow.py).
"""

from __future__ import annotations

import pytest

import sandbox
from tests.integration.live_flow import LiveSuite, Requirements, live_session

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="module")]

REQUIRES = Requirements("Daytona", "daytona", {"daytona": "the daytona SDK"}, ("DAYTONA_API_KEY",))

live = live_session(
    REQUIRES,
    lambda: sandbox.open_session(
        "daytona",
        create_options={"auto_stop_interval": 15},  # a backstop should the delete never run
        teardown_timeout_s=60,
    ),
)


class TestDaytona(LiveSuite):
    exit_codes = (*LiveSuite.exit_codes, ("kill -TERM $$", 143))
    exec_timeout_s = 3.0
    kills_at_once = True
    tree_escape = "setsid"  # the group, session and descendants are all signalled

    async def test_exec_stdin_is_closed(self, live: sandbox.BaseSandboxSession) -> None:
        result = await live.exec("cat; echo after-cat")
        assert result.stdout == b"after-cat\n", "stdin of a command must be closed"
