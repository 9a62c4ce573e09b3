"""The output budget of one tool call a model reads (the MCP tools, the Agents SDK
`Terminal` capability): the library itself truncates nothing unless asked, but a whole
window (up to the 1 MiB an entry keeps) would fill a model's context in one answer.

A tool truncates its window to `MODEL_OUTPUT_TOKENS` unless its caller asks for more,
up to `MAX_MODEL_OUTPUT_TOKENS`; the truncation (`truncate_to_tokens`) keeps the head
and the tail around its omission marker.
"""

from __future__ import annotations

from .buffer import DEFAULT_OUTPUT_LIMIT
from .truncation import BYTES_PER_TOKEN

MODEL_OUTPUT_TOKENS = 10_000
"""A tool call's default budget, about what coding agents' own exec tools hand a model."""

MAX_MODEL_OUTPUT_TOKENS = DEFAULT_OUTPUT_LIMIT // BYTES_PER_TOKEN
"""The most a caller may ask for: a whole window's worth (1 MiB of output)."""


def model_output_tokens(asked: int | None) -> int:
    """The budget of one call: `MODEL_OUTPUT_TOKENS` when the caller did not ask (None),
    else what it asked for, at most `MAX_MODEL_OUTPUT_TOKENS` (a value below 1 goes on
    to the library, whose `InvalidArgumentError` names it)."""
    return MODEL_OUTPUT_TOKENS if asked is None else min(asked, MAX_MODEL_OUTPUT_TOKENS)
