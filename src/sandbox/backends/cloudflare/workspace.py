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

from ...backend import ExposedPort, exposed_from_url
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
