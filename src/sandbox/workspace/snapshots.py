"""`SnapshotRef`: a provider's snapshot of a sandbox, as JSON a later process can open.

It names what the provider made (a docker image id, a Modal image id) and the backend
that made it; it holds no credential, so it can be written to disk or logged.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import InvalidArgumentError

FORMAT = 1


@dataclass(frozen=True)
class SnapshotRef:
    """A snapshot: `backend` that made it, the provider's `snapshot_id`, and `details`
    (plain JSON values, secret-free) the backend needs to open a session from it."""

    backend: str
    snapshot_id: str
    details: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        """The snapshot as a JSON object (`from_json` reads it back)."""
        return json.dumps(
            {
                "format": FORMAT,
                "backend": self.backend,
                "snapshot_id": self.snapshot_id,
                "details": dict(self.details),
            },
            sort_keys=True,
        )

    @classmethod
    def from_json(cls, text: str | bytes) -> SnapshotRef:
        """Read what `to_json` wrote; `InvalidArgumentError` for anything else."""
        try:
            data = json.loads(text)
        except (ValueError, UnicodeDecodeError) as exc:
            raise InvalidArgumentError(f"not a snapshot reference: {exc}") from None
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise InvalidArgumentError("not a snapshot reference (format 1 expected)")
        backend, snapshot_id, details = (
            data.get("backend"),
            data.get("snapshot_id"),
            data.get("details", {}),
        )
        if not isinstance(backend, str) or not isinstance(snapshot_id, str) or not snapshot_id:
            raise InvalidArgumentError("a snapshot reference needs a backend and a snapshot_id")
        if not isinstance(details, dict):
            raise InvalidArgumentError("a snapshot reference's details must be an object")
        return cls(backend=backend, snapshot_id=snapshot_id, details=details)
