"""Live suite for the `modal` backend: runs against the real Modal service.

Runs only with `-m integration` (`make test-integration`) and Modal credentials
(`MODAL_TOKEN_ID` and `MODAL_TOKEN_SECRET`); otherwise every test skips and says why.
One sandbox serves the whole module and is always terminated at the end. The app name
can be set with `MODAL_TEST_APP` (default `agent-sandbox-pty-tests`).

The common flow is `LiveSuite` (tests/integration/live_flow.py).
"""

from __future__ import annotations

import os

import pytest

import sandbox
from tests.integration.live_flow import LiveSuite, Requirements, live_session

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="module")]

REQUIRES = Requirements(
    "Modal", "modal", {"modal": "the modal SDK"}, ("MODAL_TOKEN_ID", "MODAL_TOKEN_SECRET")
)

live = live_session(
    REQUIRES,
    lambda: sandbox.open_session(
        "modal",
        app_name=os.environ.get("MODAL_TEST_APP", "agent-sandbox-pty-tests"),
        sandbox_timeout_s=900,  # a backstop should the terminate below never run
    ),
)


class TestModal(LiveSuite):
    can_resize = False  # the SDK has no resize
    kills_at_once = True
    tree_escape = "setsid"  # every process carrying the command's token is signalled
