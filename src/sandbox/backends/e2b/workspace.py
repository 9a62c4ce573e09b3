"""E2B's half of the workspace calls that are not file operations: the exposed port and
snapshots.

`AsyncSandbox.get_host(port)` (e2b `sandbox/main.py`, `ConnectionConfig.get_host`)
answers `<port>-<sandbox id>.<sandbox domain>`, which E2B's edge serves over HTTPS for
any port a process listens on; in the SDK's debug mode it is `localhost:<port>`, plain
HTTP. No header is needed (a sandbox created with `secure` and a traffic token is not
opened by this backend).

Snapshots: `AsyncSandbox.create_snapshot(name=None, *, mode=None)` (e2b 2.63.0
`sandbox_async/main.py`, `POST /sandboxes/{id}/snapshots`) answers a `SnapshotInfo`
whose `snapshot_id` "can be used with Sandbox.create() to create a new sandbox from
this snapshot"; the snapshot is a template that outlives the sandbox, which keeps
running. That is a snapshot in our sense (a paused sandbox resumed by `connect` is not:
it is the same sandbox, and it is gone once killed). `mode=None` leaves the kind to the
API (today "full": memory too, so a sandbox created from it resumes the processes that
were running, which the new session does not own and which end with its sandbox);
`"filesystem"` cold-boots from disk but may be refused per team (400) or node (409).
A caller cancelled while the snapshot is made waits for it and deletes it
(`delete_snapshot`): nobody else learns its id.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from ...backend import ExposedPort, Ports, SnapshotRef, Snapshots, http_url, settle
from ...errors import InvalidArgumentError
from .client import E2BClient

SNAPSHOT_MODES = ("full", "filesystem")


def exposed_from_host(host: str, port: int) -> ExposedPort:
    """The `ExposedPort` for what `get_host(port)` answered."""
    if host.startswith("localhost:"):  # the SDK's debug mode: the sandbox is this host
        return ExposedPort(url=http_url("localhost", port), host="localhost", port=port)
    return ExposedPort(url=f"https://{host}/", host=host, port=443, tls=True)


def check_snapshot_mode(mode: object) -> str | None:
    """The `snapshot_mode` option: None (the API's default), "full" or "filesystem"."""
    if mode is not None and mode not in SNAPSHOT_MODES:
        raise InvalidArgumentError(
            f"snapshot_mode must be None, 'full' or 'filesystem', not {mode!r}"
        )
    return mode


async def take_snapshot(
    client: E2BClient, params: Mapping[str, Any], mode: str | None, seconds: float
) -> SnapshotRef:
    """`create_snapshot` within `seconds`, as a task this call owns: a cancelled caller
    waits for it and deletes the snapshot it made."""
    sandbox = client.sandbox
    task = asyncio.ensure_future(
        client.bounded(sandbox.create_snapshot(mode=mode, **params), seconds)
    )
    try:
        info = await asyncio.shield(task)
    except asyncio.CancelledError:
        await settle(_undo(client, task, type(sandbox), params))
        raise
    except TimeoutError:
        raise client.errors.no_answer("snapshot the sandbox", seconds) from None
    except Exception as exc:
        client.errors.fail(exc, "snapshot the sandbox")
    details: dict[str, Any] = {"names": [str(name) for name in info.names or []]}
    if mode is not None:
        details["mode"] = mode
    return SnapshotRef(backend="e2b", snapshot_id=str(info.snapshot_id), details=details)


async def _undo(
    client: E2BClient, task: asyncio.Future[Any], cls: Any, params: Mapping[str, Any]
) -> None:
    """Delete what a snapshot whose caller went away made, once it is made."""
    if not task.done():
        await asyncio.wait([task])
    if task.cancelled() or task.exception() is not None:
        return  # nothing made (or nothing we can name)
    snapshot_id = str(task.result().snapshot_id)
    try:
        await client.bounded(cls.delete_snapshot(snapshot_id, **params), client.kill_timeout)
    except TimeoutError:
        raise client.errors.no_answer(
            f"delete the snapshot {snapshot_id} a cancelled call made", client.kill_timeout
        ) from None
    except Exception as exc:  # settled: reported instead of the cancellation
        client.errors.fail(exc, f"delete the snapshot {snapshot_id} a cancelled call made")


def snapshot_options(snapshot: SnapshotRef, options: dict[str, Any]) -> dict[str, Any]:
    """Options that create a sandbox from `snapshot` (its id is the create's template,
    the `image` option)."""
    if "image" in options or "sandbox_id" in options:
        raise InvalidArgumentError("snapshot= replaces image= and sandbox_id=")
    return {**options, "image": snapshot.snapshot_id}


class E2BPorts(Ports):
    """`sandbox.get_host(port)`: `<port>-<id>.<domain>`, served over HTTPS by E2B's edge
    (the SDK's debug mode answers `localhost:<port>`, plain HTTP)."""

    async def expose(self, port: int) -> ExposedPort:
        """See `exposed_from_host`."""
        client: E2BClient = self.session._client
        return exposed_from_host(str(client.sandbox.get_host(port)), port)


class E2BSnapshots(Snapshots):
    """`create_snapshot`: a template new sandboxes start from."""

    async def take(self) -> SnapshotRef:
        """See `take_snapshot`."""
        session = self.session
        client: E2BClient = session._client
        return await take_snapshot(
            client, session._api_params(), session._snapshot_mode, client.start_timeout
        )

    @classmethod
    def open_options(cls, snapshot: SnapshotRef, options: dict[str, Any]) -> dict[str, Any]:
        """A fresh sandbox whose template is the snapshot (`snapshot_options`)."""
        return snapshot_options(snapshot, options)
