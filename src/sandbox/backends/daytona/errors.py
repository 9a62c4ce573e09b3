"""The SDK's exceptions mapped onto ours by the toolkit's one policy
(`sandbox.backends.toolkit.errors`).

Each typed Daytona error stands for an HTTP status (its `status_code` when it carries
one, else the status its class names), and `error_for_status` decides the message and
whether a retry may help. A `DaytonaConnectionError` (the link dropped, a websocket
closed) is the toolkit's `transport_error`, a retryable `ConnectionLostError`. A
`DaytonaTimeoutError` without a status is "no answer in time", retryable. Some SDK calls
re-wrap a typed error in a plain `DaytonaError`: the most specific one in the cause chain
decides. The provider's text is redacted of the API key before it reaches a message.
"""

from __future__ import annotations

from collections.abc import Iterable

from daytona import (
    DaytonaAuthenticationError,
    DaytonaBadGatewayError,
    DaytonaBadRequestError,
    DaytonaConflictError,
    DaytonaConnectionError,
    DaytonaError,
    DaytonaForbiddenError,
    DaytonaGoneError,
    DaytonaInternalServerError,
    DaytonaNotFoundError,
    DaytonaRateLimitError,
    DaytonaServiceUnavailableError,
    DaytonaTimeoutError,
    DaytonaUnprocessableEntityError,
    DaytonaValidationError,
)

from ...errors import ProviderError
from ..toolkit import Secret, clean_detail, error_for_status, is_retryable_status, transport_error

SERVICE = "daytona"
API_KEY_ENV = "DAYTONA_API_KEY"

Secrets = Iterable[str | Secret | None]

# The HTTP status each typed error stands for when it carries none itself.
_CLASS_STATUS: tuple[tuple[type[DaytonaError], int], ...] = (
    (DaytonaTimeoutError, 408),
    (DaytonaRateLimitError, 429),
    (DaytonaServiceUnavailableError, 503),
    (DaytonaBadGatewayError, 502),
    (DaytonaNotFoundError, 404),
    (DaytonaAuthenticationError, 401),
    (DaytonaForbiddenError, 403),
    (DaytonaBadRequestError, 400),
    (DaytonaValidationError, 400),
    (DaytonaConflictError, 409),
    (DaytonaUnprocessableEntityError, 422),
    (DaytonaGoneError, 410),
    (DaytonaInternalServerError, 500),
)


def typed_cause(exc: BaseException) -> BaseException:
    """The most specific Daytona error in `exc`'s cause chain (some SDK calls re-wrap a
    typed error in a plain `DaytonaError`)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, DaytonaError) and type(current) is not DaytonaError:
            return current
        current = current.__cause__
    return exc


def status_of(exc: BaseException) -> int | None:
    """The HTTP status an SDK error stands for, or None (a transport failure, or a
    plain `DaytonaError` without one)."""
    typed = typed_cause(exc)
    status = getattr(typed, "status_code", None)
    if isinstance(status, int) and not isinstance(status, bool):
        return status
    for cls, class_status in _CLASS_STATUS:
        if isinstance(typed, cls):
            return class_status
    return None


def is_transport(exc: BaseException) -> bool:
    """Whether the SDK says the connection failed (rather than the API answering)."""
    return isinstance(typed_cause(exc), DaytonaConnectionError)


def is_not_found(exc: BaseException) -> bool:
    """Whether the API said "no such thing" (404)."""
    return not is_transport(exc) and status_of(exc) == 404


def is_retryable(exc: BaseException) -> bool:
    """Whether a retry may help: a transport failure, a timeout, or a retryable status
    (`sandbox.backends.toolkit.RETRYABLE_STATUSES`)."""
    return is_transport(exc) or is_retryable_status(status_of(exc))


def refused(exc: BaseException) -> bool:
    """Whether the API refused a request outright, so it created nothing: a 4xx other
    than a request timeout (the request may have been acted upon then)."""
    if is_transport(exc):
        return False
    status = status_of(exc)
    return status is not None and 400 <= status < 500 and status != 408


def detail_of(exc: BaseException, secrets: Secrets) -> str:
    """The SDK's explanation, redacted and shortened (never empty)."""
    text = getattr(exc, "message", None) or str(exc) or type(exc).__name__
    return clean_detail(str(text), secrets) or type(exc).__name__


def provider_error(exc: BaseException, what: str, secrets: Secrets) -> ProviderError:
    """Our error for an SDK error raised while trying to `what` ("create the sandbox")."""
    detail = detail_of(exc, secrets)
    if is_transport(exc):
        return transport_error(exc, what, service=SERVICE, reason=detail)
    status = status_of(exc)
    if status is None:
        return ProviderError(f"could not {what}: {SERVICE} failed: {detail}", retryable=False)
    if status == 408 and getattr(typed_cause(exc), "status_code", None) is None:
        # The SDK's own deadline passed: no HTTP answer came at all.
        return ProviderError(
            f"could not {what}: {SERVICE} did not answer in time: {detail}", retryable=True
        )
    error = error_for_status(status, what, detail, service=SERVICE)
    if status == 401:
        return ProviderError(
            f"{error} (check the API key, e.g. {API_KEY_ENV})", retryable=error.retryable
        )
    return error


def deadline_error(what: str, timeout_s: float) -> ProviderError:
    """A call that did not finish within its bound (retryable)."""
    return ProviderError(
        f"could not {what}: {SERVICE} did not finish within {timeout_s:g}s", retryable=True
    )
