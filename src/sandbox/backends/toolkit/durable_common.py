"""What the durability of a remote sandbox repeats from backend to backend, written once
(`sandbox.session.capabilities.Durability`, docs/durable-sessions.md).

- `ScriptLease`: the `LeaseStore` whose lease is a file in the sandbox (`lease`). A
  read and a swap are each one run of the lease script; what differs between providers
  is only how a command runs there (an exec call, a control shell...) and how its
  failure is reported, so that is all a backend writes (`run`).
- `attach_options`: the constructor options of a resume that attaches to the sandbox a
  ref names, taking only the ref's allowed options (`ref_trust.taken_from_ref`).
- `attach_or_gone`: the resume's attach (the session's `_start_backend` with the ref's
  `sandbox_id`), where a sandbox the provider no longer has is `SessionGoneError`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Collection
from typing import Any

from ...durable.refs import SessionRef
from ...errors import SandboxError, SessionGoneError
from .lease import lease_path, lease_read_argv, lease_swap_argv


class ScriptLease(ABC):
    """The lease of the session `session_id` in `session`'s sandbox (a `LeaseStore`),
    read and swapped by the lease script through the backend's `run`."""

    def __init__(self, session: Any, session_id: str) -> None:
        # The backend's session (its client, its error policy); untyped, as a capability's.
        self.session = session
        self.path = lease_path(session_id)

    @abstractmethod
    async def run(self, argv: list[str]) -> str | None:
        """Run the lease script's `argv` in the sandbox and return the lease value
        `parse_lease` reads from its output (bounded; a provider failure raised as the
        backend's error)."""

    async def read(self) -> str | None:
        """The lease's value."""
        return await self.run(lease_read_argv(self.path))

    async def swap(self, expected: str | None, new: str) -> str | None:
        """Compare-and-set under the script's lock; what the lease was."""
        return await self.run(lease_swap_argv(self.path, expected, new))


def attach_options(
    ref: SessionRef,
    backend: str,
    taken: Collection[str],
    *,
    key: str = "sandbox_id",
    none_is_a_value: Collection[str] = (),
) -> dict[str, Any]:
    """Reopen attached to the sandbox the ref names under `key` (as `sandbox_id=`;
    `SessionGoneError` when it names none), kept or not as the first session was, with
    the ref's options in `taken`. A None there is "not kept" and left out, except for
    the options in `none_is_a_value` (a None `heartbeat_s` is "no heartbeat")."""
    sandbox_id = ref.sandbox.get(key)
    if not isinstance(sandbox_id, str) or not sandbox_id:
        raise SessionGoneError(f"the {backend} ref names no sandbox")
    options = {
        k: v
        for k, v in ref.options.items()
        if k in taken and (v is not None or k in none_is_a_value)
    }
    options["sandbox_id"] = sandbox_id
    options["keep"] = bool(ref.sandbox.get("keep"))
    return options


async def attach_or_gone(
    session: Any,
    backend: str,
    *,
    gone: tuple[type[BaseException], ...] = (),
    gone_words: Collection[str] = ("not found",),
) -> None:
    """Attach `session` (made from a ref, so its `_start_backend` attaches to the ref's
    sandbox); a failure the provider caused by a missing sandbox (its cause one of
    `gone`, or its message naming one of `gone_words`) is `SessionGoneError`."""
    try:
        await session._start_backend()
    except SandboxError as exc:
        text = str(exc).lower()
        if isinstance(exc.__cause__, gone) or any(word in text for word in gone_words):
            raise SessionGoneError(f"the {backend} sandbox of this ref is gone: {exc}") from None
        raise
