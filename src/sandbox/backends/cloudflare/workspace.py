"""Cloudflare's half of the workspace calls that are not file operations (those run
through `sandbox.workspace.shell_ops`): the exposed port.

The bridge's `POST /v1/sandbox/{id}/tunnel/{port}` (packages/sandbox/src/bridge/
routes.ts at the commit docs/providers.md names) calls the sandbox's
`tunnels.get(port)`, a quick tunnel answered as `QuickTunnelInfo` (shared/src/
rpc-types.ts: `id`, `port`, `url` = `https://<random>.trycloudflare.com`, `hostname`,
`createdAt`). `validatePort` (security.ts) refuses ports below 1024 and 3000 (the
container's control plane) with 400 `invalid_request`: that is said before asking.
"""

from __future__ import annotations

import json
from typing import Any

from ...backend import ExposedPort, Ports, SnapshotRef, Snapshots, exposed_from_url
from ...errors import ProviderError, UnsupportedOperationError
from .client import WorkerClient

CONTROL_PLANE_PORT = 3000


async def expose(client: WorkerClient, port: int) -> ExposedPort:
    """A quick tunnel to `port` (see the module docstring)."""
    if port < 1024 or port == CONTROL_PLANE_PORT:
        raise UnsupportedOperationError(
            f"port {port} cannot be exposed on Cloudflare: the bridge tunnels ports "
            "1024..65535 except 3000 (the container's control plane)"
        )
    _, body = await client.call(
        "POST", client.sandbox_url("tunnel", str(port)), f"expose port {port}"
    )
    try:
        answer = json.loads(body)
        url = str(answer["url"])
    except (ValueError, KeyError, TypeError):
        raise ProviderError(
            "the Cloudflare bridge answered a tunnel without a url", retryable=False
        ) from None
    return exposed_from_url(url)


class CloudflarePorts(Ports):
    """A quick tunnel through the bridge (`expose`)."""

    async def expose(self, port: int) -> ExposedPort:
        """See `expose`."""
        return await expose(self.session._client, port)


class CloudflareSnapshots(Snapshots):
    """None through the bridge: `createBackup`/`restoreBackup` are methods of the SDK's
    Durable Object (sandbox.ts), and routes.ts routes neither."""

    async def take(self) -> SnapshotRef:
        """Refused, saying why."""
        raise UnsupportedOperationError(
            "the cloudflare backend has no snapshots: the bridge Worker routes no backup "
            "(createBackup/restoreBackup exist only on the SDK's Durable Object); "
            "persist_workspace() and hydrate_workspace() carry a workspace anywhere"
        )

    @classmethod
    def open_options(cls, snapshot: SnapshotRef, options: dict[str, Any]) -> dict[str, Any]:
        """Refused: there is nothing to open."""
        raise UnsupportedOperationError(
            "the cloudflare backend cannot open snapshots; hydrate_workspace() "
            "restores a persisted workspace anywhere"
        )
