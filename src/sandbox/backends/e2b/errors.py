"""The e2b SDK's exceptions (and envd's transport failures) mapped onto ours, by the
toolkit's policy (`sandbox.backends.toolkit.errors`).

- An SDK exception that stands for an HTTP answer (`AuthenticationException` 401,
  `RateLimitException` 429, `ServiceBusyException` 503, a `SandboxException` with a
  `status_code`) goes through `error_for_status`: 401/403/404 are not retryable, the
  toolkit's `RETRYABLE_STATUSES` are.
- A transport failure (`SandboxUnreachableException`, a `connectrpc` `ConnectError`
  whose cause is a connection error or whose code is UNAVAILABLE, an httpx transport
  error) goes through `transport_error`: a retryable `ConnectionLostError`.
- Deadline and resource errors without a status are retryable `ProviderError`s; a
  sandbox that is not running is not.

Every message is redacted of the session's credentials (`Secret`s); the SDK's exception
is chained only when its text held none of them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NoReturn

import httpx
from connectrpc.code import Code as RpcCode
from connectrpc.errors import ConnectError
from e2b import (
    AuthenticationException,
    InvalidArgumentException,
    NotEnoughSpaceException,
    NotFoundException,
    RateLimitException,
    SandboxException,
    SandboxNotRunningException,
    SandboxUnreachableException,
    ServiceBusyException,
    TemplateException,
    TimeoutException,
)

from ...errors import ConnectionLostError, ProviderError, SandboxError
from ..toolkit import Secret, clean_detail, error_for_status, redact, transport_error

SERVICE = "E2B"

# Errors that say the provider refused the create before doing anything: no sandbox can
# have been made, so there is nothing to look for afterwards.
REFUSED = (
    AuthenticationException,
    InvalidArgumentException,
    NotFoundException,
    RateLimitException,
    ServiceBusyException,
    TemplateException,
    NotEnoughSpaceException,
)
# Errors that mean the thing we wanted to stop is already gone.
GONE = (SandboxNotRunningException, NotFoundException)
# envd RPC codes a retry of the same request may get past (UNAVAILABLE is a transport
# failure, below).
_RPC_RETRYABLE = frozenset(
    {RpcCode.DEADLINE_EXCEEDED, RpcCode.RESOURCE_EXHAUSTED, RpcCode.ABORTED, RpcCode.CANCELED}
)
# What pyqwest (the SDK's HTTP client) raises when a connection breaks: a connectrpc
# `ConnectError` carries one of these as its cause (`e2b.envd.rpc.is_transport_failure`).
_TRANSPORT_CAUSES: tuple[type[BaseException], ...] = (OSError,)
try:
    from pyqwest import ReadError, StreamError, WriteError

    _TRANSPORT_CAUSES = (OSError, ReadError, WriteError, StreamError)
except ImportError:  # pragma: no cover - an SDK release without pyqwest
    pass


def _status(exc: BaseException) -> int | None:
    """The HTTP status an SDK exception stands for, if it stands for one."""
    if isinstance(exc, AuthenticationException):
        return 401
    if isinstance(exc, ServiceBusyException):
        return 503
    if isinstance(exc, SandboxException) and not isinstance(exc, TimeoutException):
        status = getattr(exc, "status_code", None)
        return status if isinstance(status, int) and 400 <= status <= 599 else None
    return None


def _is_transport(exc: BaseException) -> bool:
    """Whether `exc` says the connection (not the request) failed."""
    if isinstance(exc, SandboxUnreachableException):
        return True
    if isinstance(exc, ConnectError):
        if exc.code is RpcCode.UNAVAILABLE:
            return True
        return (
            isinstance(exc.__cause__, _TRANSPORT_CAUSES)
            and exc.code is not RpcCode.DEADLINE_EXCEEDED
        )
    if isinstance(exc, httpx.TimeoutException | TimeoutError):
        return False
    return isinstance(exc, (httpx.TransportError, ConnectionError, *_TRANSPORT_CAUSES))


def _retryable_without_status(exc: BaseException) -> bool:
    if isinstance(exc, SandboxNotRunningException):
        return False  # the sandbox is gone (killed, or its lifetime ran out)
    if isinstance(exc, TimeoutException | httpx.TimeoutException | TimeoutError):
        return True
    if isinstance(exc, ConnectError):
        return exc.code in _RPC_RETRYABLE
    return False


class ErrorPolicy:
    """Our errors for the SDK's failures, redacted of `secrets` (the API key)."""

    def __init__(self, secrets: Sequence[Secret | None] = ()) -> None:
        self.secrets: tuple[Secret | None, ...] = tuple(secrets)

    def redact(self, text: str) -> str:
        """`text` made fit for a message: redacted, on one line, shortened."""
        return clean_detail(text, self.secrets)

    def error(self, exc: BaseException, action: str) -> SandboxError:
        """Our error for an SDK failure while trying to `action` ("create a sandbox")."""
        if isinstance(exc, SandboxError):
            return exc
        raw = f"{type(exc).__name__}: {exc}"
        detail = self.redact(raw)
        status = _status(exc)
        error: SandboxError
        if status is not None:
            error = error_for_status(status, action, raw, service=SERVICE, secrets=self.secrets)
        elif _is_transport(exc):
            # The reason is the exception's type, never its text: that may hold a URL.
            lost = transport_error(exc, action, service=SERVICE, reason=type(exc).__name__)
            error = ConnectionLostError(f"{lost}: {detail}")
        else:
            error = ProviderError(
                f"could not {action}: {SERVICE} said {detail}",
                retryable=_retryable_without_status(exc),
            )
        # Chain the SDK's exception only when its text is free of the secret.
        error.__cause__ = exc if redact(raw, self.secrets) == raw else None
        error.__suppress_context__ = True
        return error

    def fail(self, exc: BaseException, action: str) -> NoReturn:
        """Raise our error for `exc` (chained to it only when its text holds no secret)."""
        error = self.error(exc, action)
        raise error from error.__cause__

    def lost_reason(self, exc: BaseException) -> str:
        """A short, secret-free reason for a lost process."""
        return f"e2b stream failed: {self.redact(f'{type(exc).__name__}: {exc}')}"

    @staticmethod
    def no_answer(action: str, seconds: float) -> ProviderError:
        """The error for a control call that got no answer in time (retryable)."""
        return ProviderError(
            f"could not {action}: {SERVICE} did not answer within {seconds:g}s", retryable=True
        )
