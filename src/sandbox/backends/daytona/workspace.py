"""Daytona's half of the workspace calls that are not file operations (those run
through `sandbox.workspace.shell_ops`): the exposed port.

`AsyncSandbox.get_preview_link(port)` (daytona `_async/sandbox.py`) answers a
`PortPreviewUrl` (`url`, `token`); for a private sandbox every request must carry the
token in `X-Daytona-Preview-Token` (else 401), so it travels in `ExposedPort.headers`
(kept out of reprs: it is a credential).
"""

from __future__ import annotations

from typing import Any

from ...backend import ExposedPort, exposed_from_url

TOKEN_HEADER = "X-Daytona-Preview-Token"


def exposed_from_preview(preview: Any) -> ExposedPort:
    """The `ExposedPort` of a `PortPreviewUrl`."""
    token = str(getattr(preview, "token", "") or "")
    return exposed_from_url(str(preview.url), {TOKEN_HEADER: token} if token else None)
