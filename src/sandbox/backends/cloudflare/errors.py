"""The Worker's answers as our errors, by the toolkit's one policy
(`sandbox.backends.toolkit.errors`), and its exit statuses by `normalize_exit`.

- An HTTP status is `error_for_status` with the Worker's own explanation (the JSON
  `error`/`message`/`detail`, else the body's text), redacted of the API key; a 401 adds
  which variable or option holds the key.
- A transport failure is `transport_error` (a retryable `ConnectionLostError`). aiohttp
  exceptions reference the request and its headers, so they are never chained: callers
  raise our error outside the `except` block (or `from None`).
"""

from __future__ import annotations

import contextlib
import json
from typing import Any

from ...errors import ConnectionLostError, ProviderError
from ..toolkit import Secret, clean_detail, error_for_status, normalize_exit, transport_error
from .bounds import MAX_ERROR_BODY

SERVICE = "the Worker"
API_KEY_ENV = "CLOUDFLARE_SANDBOX_API_KEY"


def body_detail(body: bytes) -> str:
    """The explanation in an error body: its JSON `error`/`message`/`detail`, else the
    text itself (cleaned and redacted by the caller)."""
    text = body[:MAX_ERROR_BODY].decode("utf-8", "replace").strip()
    with contextlib.suppress(ValueError):
        value = json.loads(text)
        if isinstance(value, dict):
            for key in ("error", "message", "detail"):
                if isinstance(value.get(key), str):
                    return str(value[key])
    return text


def status_error(status: int, what: str, body: bytes, key: Secret) -> ProviderError:
    """Our error for the Worker's HTTP `status` while trying to `what`."""
    detail = body_detail(body)
    if status == 401:
        # Say where the key came from: the one thing the user can fix.
        hint = f"check {API_KEY_ENV} / api_key"
        detail = f"{hint}: {detail}" if detail else hint
    return error_for_status(status, what, detail, service=SERVICE, secrets=[key])


def transport_failure(exc: BaseException | None, what: str, **kwargs: Any) -> ConnectionLostError:
    """Our (retryable) error for a failed connection to the Worker; never chain `exc`."""
    return transport_error(exc, what, service=SERVICE, **kwargs)


def worker_text(value: object, key: Secret) -> str:
    """A provider-supplied message (from an event or a frame) fit for our messages."""
    return clean_detail(value if isinstance(value, str) else json.dumps(value), [key])


def exit_status(value: object) -> int | None:
    """The contract's status for an exit code the Worker sent, or None when it sent no
    usable code (not an int): the caller decides what a missing code means."""
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return normalize_exit(value)


def json_object(text: str) -> dict[str, Any]:
    """`text` as a JSON object, or {} when it is not one."""
    try:
        value = json.loads(text)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}
