"""Creating and attaching to a sandbox of the Worker (`POST /v1/sandbox`,
`GET .../{id}/running`), for `CloudflareSession`'s start; its stop deletes it."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from ...errors import ProviderError
from .client import WorkerClient
from .errors import json_object

logger = logging.getLogger("sandbox.cloudflare")


def created_id(body: bytes) -> str:
    """The new sandbox's id from the Worker's answer to a create."""
    sandbox_id = json_object(body.decode("utf-8", "replace")).get("id")
    if not isinstance(sandbox_id, str) or not sandbox_id:
        raise ProviderError(
            "could not create a sandbox: the Worker's answer has no id", retryable=False
        )
    return sandbox_id


async def attach(client: WorkerClient, requested: str) -> None:
    """Open the client and check the requested sandbox runs."""
    client.sandbox_id = None
    client.open()
    # The id is adopted only once the check succeeded: a failed attach must not make
    # the cleanup delete a sandbox we never held.
    _, body = await client.call("GET", client.url(requested, "running"), "attach to the sandbox")
    # The bridge answers 200 either way; `running` says whether the sandbox's
    # container answered a `true` exec.
    if json_object(body.decode("utf-8", "replace")).get("running") is not True:
        raise ProviderError(
            f"could not attach to the sandbox {requested!r}: it is not running "
            "(stopped, or no such sandbox)",
            retryable=False,
        )
    client.sandbox_id = requested


async def create(session: Any) -> None:
    """Open the session's client and create a sandbox, as a task of its own (kept in
    `session._create_task`: the stop of a cancelled start waits for it)."""
    client: WorkerClient = session._client
    client.sandbox_id = None
    client.open()
    # The create runs as our own task: if this caller is cancelled after the Worker
    # made the sandbox, `_stop_backend` waits for the answer and deletes it.
    create = asyncio.ensure_future(
        client.call("POST", client.url(), "create a sandbox", json_body={})
    )
    session._create_task = create
    _, body = await asyncio.shield(create)
    session._create_task = None
    client.sandbox_id = created_id(body)
    logger.debug("created cloudflare sandbox %s", client.sandbox_id)
