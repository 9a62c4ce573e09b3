"""How a failed Blaxel call becomes our error.

The status and transport rules are the toolkit's (`error_for_status`,
`transport_error`, `RETRYABLE_STATUSES`, `redact`); what is Blaxel's own is its error
*codes*: the gateway and the sandbox API name the failure ("WORKLOAD_UNAVAILABLE",
"QUOTA_EXCEEDED"), and the code wins over the status (a 429 "USAGE_LIMIT_EXCEEDED" will
not pass with time, a 503 "TOKEN_REVOKED" neither). Messages are rebuilt from the
status, the code and a redacted detail, and never chained: the SDK's exceptions may hold
request headers.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

import aiohttp
import httpx

from ...errors import CredentialsMissingError, ProviderError, SandboxError
from ..toolkit import Secret, clean_detail, error_for_status, is_retryable_status, transport_error
from .bounds import ResponseTooLarge
from .sdk import CredentialsError

SERVICE = "Blaxel"
RETRYABLE_CODES = frozenset(
    {
        "WORKLOAD_UNAVAILABLE",
        "ROUTING_UNAVAILABLE",
        "SERVICE_UNAVAILABLE",
        "AUTHENTICATION_UNAVAILABLE",
        "UPSTREAM_CONNECT_FAILED",
        "UPSTREAM_CONNECT_TIMEOUT",
        "UPSTREAM_ERROR",
        "UPSTREAM_TIMEOUT",
        "GATEWAY_INTERNAL_ERROR",
        "RATE_LIMIT_EXCEEDED",
        "WORKSPACE_RATE_LIMIT_EXCEEDED",
        "LOCK_ACQUISITION_FAILED",
        "SANDBOX_DELETION_IN_PROGRESS",
        "CREATION_TIMEOUT",
        "UPLOAD_UNAVAILABLE",
    }
)
FINAL_CODES = frozenset(
    {
        "ROUTE_NOT_FOUND",
        "WORKLOAD_NOT_FOUND",
        "WORKSPACE_NOT_FOUND",
        "WORKLOAD_FAILED",
        "AUTHENTICATION_REQUIRED",
        "AUTHENTICATION_FAILED",
        "TOKEN_REVOKED",
        "FORBIDDEN",
        "UNAUTHORIZED",
        "UNAUTHORIZED_WORKSPACE",
        "WORKSPACE_REQUIRED",
        "BAD_REQUEST",
        "USAGE_LIMIT_EXCEEDED",
        "QUOTA_EXCEEDED",
        "VALIDATION_FAILED",
        "VALIDATION_ERROR",
        "INVALID_INPUT",
        "INVALID_IMAGE",
        "IMAGE_NOT_FOUND",
        "INVALID_REGION",
        "SANDBOX_ALREADY_EXISTS",
        "SANDBOX_DELETED",
        "POLICY_VIOLATION",
    }
)
_CODE_RE = re.compile(r"[A-Z][A-Z0-9_]{1,63}")
# The SDK's write_binary raises a bare Exception("Failed to write binary: <status> ...").
_STATUS_IN_TEXT_RE = re.compile(r"^Failed to [a-z ]+: (\d{3})\b")


class BlaxelAPIError(ProviderError):
    """A Blaxel API call was answered with an error. `status` is the HTTP status and
    `code` the provider's error code when it sent one."""

    def __init__(
        self,
        message: str,
        *,
        retryable: bool,
        status: int | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message, retryable=retryable)
        self.status = status
        self.code = code


class AnswerTooLargeError(ProviderError):
    """A Blaxel answer was larger than its bound (`limit` bytes; see `bounds`)."""

    def __init__(self, message: str, *, limit: int) -> None:
        super().__init__(message, retryable=False)
        self.limit = limit


def is_retryable(status: int | None, code: str | None, hint: object = None) -> bool:
    """Whether a failed Blaxel call may succeed if tried again: the provider's code
    first (see the module docstring), then the SDK's own hint, then the toolkit's
    status rule (`RETRYABLE_STATUSES`)."""
    if code in RETRYABLE_CODES:
        return True
    if code in FINAL_CODES:
        return False
    if isinstance(hint, bool):
        return hint
    return is_retryable_status(status)


def api_error(
    status: int,
    what: str,
    detail: str | None = None,
    *,
    code: str | None = None,
    hint: object = None,
    secrets: Iterable[str | Secret | None] = (),
) -> BlaxelAPIError:
    """Our error for HTTP `status` (with Blaxel's `code`) answered while trying to
    `what`: the toolkit's wording, the code appended, retryable as `is_retryable` says."""
    retryable = is_retryable(status, code, hint)
    if retryable or not is_retryable_status(status):
        message = str(error_for_status(status, what, detail, service=SERVICE, secrets=secrets))
    else:
        # The code says "final" where the status alone would read "try again".
        text = clean_detail(detail, secrets)
        message = f"could not {what}: {SERVICE} answered HTTP {status}"
        message += f": {text}" if text else ""
    if code:
        message += f" [{code}]"
    return BlaxelAPIError(message, retryable=retryable, status=status, code=code)


def is_server_timeout(error: BaseException | None) -> bool:
    """Whether `error` is the sandbox API's own timeout of a waited-for process: 422
    "process timed out after N seconds" (the process still runs), or 408 from older
    gateways."""
    if not isinstance(error, BlaxelAPIError):
        return False
    return error.status == 408 or (error.status == 422 and "timed out" in str(error))


def map_error(
    exc: BaseException, what: str, secrets: Iterable[str | Secret | None]
) -> SandboxError:
    """Our error for an SDK or transport failure while trying to `what` (raise it
    `from None`)."""
    if isinstance(exc, ResponseTooLarge):
        why = (
            "a compressed answer, though an uncompressed one was asked for"
            if exc.compressed
            else f"an answer over the bound of {exc.limit} bytes"
        )
        return AnswerTooLargeError(f"could not {what}: {SERVICE} sent {why}", limit=exc.limit)
    if isinstance(exc, CredentialsError):
        return CredentialsMissingError(f"could not {what}: Blaxel credentials are incomplete")
    if isinstance(exc, httpx.TimeoutException):
        return transport_error(exc, what, service=SERVICE, timed_out=True)
    if isinstance(exc, httpx.TransportError | aiohttp.ClientConnectionError | OSError):
        return transport_error(exc, what, service=SERVICE)
    status, code = _status_of(exc), _code_of(exc)
    if status is None:
        message = f"could not {what}: {SERVICE} answered with an error"
        return BlaxelAPIError(message, retryable=is_retryable(None, code), code=code)
    return api_error(
        status,
        what,
        _detail_of(exc),
        code=code,
        hint=getattr(exc, "retryable", None),
        secrets=secrets,
    )


def _int_status(value: object) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool) and 100 <= value <= 599:
        return value
    return None


def _status_of(exc: BaseException) -> int | None:
    for attr in ("status", "status_code"):
        status = _int_status(getattr(exc, attr, None))
        if status is not None:
            return status
    status = _int_status(getattr(getattr(exc, "response", None), "status_code", None))
    if status is not None:
        return status
    match = _STATUS_IN_TEXT_RE.match(str(exc))
    return int(match.group(1)) if match else None


def _code_of(exc: BaseException) -> str | None:
    candidates: list[object] = [getattr(exc, "code", None)]
    for body in (getattr(exc, "body", None), getattr(exc, "data", None)):
        if isinstance(body, Mapping):
            nested = body.get("error")
            if isinstance(nested, Mapping):
                candidates.append(nested.get("code"))
            candidates.extend((body.get("code"), nested))
    for candidate in candidates:
        if isinstance(candidate, str) and _CODE_RE.fullmatch(candidate):
            return candidate
    return None


def _detail_of(exc: BaseException) -> str:
    for body in (getattr(exc, "body", None), getattr(exc, "data", None)):
        if isinstance(body, Mapping):
            nested = body.get("error")
            for source in (nested, body):
                if isinstance(source, Mapping):
                    message = source.get("message")
                    if isinstance(message, str) and message:
                        return message
            if isinstance(nested, str) and nested:
                return nested
    message = getattr(exc, "message", None)
    if isinstance(message, str) and message:
        return message
    return str(exc) or type(exc).__name__
