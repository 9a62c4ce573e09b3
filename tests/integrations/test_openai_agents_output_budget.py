"""The Agents SDK `Terminal` capability: `send_keys` answers fit a model's context unless
the call asks for more (the same budget as `sandbox mcp`: `MODEL_OUTPUT_TOKENS`, head
and tail kept around the library's omission marker).

The SDK's real `Runner.run` drives a scripted model over a unix_local session, as in
test_openai_agents.py.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("agents.sandbox", reason="the openai-agents extra is not installed")

from sandbox.backends.unix_local import UnixLocalSession
from sandbox.integrations.openai_agents import AgentsSessionAdapter
from sandbox.output.model_budget import MODEL_OUTPUT_TOKENS
from sandbox.output.truncation import BYTES_PER_TOKEN
from sandbox.testing.openai_agents_model import ScriptedModel, call, say
from tests.integrations.test_openai_agents import last, run, session_id_in

LAST_LINE = "300000"  # no smaller number holds it: its first sight ends the window
# About 2 MB of numbered lines once a line is typed; the process then stays.
FLOOD = f"read x; seq 1 {LAST_LINE}; exec cat"
MARKER = re.compile(r"…\d+ tokens truncated…")
HEAD = re.compile(r"\n\ngo\r\n1\r\n2\r\n3\r\n")  # after the line-count prefix
MARKER_SLACK = 64


async def send_keys_output(adapter: AgentsSessionAdapter, **send_keys: Any) -> str:
    """The output a model reads from `send_keys` typing a line into FLOOD."""
    model = ScriptedModel(
        [
            lambda _: [call("exec_command", cmd=FLOOD, tty=True, yield_time_ms=250)],
            lambda out: [
                call(
                    "send_keys",
                    session_id=session_id_in(last(out)),
                    chars="go\n",
                    until=LAST_LINE,
                    yield_time_ms=30_000,
                    **send_keys,
                )
            ],
            lambda out: [say("done")],
        ]
    )
    await run(model, adapter, terminal=True)
    answer = model.outputs[-1][-1]
    assert answer.startswith("Process running with session ID"), answer[:200]
    return answer.split("\nOutput:\n", 1)[1]


def assert_head_and_tail(output: str, budget_tokens: int) -> None:
    # The budget holds the head and the tail; the marker's few bytes come on top.
    assert len(output.encode()) <= budget_tokens * BYTES_PER_TOKEN + MARKER_SLACK
    assert MARKER.search(output), output[:200]
    assert HEAD.search(output[:300]), output[:300]
    assert output.rstrip().endswith(LAST_LINE)


async def test_send_keys_cuts_a_flood_to_the_default_budget_unless_asked(
    tmp_path: Path,
) -> None:
    async with UnixLocalSession(workdir=tmp_path) as session:
        adapter = await AgentsSessionAdapter.around(session)
        output = await send_keys_output(adapter)
        assert_head_and_tail(output, MODEL_OUTPUT_TOKENS)
        assert len(output.encode()) > MODEL_OUTPUT_TOKENS * BYTES_PER_TOKEN * 9 // 10

        raised = await send_keys_output(adapter, max_output_tokens=50_000)
        assert_head_and_tail(raised, 50_000)
        assert len(raised) > 4 * len(output)
        await adapter.pty_terminate_all()
