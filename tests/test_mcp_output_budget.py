"""`sandbox mcp`: a tool answer fits a model's context unless the call asks for more.

The tools truncate a window's output to `MODEL_OUTPUT_TOKENS` by default (head and tail
kept around the library's omission marker); `max_output_tokens` raises it per call, up
to `MAX_MODEL_OUTPUT_TOKENS`. Driven through the SDK's in-process client over a real
unix_local session.
"""

from __future__ import annotations

import re
from pathlib import Path

from sandbox.backends.unix_local import UnixLocalSession
from sandbox.output.model_budget import (
    MAX_MODEL_OUTPUT_TOKENS,
    MODEL_OUTPUT_TOKENS,
    model_output_tokens,
)
from sandbox.output.truncation import BYTES_PER_TOKEN
from tests.test_mcp import in_process, ok, session_id

# About 2 MB of numbered lines: the first and the last are known.
FLOOD = "seq 1 300000"
LAST_LINE = "300000"  # no smaller number holds it: its first sight ends the window
MARKER = re.compile(r"…\d+ tokens truncated…")
MARKER_SLACK = 64
HEAD = re.compile(r"\n\n(go\r\n)?1\r?\n2\r?\n3\r?\n")  # after the line-count prefix


def output_of(answer: str) -> str:
    """The output part of a tool's answer (after its `Output:` line)."""
    return answer.split("\nOutput:\n", 1)[1]


def assert_head_and_tail(output: str, budget_tokens: int) -> None:
    # The budget holds the head and the tail; the marker's few bytes come on top.
    assert len(output.encode()) <= budget_tokens * BYTES_PER_TOKEN + MARKER_SLACK
    assert MARKER.search(output), output[:200]
    assert HEAD.search(output[:300]), output[:300]
    assert output.rstrip().endswith(LAST_LINE)


async def test_a_flood_is_cut_to_the_default_budget_head_and_tail_kept(tmp_path: Path) -> None:
    async with in_process(UnixLocalSession(workdir=tmp_path)) as client:
        answer = await ok(client, "exec_command", cmd=FLOOD, until=LAST_LINE + "\n")
        assert re.search(r"Original token count: \d{6}", answer)  # ~1 MiB kept, cut
        output = output_of(answer)
        assert_head_and_tail(output, MODEL_OUTPUT_TOKENS)
        assert len(output.encode()) > MODEL_OUTPUT_TOKENS * BYTES_PER_TOKEN * 9 // 10

        # The same call asking for more gets more, cut the same way.
        answer = await ok(
            client, "exec_command", cmd=FLOOD, until=LAST_LINE + "\n", max_output_tokens=50_000
        )
        raised = output_of(answer)
        assert_head_and_tail(raised, 50_000)
        assert len(raised) > 4 * len(output)


async def test_write_stdin_has_the_same_default_and_a_larger_ask_is_lowered(
    tmp_path: Path,
) -> None:
    async with in_process(UnixLocalSession(workdir=tmp_path)) as client:
        start = {"cmd": f"read x; {FLOOD}; exec cat", "tty": True, "yield_time_ms": 250}
        pid = session_id(await ok(client, "exec_command", **start))
        flood = {"until": LAST_LINE, "yield_time_ms": 30_000}
        answer = await ok(client, "write_stdin", session_id=pid, chars="go\n", **flood)
        output = output_of(answer)
        assert_head_and_tail(output, MODEL_OUTPUT_TOKENS)

        # Far past the hard maximum: lowered to it (the whole window the entry kept,
        # about 1 MiB), not refused.
        pid = session_id(await ok(client, "exec_command", **start))
        answer = await ok(
            client,
            "write_stdin",
            session_id=pid,
            chars="go\n",
            **flood,
            max_output_tokens=10**12,
        )
        whole = output_of(answer)
        assert len(whole) > 900_000
        assert len(whole.encode()) <= MAX_MODEL_OUTPUT_TOKENS * BYTES_PER_TOKEN + MARKER_SLACK
        assert whole.rstrip().endswith(LAST_LINE)
    assert model_output_tokens(10**12) == MAX_MODEL_OUTPUT_TOKENS
    assert model_output_tokens(None) == MODEL_OUTPUT_TOKENS
