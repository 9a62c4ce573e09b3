"""Kubernetes `Status` objects (apimachinery `pkg/apis/meta/v1` `Status`) as our errors.

Every error the API server answers is a `Status` JSON with `code`, `reason` and
`message`; an exec's channel 3 carries one too when the command ends: `Success`, or
`Failure` with `reason: NonZeroExitCode` and the code in
`details.causes[{reason: "ExitCode", message: "N"}]` (kubelet
`pkg/kubelet/cri/streaming/remotecommand/httpstream.go` `writeStatus`, client-go
`tools/remotecommand/v4.go`). HTTP statuses go through the toolkit's policy.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from ...backend import Secret
from ...errors import ProviderError
from ..toolkit import clean_detail, error_for_status

SERVICE = "the Kubernetes API server"


def parse_status(body: bytes) -> dict[str, Any] | None:
    """The Status object in `body`, or None when it is not one."""
    try:
        value = json.loads(body.decode("utf-8", "replace"))
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def api_error(
    http_status: int,
    body: bytes,
    what: str,
    *,
    secrets: Iterable[str | Secret | None] = (),
) -> ProviderError:
    """Our error for an API answer with `http_status`, its Status message as detail."""
    status = parse_status(body) or {}
    message = status.get("message")
    reason = status.get("reason")
    detail = message if isinstance(message, str) else body[:200].decode("utf-8", "replace")
    if isinstance(reason, str) and reason and reason not in detail:
        detail = f"{reason}: {detail}"
    return error_for_status(http_status, what, detail, service=SERVICE, secrets=secrets)


class ExecFailed(ProviderError):
    """An exec that ended with a Failure Status other than a non-zero exit (the runtime
    could not start the command, or the stream failed)."""


def exit_code_from_status(status: dict[str, Any], what: str) -> int:
    """The exit code an exec's final Status carries; `ExecFailed` for any other
    failure (such as an executable the runtime could not find)."""
    if status.get("status") == "Success":
        return 0
    details = status.get("details")
    causes = details.get("causes") if isinstance(details, dict) else None
    if status.get("reason") == "NonZeroExitCode" and isinstance(causes, list):
        for cause in causes:
            if isinstance(cause, dict) and cause.get("reason") == "ExitCode":
                text = cause.get("message")
                if isinstance(text, str) and text.strip().isdigit():
                    return int(text.strip())
    message = status.get("message")
    raise ExecFailed(
        f"could not {what}: the exec failed"
        + (f": {clean_detail(message)}" if isinstance(message, str) else "")
    )
