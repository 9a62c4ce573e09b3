"""How the Modal SDK's failures become our errors, through the toolkit's one policy.

Modal speaks gRPC, not HTTP: its typed exceptions (`modal.exception`) stand for gRPC
statuses. Each is given the HTTP status of the usual gRPC-to-HTTP mapping (the one
`google.rpc.Code` documents: RESOURCE_EXHAUSTED 429, UNAVAILABLE 503, DEADLINE_EXCEEDED
504, NOT_FOUND 404, UNAUTHENTICATED 401, PERMISSION_DENIED 403, INVALID_ARGUMENT 400,
ALREADY_EXISTS/ABORTED 409, INTERNAL 500) and goes through `error_for_status`, so
`retryable` follows `RETRYABLE_STATUSES` like every other backend. Two SDK classes need
a word: `InternalFailure` is the SDK's *retryable* internal error (its docstring), so
503, not 500; `SandboxTimeoutError` (a `TimeoutError` subclass) says the sandbox's own
lifetime ran out, which no retry can help: 410 Gone. A dropped connection is the
toolkit's `transport_error`. The provider's text is redacted of the Modal token (held
in `Secret`s) and shortened by the toolkit; exceptions are never chained (`from None`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, TypeVar

from modal import exception as modal_exception

from ...errors import ProviderError, SandboxError, SandboxFileNotFoundError
from ..toolkit import Secret, clean_detail, error_for_status, transport_error

T = TypeVar("T")
SERVICE = "Modal"
# Bound on each call that is not a stream (a file transfer, a command's start, a lookup).
DEFAULT_CALL_TIMEOUT_S = 120.0

# Most specific first: the first class that matches decides.
_STATUS_OF: tuple[tuple[type[BaseException], int], ...] = (
    (modal_exception.SandboxTimeoutError, 410),
    (modal_exception.TimeoutError, 504),
    (modal_exception.ResourceExhaustedError, 429),
    (modal_exception.ServiceError, 503),
    (modal_exception.InternalFailure, 503),
    (modal_exception.AuthError, 401),
    (modal_exception.PermissionDeniedError, 403),
    (modal_exception.NotFoundError, 404),
    (modal_exception.AlreadyExistsError, 409),
    (modal_exception.ConflictError, 409),
    (modal_exception.InvalidError, 400),
)
# A bare grpclib `GRPCError` (not wrapped by the SDK) carries its gRPC status code.
_GRPC_STATUS_TO_HTTP = {
    1: 499, 2: 500, 3: 400, 4: 504, 5: 404, 6: 409, 7: 403, 8: 429, 9: 400, 10: 409,
    11: 400, 12: 501, 13: 500, 14: 503, 15: 500, 16: 401,
}  # fmt: skip

CONNECTION_ERRORS: tuple[type[BaseException], ...] = (
    modal_exception.ConnectionError,
    ConnectionError,
    OSError,
)
# What the SDK raises for a failed call (its own errors, transport errors, and the
# ValueError/BufferError of a closed or overfull stdin writer). Anything else (a
# TypeError for a wrong option, say) is a bug and propagates unchanged.
SDK_ERRORS: tuple[type[BaseException], ...] = (
    modal_exception.Error,
    OSError,
    TimeoutError,
    ValueError,
    BufferError,
)
_GRPC_ERROR: tuple[type[BaseException], ...] = ()
try:  # the transport's errors; grpclib comes with modal
    from grpclib.exceptions import GRPCError, StreamTerminatedError

    CONNECTION_ERRORS += (StreamTerminatedError,)
    SDK_ERRORS += (GRPCError, StreamTerminatedError)
    _GRPC_ERROR = (GRPCError,)
except ImportError:  # pragma: no cover - depends on modal's transport
    pass
# Raised by calls on a sandbox that already finished: there is nothing left to signal.
SANDBOX_GONE: tuple[type[BaseException], ...] = (
    modal_exception.ConflictError,
    modal_exception.NotFoundError,
)


def status_of(exc: BaseException) -> int | None:
    """The HTTP status standing for an SDK exception (see the module docstring)."""
    for cls, status in _STATUS_OF:
        if isinstance(exc, cls):
            return status
    if isinstance(exc, _GRPC_ERROR) and not isinstance(exc, modal_exception.Error):
        code = getattr(getattr(exc, "status", None), "value", None)
        return _GRPC_STATUS_TO_HTTP.get(code) if isinstance(code, int) else None
    return None


class CallDeadline(Exception):
    """A bounded call ran out of time (`ModalErrors.bounded`); never leaves the backend."""


class ModalErrors:
    """The error policy of one session: which secrets to hide, and the mapping."""

    def __init__(
        self,
        secrets: Callable[[], Iterable[str | Secret | None]],
        call_timeout_s: float = DEFAULT_CALL_TIMEOUT_S,
    ) -> None:
        self._secrets = secrets
        self.call_timeout_s = call_timeout_s

    def describe(self, exc: BaseException) -> str:
        """`Type: text` of an exception, redacted and shortened, for a message."""
        detail = clean_detail(str(exc), self._secrets())
        return f"{type(exc).__name__}: {detail}" if detail else type(exc).__name__

    def map(self, what: str, exc: BaseException) -> SandboxError:
        """Our error for an SDK exception raised while trying to `what`."""
        if isinstance(exc, SandboxError):
            return exc
        if isinstance(exc, modal_exception.SandboxFilesystemNotFoundError):
            return SandboxFileNotFoundError(f"could not {what}: {self.describe(exc)}")
        if isinstance(exc, CONNECTION_ERRORS):
            return transport_error(exc, what, service=SERVICE)
        if isinstance(exc, TimeoutError) and not isinstance(exc, modal_exception.Error):
            return transport_error(exc, what, service=SERVICE, timed_out=True)
        status = status_of(exc)
        if status is not None:
            return error_for_status(status, what, self.describe(exc), service=SERVICE)
        # No status stands for it (a closed stdin writer, an SDK error without a kind):
        # not something a retry fixes.
        return ProviderError(f"could not {what}: {self.describe(exc)}", retryable=False)

    async def call(
        self, what: str, call: Callable[..., Awaitable[T]], *args: Any, **kwargs: Any
    ) -> T:
        """Await one SDK call within `call_timeout_s`, mapping its exceptions (never the
        caller's cancellation)."""
        return await self.timed_call(what, self.call_timeout_s, call, *args, **kwargs)

    async def bounded(self, call: Awaitable[T]) -> T:
        """`call` within `call_timeout_s` over the whole call; beyond it `CallDeadline`
        (for callers that map the SDK's own exceptions themselves)."""
        deadline = asyncio.timeout(self.call_timeout_s)
        try:
            async with deadline:
                return await call
        except TimeoutError:
            if deadline.expired():
                raise CallDeadline from None
            raise

    def no_answer(self, what: str, seconds: float | None = None) -> ProviderError:
        """The retryable error of a call that got no answer within its bound."""
        bound = self.call_timeout_s if seconds is None else seconds
        return ProviderError(
            f"could not {what}: {SERVICE} did not answer within {bound:g}s", retryable=True
        )

    async def timed_call(
        self,
        what: str,
        seconds: float | None,
        call: Callable[..., Awaitable[T]],
        *args: Any,
        **kwargs: Any,
    ) -> T:
        """`call` within `seconds` (None: no bound, for a stream's wait) over the whole
        call: the SDK's gRPC retries and its per-attempt deadlines would otherwise let a
        peer that never answers, or trickles, hold the caller. Beyond it: a retryable
        `ProviderError`."""
        deadline = asyncio.timeout(seconds)
        try:
            async with deadline:
                return await call(*args, **kwargs)
        except SDK_ERRORS as exc:
            if deadline.expired():
                raise self.no_answer(what, seconds) from None
            raise self.map(what, exc) from None
