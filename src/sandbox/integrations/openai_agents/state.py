"""The session state the SDK serializes: enough to find the sandbox again, no secret."""

from __future__ import annotations

import json
import os
import re
from typing import Any, Literal

from agents.sandbox.session.sandbox_session_state import (
    SandboxSessionState as _SdkSessionState,
)
from pydantic import Field

import sandbox
from sandbox.durable import seal
from sandbox.errors import InvalidArgumentError, RefNotTrustedError

from .options import TYPE_NAME

#: The seal's purpose label: a state's seal can never pass as a ref's or a lease's.
STATE_PURPOSE = "sandbox-agents-state-v1"

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
    removes the workspace folder we made (the unix_local `workdir` option).

    A serialized state often lands where a sandboxed process can write, and these fields
    decide things on the host (which folder a session opens on, which folder `delete`
    removes). So `host_seal` is an HMAC over them under this user's key
    (`sandbox.durable.seal`), written by the library each time it sets them; `resume`
    and `delete` refuse a state whose seal does not match (`RefNotTrustedError`).
    """

    type: Literal["agent_sandbox_pty"] = TYPE_NAME
    backend: str
    backend_options: dict[str, Any] = Field(default_factory=dict)
    session_ref: dict[str, Any] | None = None
    workspace_root_owned: bool = False
    host_seal: str | None = None

    def _host_fields(self) -> bytes:
        fields = {
            "type": self.type,
            "session_id": str(self.session_id),
            "backend": self.backend,
            "backend_options": self.backend_options,
            "session_ref": self.session_ref,
            "workspace_root_owned": self.workspace_root_owned,
        }
        try:
            text = json.dumps(fields, sort_keys=True, separators=(",", ":"))
        except (TypeError, ValueError):
            raise InvalidArgumentError("the session state's fields are not JSON data") from None
        return text.encode()

    def reseal(self) -> None:
        """Seal the host-deciding fields as they are now (the library calls this after
        each change it makes to them)."""
        self.host_seal = seal.seal(STATE_PURPOSE, self._host_fields())

    def check_trusted(self) -> None:
        """Raise `RefNotTrustedError` unless this user's library wrote the host-deciding
        fields as they are (seal), the `SessionRef` in them is sealed too and names the
        same backend, and an owned unix_local workspace is the one the ref names."""
        if not seal.is_sealed(STATE_PURPOSE, self._host_fields(), self.host_seal):
            raise RefNotTrustedError(
                "this Agents SDK session state was not written by this user's sandbox "
                "library, or its backend, options, session ref or workspace ownership "
                "changed since (its seal does not match): refusing to use it. A process in "
                "the sandbox may have rewritten it; states are sealed with the key in "
                f"{seal.state_folder()!r}"
            )
        if self.session_ref is None:
            return
        ref = sandbox.SessionRef.from_dict(self.session_ref)
        if ref.backend != self.backend:
            raise RefNotTrustedError(
                f"this session state is for the {self.backend!r} backend but its session "
                f"ref is for {ref.backend!r}: refusing to use it"
            )
        owned = self.owned_workspace()
        named = ref.sandbox.get("workspace") if ref.backend == "unix_local" else None
        if owned is not None and isinstance(named, str) and not _same_folder(owned, named):
            raise RefNotTrustedError(
                "this session state's workspace is not the one its session ref names: "
                "refusing to use it"
            )

    def owned_workspace(self) -> str | None:
        """The folder `delete` removes: the unix_local workspace the client made, or None.
        Read it only after `check_trusted`."""
        if not self.workspace_root_owned or self.backend != "unix_local":
            return None
        folder = self.backend_options.get("workdir")
        return folder if isinstance(folder, str) else None


def _same_folder(first: str, second: str) -> bool:
    return os.path.realpath(first) == os.path.realpath(second)
