"""One error policy for the remote backends: which HTTP answers are worth a retry, how a
status or a transport failure becomes our error, and how secrets are hidden.

- Retryable statuses: 408 (request timeout), 425 (too early), 429 (rate limited), 502,
  503 and 504 (a gateway or the service is unavailable or timed out). These say "not
  now" without the request having been acted upon. 500 is not among them: it says the
  server failed while handling the request, which is usually deterministic (the Docker
  engine answers 500 for a write under a file) and may have happened after a side effect
  (a sandbox half-created); a blind retry of a non-idempotent call could then repeat it.
  A backend that knows a 500 is transient for its provider says so by its own rule.
- 401 and 403 are `ProviderError`, not retryable: the provider rejected the credential
  it was given. `CredentialsMissingError` stays for a credential that was never found
  (raised before any request, naming the variable to set).
- A transport failure (refused, reset, timed out, DNS) is `ConnectionLostError`, which
  is retryable. Its message has the exception's type, or for an `OSError` its errno's
  text, never the exception's own text: that often holds the URL, which may carry a
  token. Callers raise it `from None` when the exception may reference request headers.
- Redaction: every secret in a provider's text is replaced by one marker, `REDACTED`
  (the same one `credentials.Secret` uses); details are cut to `MAX_DETAIL_CHARS`.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from ...errors import ConnectionLostError, ProviderError
from .credentials import REDACTED, Secret

__all__ = [
    "MAX_DETAIL_CHARS",
    "MIN_SECRET_CHARS",
    "REDACTED",
    "RETRYABLE_STATUSES",
    "clean_detail",
    "error_for_status",
    "is_retryable_status",
    "redact",
    "transport_error",
    "transport_reason",
]

RETRYABLE_STATUSES = frozenset({408, 425, 429, 502, 503, 504})
MAX_DETAIL_CHARS = 300
# Shorter values are not searched for: replacing every "ab" in a message would mangle
# it, and a value that short protects nothing anyway.
MIN_SECRET_CHARS = 4


def redact(text: str, secrets: Iterable[str | Secret | None]) -> str:
    """`text` with every occurrence of each secret replaced by `REDACTED`. Longer
    secrets go first, so one that contains another is hidden whole."""
    values = {s.reveal() if isinstance(s, Secret) else s for s in secrets}
    for value in sorted((v for v in values if v), key=len, reverse=True):
        if len(value) >= MIN_SECRET_CHARS:
            text = text.replace(value, REDACTED)
    return text


def clean_detail(detail: str | None, secrets: Iterable[str | Secret | None] = ()) -> str:
    """A provider's explanation made fit for a message: redacted, on one line, at most
    `MAX_DETAIL_CHARS` characters."""
    text = " ".join(redact(detail or "", secrets).split())
    return text if len(text) <= MAX_DETAIL_CHARS else text[: MAX_DETAIL_CHARS - 3] + "..."


def is_retryable_status(status: int | None) -> bool:
    """Whether an HTTP status says a retry may succeed (see `RETRYABLE_STATUSES`)."""
    return status in RETRYABLE_STATUSES


def error_for_status(
    status: int,
    what: str,
    detail: str | None = None,
    *,
    service: str = "the provider",
    secrets: Iterable[str | Secret | None] = (),
) -> ProviderError:
    """Our error for an HTTP `status` answered while trying to `what` ("create the
    sandbox"), with the provider's `detail` (redacted of `secrets`, shortened)."""
    text = clean_detail(detail, secrets)
    suffix = f": {text}" if text else ""
    prefix = f"could not {what}"
    if status == 401:
        message = f"{prefix}: {service} rejected the credentials (HTTP 401){suffix}"
    elif status == 403:
        message = f"{prefix}: {service} refused it (HTTP 403, forbidden){suffix}"
    elif status == 404:
        message = f"{prefix}: not found (HTTP 404){suffix}"
    elif is_retryable_status(status):
        message = f"{prefix}: {service} is busy or unavailable (HTTP {status}; try again){suffix}"
    else:
        message = f"{prefix}: {service} answered HTTP {status}{suffix}"
    return ProviderError(message, retryable=is_retryable_status(status))


def transport_reason(exc: BaseException) -> str:
    """A secret-free reason for a transport failure: an `OSError`'s errno text (found
    in the cause chain too), else the exception's type name."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno is not None:
            return os.strerror(current.errno).lower()
        current = current.__cause__ or current.__context__
    return type(exc).__name__


def transport_error(
    exc: BaseException | None,
    what: str,
    *,
    service: str = "the provider",
    reason: str | None = None,
    timed_out: bool = False,
) -> ConnectionLostError:
    """Our (retryable) error for a failed connection while trying to `what`: `reason`
    when given (it must hold no secret), else `transport_reason(exc)`; `timed_out` says
    that `service` did not answer in time."""
    if timed_out or isinstance(exc, TimeoutError):
        return ConnectionLostError(f"could not {what}: {service} did not answer in time")
    why = reason or (transport_reason(exc) if exc is not None else "the connection failed")
    return ConnectionLostError(f"could not {what}: cannot reach {service} ({why})")
