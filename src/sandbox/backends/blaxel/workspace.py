"""Exposed ports and snapshots for `blaxel`: previews (blaxel==0.4.24
`blaxel/core/sandbox/default/preview.py`) and snapshots (`sandbox/default/snapshot.py`,
`snapshot/snapshot.py`).

A preview publishes one port of the sandbox at its own URL (`spec.url`), through the
control plane (`POST /sandboxes/{name}/previews`). The backend makes the SDK's shorthand
preview `preview-<port>`, private (the SDK's default), found again if it already exists
(`create_if_not_exists`: an existing one is returned as it is), and mints a token for it
(`preview.tokens.create(expires_at)`), which a client sends in `X-Blaxel-Preview-Token`
("or, for browser navigation, the `bl_preview_token` query parameter"). The token is a
secret: it travels only in `ExposedPort.headers`, which the repr hides.

Snapshots: `snapshots.create(name)` on the SDK's sandbox
(`POST /sandboxes/{name}/snapshots`) answers a `SandboxSnapshot` at once; its
`status` is "pending", then "ready" or "failed" (the model's own list), and "only a
ready snapshot holds the filesystem it captured" (blaxel-ai/sdk-python's integration
test `test_workspace_snapshots.py`, which polls `Snapshot.get(id)` until "ready").
So `take_snapshot` polls the same way
(`GET /snapshots/{id}`, a growing interval, at most `SNAPSHOT_READY_TIMEOUT_S`). A
snapshot is a workspace resource: it outlives the sandbox (`Snapshot` docstring), and
`Snapshot.fork(target_name)` (`POST /snapshots/{id}/fork`) "works after the sandbox the
snapshot was captured from has been deleted", so `fork` forks by the snapshot, never
by its source; it is the creating call, which the session runs as its own task. The
fork answers before the new sandbox is up (the SDKs' fork tests wait for DEPLOYED):
`bind_when_deployed` polls `SandboxInstance.get` until it is. The
snapshot's name is ours (`sandbox-pty-snapshot-<random>`: unique among the sandbox's
snapshots, as the API asks); the ref holds its id (what the workspace routes take),
its name, the source sandbox and the workdir, nothing secret.

A caller cancelled while the snapshot is made leaves the create call (a task of its
own) to `_undo`, which waits for its answer, then for the snapshot to leave "pending"
(whether a pending snapshot can be deleted is not documented), and deletes it
(`Snapshot.delete(id)`): nobody else learns its id. A snapshot that failed or never
became ready is deleted too.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from datetime import UTC, datetime, timedelta
from typing import Any

from ...backend import ExposedPort, Ports, SnapshotRef, Snapshots, exposed_from_url, settle
from ...errors import InvalidArgumentError, ProviderError, SandboxError
from .client import GONE_STATUSES, BlaxelClient
from .errors import BlaxelAPIError
from .sdk import SandboxInstance, Snapshot

logger = logging.getLogger("sandbox.blaxel")

PREVIEW_TOKEN_HEADER = "X-Blaxel-Preview-Token"
# How long a minted preview token stays valid.
PREVIEW_TOKEN_TTL = timedelta(hours=24)
SNAPSHOT_PREFIX = "sandbox-pty-snapshot-"
# How long a snapshot may stay "pending", and a fork not DEPLOYED, before we give up
# (the SDK's own tests allow 75 s and about two minutes).
SNAPSHOT_READY_TIMEOUT_S = 300.0
FORK_READY_TIMEOUT_S = 300.0
# The polls' interval: it starts short and doubles up to the cap.
POLL_FIRST_S = 0.05
POLL_MAX_S = 2.0
# Options a fork cannot carry (`Snapshot.fork` takes a name, envs and ports only; the
# sandbox runs with the snapshot's image, memory and region: `SandboxSnapshotSpec`).
NOT_WITH_SNAPSHOT = ("image", "memory_limit_bytes", "ttl", "labels")


async def expose_port(client: BlaxelClient, port: int) -> ExposedPort:
    """The private preview of `port` (made once) and a new token for it."""
    instance = client.sandbox()
    what = f"expose port {port} of the Blaxel sandbox"
    preview = await client.call(
        what, lambda: instance.previews.create_if_not_exists({"port": port, "public": False})
    )
    headers: dict[str, str] = {}
    spec = preview.spec
    if not (spec is not None and getattr(spec, "public", False) is True):
        expires = datetime.now(UTC) + PREVIEW_TOKEN_TTL
        token = await client.call(what, lambda: preview.tokens.create(expires))
        headers[PREVIEW_TOKEN_HEADER] = token.value
    return exposed_from_url(preview.url, headers)


# ---- snapshots ------------------------------------------------------------------------


def _status(record: Any) -> str:
    return str(getattr(record, "status", "") or "").lower()


def _gone(snapshot_id: str) -> ProviderError:
    return BlaxelAPIError(
        f"the Blaxel snapshot {snapshot_id!r} no longer exists (deleted, or made in "
        "another workspace)",
        retryable=False,
        status=404,
    )


async def _pause(delay: float) -> float:
    # No event to wait on: the API only answers a poll.
    await asyncio.sleep(delay)
    return min(delay * 2, POLL_MAX_S)


async def _get_snapshot(client: BlaxelClient, snapshot_id: str, what: str) -> Any:
    """`Snapshot.get(id)`; 404 is `_gone`."""
    try:
        return await client.call(what, lambda: Snapshot.get(snapshot_id))
    except BlaxelAPIError as exc:
        if exc.status == 404:
            raise _gone(snapshot_id) from None
        raise


async def _settled_state(client: BlaxelClient, made: Any, what: str) -> Any:
    """The snapshot once it left "pending" (polled), or a `ProviderError` after
    `SNAPSHOT_READY_TIMEOUT_S`."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + SNAPSHOT_READY_TIMEOUT_S
    delay, record = POLL_FIRST_S, made
    while _status(record) == "pending":
        if loop.time() >= deadline:
            raise ProviderError(
                f"could not {what}: the snapshot {made.id} was still pending after "
                f"{SNAPSHOT_READY_TIMEOUT_S:g}s",
                retryable=True,
            )
        delay = await _pause(delay)
        record = await _get_snapshot(client, str(made.id), what)
    return record


async def take_snapshot(client: BlaxelClient, sandbox_name: str, workdir: str) -> SnapshotRef:
    """Snapshot the sandbox and wait until the snapshot is ready (see the module
    docstring); the create runs as a task this call owns."""
    what = f"snapshot the Blaxel sandbox {sandbox_name!r}"
    instance = client.sandbox()
    name = f"{SNAPSHOT_PREFIX}{secrets.token_hex(8)}"
    create = asyncio.ensure_future(client.call(what, lambda: instance.snapshots.create(name)))
    try:
        made = await asyncio.shield(create)
        record = await _settled_state(client, made, what)
    except asyncio.CancelledError:
        await settle(_undo(client, create, what))
        raise
    except SandboxError:
        if create.done() and not create.cancelled() and create.exception() is None:
            await _delete_quietly(client, str(create.result().id))
        raise
    if _status(record) != "ready":
        await _delete_quietly(client, str(made.id))
        raise ProviderError(
            f"could not {what}: the snapshot {made.id} ended {_status(record) or 'unknown'!r}",
            retryable=True,
        )
    details = {"name": str(record.name), "sandbox": sandbox_name, "workdir": workdir}
    return SnapshotRef(backend="blaxel", snapshot_id=str(record.id), details=details)


async def _undo(client: BlaxelClient, create: asyncio.Future[Any], what: str) -> None:
    """Delete what a snapshot whose caller went away made, once its create answered
    and it left "pending"."""
    if not create.done():
        await asyncio.wait([create])
    if create.cancelled() or create.exception() is not None:
        return  # nothing made (or nothing we can name)
    made = create.result()
    try:
        await _settled_state(client, made, what)
    except SandboxError as exc:
        if isinstance(exc, BlaxelAPIError) and exc.status == 404:
            return  # already gone
        logger.info("deleting a snapshot still pending: %s", exc)
    await delete_snapshot(client, str(made.id), "a cancelled call made")


async def delete_snapshot(client: BlaxelClient, snapshot_id: str, why: str) -> None:
    """`Snapshot.delete(id)` (`DELETE /snapshots/{id}`); one already gone is fine."""
    try:
        await client.call(
            f"delete the Blaxel snapshot {snapshot_id} {why}",
            lambda: Snapshot.delete(snapshot_id),
        )
    except BlaxelAPIError as exc:
        if exc.status != 404:
            raise


async def _delete_quietly(client: BlaxelClient, snapshot_id: str) -> None:
    """Delete a snapshot that failed or never became ready; a failure here is logged,
    the error that led here is what the caller hears."""
    try:
        await delete_snapshot(client, snapshot_id, "that did not become ready")
    except SandboxError as exc:
        logger.warning("%s", exc)


def snapshot_options(snapshot: SnapshotRef, options: dict[str, Any]) -> dict[str, Any]:
    """Options that fork a new sandbox from `snapshot` (its id is the `snapshot`
    option; its workdir the default one)."""
    opened = {**options, "snapshot": snapshot.snapshot_id}
    workdir = snapshot.details.get("workdir")
    if workdir is not None and not isinstance(workdir, str):
        raise InvalidArgumentError("the snapshot's workdir must be a str")
    if workdir is not None and "workdir" not in options:
        opened["workdir"] = workdir
    return opened


async def fork(client: BlaxelClient, name: str, snapshot_id: str, region: str | None) -> None:
    """Fork the snapshot into a new sandbox `name` (the creating call: the session runs
    it as its own task). A snapshot that is gone is a clear `ProviderError`."""
    what = f"open the Blaxel snapshot {snapshot_id!r}"
    record = await _get_snapshot(client, snapshot_id, what)
    status = _status(record)
    if status != "ready":
        raise ProviderError(
            f"could not {what}: it is {status or 'of no known status'}, not ready",
            retryable=status == "pending",
        )
    spec = getattr(record, "spec", None)
    kept = getattr(spec, "region", None)
    if region is not None and isinstance(kept, str) and kept and kept != region:
        raise InvalidArgumentError(
            f"the snapshot {snapshot_id!r} is held in region {kept!r} and forks land "
            f"there, not in {region!r}"
        )
    snap = Snapshot(record)
    try:
        await client.call(
            f"fork the Blaxel snapshot {snapshot_id!r} into {name!r}", lambda: snap.fork(name)
        )
    except BlaxelAPIError as exc:
        if exc.status == 404:
            raise _gone(snapshot_id) from None
        raise


async def bind_when_deployed(client: BlaxelClient, name: str, seconds: float) -> None:
    """Bind to the forked sandbox `name` once it is DEPLOYED (within `seconds`)."""
    client.bind(await _deployed(client, name, seconds))


async def _deployed(client: BlaxelClient, name: str, seconds: float) -> SandboxInstance:
    """The sandbox `name` once DEPLOYED (polled; a fork may not be found at first)."""
    what = f"start the Blaxel sandbox {name!r} forked from a snapshot"
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    delay = POLL_FIRST_S
    while True:
        found: SandboxInstance | None = None
        try:
            found = await client.call(what, lambda: SandboxInstance.get(name))
        except BlaxelAPIError as exc:
            if exc.status != 404:
                raise
        status = str(getattr(found, "status", "") or "").upper()
        if found is not None and status == "DEPLOYED":
            return found
        if status in GONE_STATUSES:
            raise ProviderError(f"could not {what}: it is {status}", retryable=False)
        if loop.time() >= deadline:
            raise ProviderError(
                f"could not {what}: not deployed after {seconds:g}s", retryable=True
            )
        delay = await _pause(delay)


class BlaxelPorts(Ports):
    """A private Blaxel preview of a port and a token for it."""

    async def expose(self, port: int) -> ExposedPort:
        """See `expose_port`."""
        return await expose_port(self.session._client, port)


class BlaxelSnapshots(Snapshots):
    """A Blaxel snapshot of the sandbox, once ready; it opens as a new sandbox forked
    from it (the `snapshot` option)."""

    async def take(self) -> SnapshotRef:
        """See `take_snapshot`."""
        session = self.session
        return await take_snapshot(session._client, session.sandbox_name, session.workdir)

    @classmethod
    def open_options(cls, snapshot: SnapshotRef, options: dict[str, Any]) -> dict[str, Any]:
        """See `snapshot_options`."""
        return snapshot_options(snapshot, options)
