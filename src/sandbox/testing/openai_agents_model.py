"""A scripted model for the OpenAI Agents SDK: run an agent offline, with no API key.

`ScriptedModel` implements the SDK's `Model` interface by playing a script instead of
calling a model. The script is a list of steps, one per model turn; each step is given
the outputs of the tool calls made so far (call id -> output text, in call order: the
last ones are the previous turn's) and returns the turn's output items: `call(name,
**arguments)` for a function tool call, `say(text)` for the final answer. The SDK's
`Runner.run` then runs the tools for real, on whichever session the run uses. Our own
tests of the integration drive it this way (tests/integrations/test_openai_agents.py);
the end of docs/openai-agents.md has a complete example on unix_local.

Needs the `openai-agents` extra.
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from agents.agent_output import AgentOutputSchemaBase
from agents.handoffs import Handoff
from agents.items import (
    ModelResponse,
    TResponseInputItem,
    TResponseOutputItem,
    TResponseStreamEvent,
)
from agents.model_settings import ModelSettings
from agents.models.interface import Model, ModelTracing
from agents.tool import Tool
from agents.usage import Usage
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)
from openai.types.responses.response_prompt_param import ResponsePromptParam

__all__ = ["ScriptedModel", "Step", "call", "say"]

# One model turn: the tool outputs so far (call id -> text, in order) -> this turn's items.
Step = Callable[[dict[str, str]], Sequence[TResponseOutputItem]]

_TOOL_OUTPUTS = ("function_call_output", "custom_tool_call_output")


def call(name: str, **arguments: Any) -> ResponseFunctionToolCall:
    """A function tool call the model makes: tool `name` with `arguments` (JSON-encoded,
    as a real model sends them), under a fresh call id."""
    ident = f"call_{os.urandom(6).hex()}"
    return ResponseFunctionToolCall(
        id=f"fc_{ident}",
        call_id=ident,
        name=name,
        arguments=json.dumps(arguments),
        type="function_call",
        status="completed",
    )


def say(text: str) -> ResponseOutputMessage:
    """The model's answer, as an assistant message: a turn made only of messages ends the
    run, and `text` becomes its `final_output`."""
    return ResponseOutputMessage(
        id=f"msg_{os.urandom(6).hex()}",
        content=[ResponseOutputText(text=text, type="output_text", annotations=[])],
        role="assistant",
        status="completed",
        type="message",
    )


class ScriptedModel(Model):
    """The SDK's `Model`, playing `steps` (one per turn, in order) instead of calling a
    model: no network and no API key. Give it to an agent as `model=`.

    What it saw is kept for assertions: `outputs`, one list per turn of the tool outputs
    it had by then (texts, in call order), and `tool_names`, the sorted names of the tools
    offered on the last turn. A turn after the last step raises `RuntimeError`."""

    def __init__(self, steps: Sequence[Step]) -> None:
        self.steps: list[Step] = list(steps)
        self.outputs: list[list[str]] = []
        self.tool_names: list[str] = []

    async def get_response(
        self,
        system_instructions: str | None,
        input: str | list[TResponseInputItem],
        model_settings: ModelSettings,
        tools: list[Tool],
        output_schema: AgentOutputSchemaBase | None,
        handoffs: list[Handoff],
        tracing: ModelTracing,
        *,
        previous_response_id: str | None,
        conversation_id: str | None,
        prompt: ResponsePromptParam | None,
    ) -> ModelResponse:
        """The next step's items, given the tool outputs found in `input`."""
        self.tool_names = sorted(tool.name for tool in tools)
        outputs = _tool_outputs(input)
        self.outputs.append(list(outputs.values()))
        if not self.steps:
            played = len(self.outputs) - 1
            raise RuntimeError(f"the scripted model has no step left ({played} played)")
        step = self.steps.pop(0)
        return ModelResponse(output=list(step(outputs)), usage=Usage(), response_id=None)

    def stream_response(
        self,
        system_instructions: str | None,
        input: str | list[TResponseInputItem],
        model_settings: ModelSettings,
        tools: list[Tool],
        output_schema: AgentOutputSchemaBase | None,
        handoffs: list[Handoff],
        tracing: ModelTracing,
        *,
        previous_response_id: str | None,
        conversation_id: str | None,
        prompt: ResponsePromptParam | None,
    ) -> AsyncIterator[TResponseStreamEvent]:
        """Not supported: a scripted run uses `Runner.run`, not `Runner.run_streamed`."""
        raise NotImplementedError("the scripted model does not stream: use Runner.run")


def _tool_outputs(given: str | list[TResponseInputItem]) -> dict[str, str]:
    # The whole conversation comes back each turn; later outputs of a call id win, and a
    # dict keeps the calls' order. Items are TypedDicts, or SDK models in some paths.
    outputs: dict[str, str] = {}
    for item in given if isinstance(given, list) else []:
        fields: Any = item if isinstance(item, dict) else item.model_dump()
        if fields.get("type") in _TOOL_OUTPUTS:
            output = fields["output"]
            outputs[fields["call_id"]] = output if isinstance(output, str) else json.dumps(output)
    return outputs
