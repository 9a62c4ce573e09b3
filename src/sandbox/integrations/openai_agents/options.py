"""The client options model: which backend, and what `open_session` takes for it."""

from __future__ import annotations

from typing import Any, Literal

from agents.sandbox.session.sandbox_client import BaseSandboxClientOptions
from pydantic import Field, field_validator

#: The `type` both our options and our session state register under in the SDK.
TYPE_NAME: Literal["agent_sandbox_pty"] = "agent_sandbox_pty"


class SandboxClientOptions(BaseSandboxClientOptions):
    """Options for `SandboxClient.create`: `backend` is any name in `sandbox.BACKENDS`,
    `backend_options` what `sandbox.open_session(backend, **backend_options)` takes.

    Credentials may be given here; they are kept in memory only, never in the session
    state the SDK serializes (see `state.public_options`).
    """

    type: Literal["agent_sandbox_pty"] = TYPE_NAME
    backend: str
    # Kept out of the repr: it may hold credentials (a model's repr reaches logs).
    backend_options: dict[str, Any] = Field(default_factory=dict, repr=False)
    exposed_ports: tuple[int, ...] = ()

    @field_validator("backend")
    @classmethod
    def _known_backend(cls, value: str) -> str:
        from sandbox.backends import BACKENDS

        if value not in BACKENDS:
            raise ValueError(f"unknown backend {value!r}; known: {', '.join(sorted(BACKENDS))}")
        return value
