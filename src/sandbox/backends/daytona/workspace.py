"""Daytona's half of the workspace calls that are not file operations (those run
through `sandbox.workspace.shell_ops`): the exposed port and snapshots.

`AsyncSandbox.get_preview_link(port)` (daytona `_async/sandbox.py`) answers a
`PortPreviewUrl` (`url`, `token`); for a private sandbox every request must carry the
token in `X-Daytona-Preview-Token` (else 401), so it travels in `ExposedPort.headers`
(kept out of reprs: it is a credential).

Snapshots: `AsyncSandbox.create_snapshot(name, timeout=60)` (daytona 0.226.1
`_async/sandbox.py`, `POST /sandbox/{id}/snapshot` with `CreateSandboxSnapshot`)
"captures the Sandbox's filesystem into a reusable snapshot that can be used to create
new Sandboxes"; the sandbox is `SNAPSHOTTING` meanwhile and the call waits until it
left that state. The snapshot is named by us (`sandbox-pty-snapshot-<random>`, names
are unique per organization); the `SnapshotRef` holds the name and a session opened
from it creates its sandbox with `CreateSandboxFromSnapshotParams(snapshot=name)` (the
`snapshot` option). A caller cancelled meanwhile waits for the call and deletes the
snapshot (`daytona.snapshot.delete(name)`). Removing old snapshots is the caller's
business.
"""

from __future__ import annotations

import asyncio
import secrets
from typing import Any

from daytona import DaytonaError

from ...backend import ExposedPort, Ports, SnapshotRef, Snapshots, exposed_from_url, settle
from ...errors import InvalidArgumentError
from .client import DaytonaClient
from .errors import is_not_found

TOKEN_HEADER = "X-Daytona-Preview-Token"


def exposed_from_preview(preview: Any) -> ExposedPort:
    """The `ExposedPort` of a `PortPreviewUrl`."""
    token = str(getattr(preview, "token", "") or "")
    return exposed_from_url(str(preview.url), {TOKEN_HEADER: token} if token else None)


async def take_snapshot(client: DaytonaClient) -> SnapshotRef:
    """`create_snapshot` under a fresh name, as a task this call owns (bounded by the
    create timeout plus the call timeout, as a create is)."""
    opts = client.options
    name = f"sandbox-pty-snapshot-{secrets.token_hex(8)}"
    what = "snapshot the sandbox"
    seconds = opts.create_timeout_s + opts.call_timeout_s
    task = asyncio.ensure_future(
        client.timed(
            what, client.sandbox.create_snapshot(name, timeout=opts.create_timeout_s), seconds
        )
    )
    try:
        await asyncio.shield(task)
    except asyncio.CancelledError:
        await settle(_undo(client, task, name))
        raise
    except DaytonaError as exc:
        raise client.error(exc, what) from None
    return SnapshotRef(backend="daytona", snapshot_id=name)


async def _undo(client: DaytonaClient, task: asyncio.Future[Any], name: str) -> None:
    """Delete the snapshot a cancelled caller's call made (none if it failed)."""
    if not task.done():
        await asyncio.wait([task])
    if task.cancelled() or task.exception() is not None:
        return
    what = f"delete the snapshot {name} a cancelled call made"
    try:
        await client.bounded(client.client.snapshot.delete(name))
    except DaytonaError as exc:
        if not is_not_found(exc):
            raise client.error(exc, what) from None
    except TimeoutError:
        raise client.teardown_error(TimeoutError(), what) from None


def snapshot_options(snapshot: SnapshotRef, options: dict[str, Any]) -> dict[str, Any]:
    """Options that create a sandbox from the snapshot `snapshot` names."""
    if "image" in options or "sandbox_id" in options:
        raise InvalidArgumentError("snapshot= replaces image= and sandbox_id=")
    return {**options, "snapshot": snapshot.snapshot_id}


class DaytonaPorts(Ports):
    """`sandbox.get_preview_link(port)`: its URL, and its token as the header Daytona's
    edge wants."""

    async def expose(self, port: int) -> ExposedPort:
        """See `exposed_from_preview`."""
        client: DaytonaClient = self.session._client
        what = f"expose port {port}"
        try:
            preview = await client.timed(what, client.sandbox.get_preview_link(port))
        except DaytonaError as exc:
            raise client.error(exc, what) from None
        return exposed_from_preview(preview)


class DaytonaSnapshots(Snapshots):
    """`sandbox.create_snapshot(name)`: the sandbox's filesystem as a named snapshot new
    sandboxes are created from (the `snapshot` option)."""

    async def take(self) -> SnapshotRef:
        """See `take_snapshot`."""
        return await take_snapshot(self.session._client)

    @classmethod
    def open_options(cls, snapshot: SnapshotRef, options: dict[str, Any]) -> dict[str, Any]:
        """See `snapshot_options`."""
        return snapshot_options(snapshot, options)
