"""Exposed ports for `blaxel`: previews (blaxel==0.4.24 `blaxel/core/sandbox/default/
preview.py`).

A preview publishes one port of the sandbox at its own URL (`spec.url`), through the
control plane (`POST /sandboxes/{name}/previews`). The backend makes the SDK's shorthand
preview `preview-<port>`, private (the SDK's default), found again if it already exists
(`create_if_not_exists`: an existing one is returned as it is), and mints a token for it
(`preview.tokens.create(expires_at)`), which a client sends in `X-Blaxel-Preview-Token`
("or, for browser navigation, the `bl_preview_token` query parameter"). The token is a
secret: it travels only in `ExposedPort.headers`, which the repr hides.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from ...backend import ExposedPort, exposed_from_url
from .client import BlaxelClient

PREVIEW_TOKEN_HEADER = "X-Blaxel-Preview-Token"
# How long a minted preview token stays valid.
PREVIEW_TOKEN_TTL = timedelta(hours=24)


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
