"""The session state the SDK serializes: enough to find the sandbox again, no secret."""

from __future__ import annotations

import json
import re
from typing import Any, Literal

from agents.sandbox.session.sandbox_session_state import (
    SandboxSessionState as _SdkSessionState,
)
from pydantic import Field

from .options import TYPE_NAME

# Option names that hold credentials on some backend (api_key, token_secret, ...).
_SECRET_NAME = re.compile(r"key|token|secret|password|credential|auth", re.IGNORECASE)


def public_options(options: dict[str, Any]) -> dict[str, Any]:
    """The options that may be written down: no credential, only JSON values.

    A credential (by its name) or a live object (an SDK class, a fake) must be given
    again at resume, to the client or through the environment.
    """
    kept: dict[str, Any] = {}
    for name, value in options.items():
        if _SECRET_NAME.search(name):
            continue
        try:
            json.dumps(value)
        except (TypeError, ValueError):
            continue
        kept[name] = value
    return kept


class SandboxSessionState(_SdkSessionState):
    """Our state: the backend, its public options, and our `SessionRef` when there is
    one (a ref is secret-free by contract); `workspace_root_owned` says whether delete
    removes a workspace folder we made."""

    type: Literal["agent_sandbox_pty"] = TYPE_NAME
    backend: str
    backend_options: dict[str, Any] = Field(default_factory=dict)
    session_ref: dict[str, Any] | None = None
    workspace_root_owned: bool = False
