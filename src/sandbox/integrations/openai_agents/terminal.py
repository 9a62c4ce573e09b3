"""`Terminal`: a capability giving the SDK's agents what its shell tools lack."""

from __future__ import annotations

import json
import re
from typing import Any, Literal

from agents.sandbox.capabilities.capability import Capability
from agents.sandbox.manifest import Manifest
from agents.tool import FunctionTool, Tool
from pydantic import BaseModel, Field, ValidationError

import sandbox
from sandbox.output.model_budget import (
    MAX_MODEL_OUTPUT_TOKENS,
    MODEL_OUTPUT_TOKENS,
    model_output_tokens,
)
from sandbox.types import PtyUpdate

from .session import AgentsSessionAdapter

_INSTRUCTIONS = """\
Terminal tools (for processes started with exec_command):
- `view_screen` shows what a tty process's terminal looks like now (full-screen programs).
- `send_keys` writes to a process and waits until `until` appears in its output or
  `until_screen` on its screen (instead of guessing a wait).
- `interrupt` sends Ctrl-C; `resize` changes a terminal's size; `terminate` ends a
  process and everything it started."""


class _SessionArgs(BaseModel):
    session_id: int = Field(description="Session ID of a running process (from exec_command).")


class _SendKeysArgs(_SessionArgs):
    chars: str = Field(default="", description="Characters to write (empty: just wait).")
    until: str | None = Field(default=None, description="Return as soon as this text is printed.")
    until_regex: bool = Field(default=False, description="Treat `until` as a regular expression.")
    until_screen: str | None = Field(
        default=None, description="Return as soon as this text is on the rendered screen."
    )
    yield_time_ms: int = Field(default=10_000, ge=0, description="Longest wait, in milliseconds.")
    max_output_tokens: int | None = Field(
        default=MODEL_OUTPUT_TOKENS,
        ge=1,
        description="Truncate the output to about this many tokens (head and tail kept); "
        f"ask for more to see it whole, at most {MAX_MODEL_OUTPUT_TOKENS}.",
    )


class _ResizeArgs(_SessionArgs):
    rows: int = Field(ge=1, le=1000)
    cols: int = Field(ge=1, le=1000)


def _adapter(session: object) -> AgentsSessionAdapter:
    inner = getattr(session, "_inner", session)
    if not isinstance(inner, AgentsSessionAdapter):
        raise TypeError("the Terminal capability needs a session made by sandbox's SandboxClient")
    return inner


def _format(update: PtyUpdate) -> str:
    lines = []
    if update.process_id is not None:
        lines.append(f"Process running with session ID {update.process_id}")
    else:
        lines.append(f"Process exited with code {update.exit_code}")
    if update.screen is not None:
        lines.append("Screen:")
        lines.append(update.screen.text())
    lines.append("Output:")
    lines.append(update.output)
    return "\n".join(lines)


class Terminal(Capability):
    """Screens, resize, interrupt, terminate and `until` waits for the SDK's agents.

    Bind it beside the SDK's `Shell` capability on a session from `SandboxClient`.
    """

    type: Literal["sandbox_terminal"] = "sandbox_terminal"

    def tools(self) -> list[Tool]:
        """The five tools, each calling our session directly."""
        if self.session is None:
            raise ValueError("Terminal capability is not bound to a SandboxSession")
        adapter = _adapter(self.session)
        return [
            _tool(
                "view_screen",
                "Show the rendered screen of a tty process (what a person would see).",
                _SessionArgs,
                lambda a: _view_screen(adapter, a),
            ),
            _tool(
                "send_keys",
                "Write characters to a process and wait for text in its output or on its "
                "screen, returning as soon as it appears.",
                _SendKeysArgs,
                lambda a: _send_keys(adapter, a),
            ),
            _tool(
                "interrupt",
                "Send Ctrl-C (SIGINT) to a process.",
                _SessionArgs,
                lambda a: _interrupt(adapter, a),
            ),
            _tool(
                "resize",
                "Resize a tty process's terminal.",
                _ResizeArgs,
                lambda a: _resize(adapter, a),
            ),
            _tool(
                "terminate",
                "End a process and every process it started.",
                _SessionArgs,
                lambda a: _terminate(adapter, a),
            ),
        ]

    async def instructions(self, manifest: Manifest) -> str | None:
        """How the model should use the tools."""
        del manifest
        return _INSTRUCTIONS


def _tool(name: str, description: str, model: type[BaseModel], run: Any) -> FunctionTool:
    async def invoke(_context: object, raw: str) -> str:
        try:
            args = model.model_validate_json(raw or "{}")
        except ValidationError as error:
            return f"error: invalid arguments: {error.errors(include_url=False)}"
        try:
            result: str = await run(args)
        except sandbox.PtyProcessNotFoundError:
            return f"error: no process with session ID {json.loads(raw).get('session_id')}"
        except sandbox.SandboxError as error:
            return f"error: {error}"
        return result

    return FunctionTool(
        name=name,
        description=description,
        params_json_schema=model.model_json_schema(),
        on_invoke_tool=invoke,
        strict_json_schema=False,
    )


async def _view_screen(adapter: AgentsSessionAdapter, args: _SessionArgs) -> str:
    snap = await adapter.sandbox_session.pty_screen(args.session_id)
    return f"Screen of session {args.session_id} ({snap.rows}x{snap.cols}):\n" + snap.text()


async def _send_keys(adapter: AgentsSessionAdapter, args: _SendKeysArgs) -> str:
    until: str | re.Pattern[str] | None = args.until
    if args.until is not None and args.until_regex:
        until = re.compile(args.until)
    update = await adapter.sandbox_session.pty_write_stdin(
        args.session_id,
        args.chars,
        yield_time_s=args.yield_time_ms / 1000,
        max_output_tokens=model_output_tokens(args.max_output_tokens),
        until=until,
        until_screen=args.until_screen,
    )
    return _format(update)


async def _interrupt(adapter: AgentsSessionAdapter, args: _SessionArgs) -> str:
    await adapter.sandbox_session.pty_interrupt(args.session_id)
    return f"Sent Ctrl-C to session {args.session_id}."


async def _resize(adapter: AgentsSessionAdapter, args: _ResizeArgs) -> str:
    await adapter.sandbox_session.pty_resize(args.session_id, rows=args.rows, cols=args.cols)
    return f"Session {args.session_id} resized to {args.rows}x{args.cols}."


async def _terminate(adapter: AgentsSessionAdapter, args: _SessionArgs) -> str:
    await adapter.sandbox_session.pty_terminate(args.session_id)
    return f"Session {args.session_id} terminated (with all its child processes)."
