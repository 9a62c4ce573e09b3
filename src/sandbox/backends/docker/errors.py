"""Mapping of the docker SDK's exceptions (and the transport's) onto ours, by the
toolkit's policy (`sandbox.backends.toolkit.errors`).

An unreachable engine, a dropped connection or a timeout is a retryable
`ConnectionLostError`; an HTTP answer follows the toolkit's statuses (a missing image,
container or file, and a conflict — the container is not running — are not retryable).
Messages name the action and carry the engine's own explanation, never a URL (a
DOCKER_HOST may carry credentials) nor anything the caller passed as a secret.
"""

from __future__ import annotations

import os

import docker.errors
import requests.exceptions

from ...errors import ProviderError, SandboxError
from ..toolkit import error_for_status, transport_error

ENGINE = "the Docker engine"


def _innermost_os_error(exc: BaseException) -> OSError | None:
    seen: set[int] = set()
    found: OSError | None = None
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and not isinstance(
            current, requests.exceptions.RequestException
        ):
            found = current
        for arg in getattr(current, "args", ()):
            if isinstance(arg, BaseException) and id(arg) not in seen:
                inner = _innermost_os_error(arg)
                if inner is not None:
                    found = inner
        current = current.__cause__ or current.__context__
    return found


def _reason(exc: BaseException) -> str:
    inner = _innermost_os_error(exc)
    if inner is not None and inner.errno is not None:
        return os.strerror(inner.errno).lower()
    if inner is not None:
        return type(inner).__name__
    return type(exc).__name__


def is_connection_problem(exc: BaseException) -> bool:
    """True for errors that mean the engine could not be reached or the link dropped."""
    if isinstance(
        exc,
        requests.exceptions.ConnectionError
        | requests.exceptions.Timeout
        | requests.exceptions.ChunkedEncodingError
        | ConnectionError
        | TimeoutError,
    ):
        return True
    if isinstance(exc, docker.errors.APIError):
        return False
    if isinstance(exc, docker.errors.DockerException | requests.exceptions.RequestException):
        return _innermost_os_error(exc) is not None
    return isinstance(exc, OSError)


def engine_error(exc: BaseException, action: str) -> SandboxError:
    """Translate `exc`, raised while doing `action` ("create the container", ...)."""
    if isinstance(exc, SandboxError):
        return exc
    if isinstance(exc, docker.errors.ImageNotFound):
        return ProviderError(
            f"could not {action}: the image was not found ({_explanation(exc)}); "
            "pull or build it first, or pass pull=True",
            retryable=False,
        )
    if isinstance(exc, docker.errors.NotFound):
        return ProviderError(f"could not {action}: {_explanation(exc)}", retryable=False)
    if isinstance(exc, docker.errors.APIError):
        return error_for_status(exc.status_code or 0, action, _explanation(exc), service=ENGINE)
    if _caused_by_timeout(exc):
        return transport_error(exc, action, service=ENGINE, timed_out=True)
    if is_connection_problem(exc):
        return transport_error(exc, action, service=ENGINE, reason=_reason(exc))
    return ProviderError(f"could not {action}: {type(exc).__name__}: {exc}", retryable=False)


def _caused_by_timeout(exc: BaseException) -> bool:
    seen: set[int] = set()
    pending: list[BaseException] = [exc]
    while pending:
        current = pending.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, requests.exceptions.Timeout | TimeoutError):
            return True
        pending.extend(a for a in getattr(current, "args", ()) if isinstance(a, BaseException))
        pending.extend(e for e in (current.__cause__, current.__context__) if e is not None)
    return False


def _explanation(exc: docker.errors.APIError) -> str:
    text = exc.explanation
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    if not text and exc.response is not None:
        text = exc.response.reason
    return str(text or "").strip()[:500] or "no explanation"


def is_not_found(exc: BaseException) -> bool:
    """True when the error (ours or the SDK's) says the object does not exist."""
    cause = exc.__cause__ if isinstance(exc, SandboxError) else exc
    return isinstance(cause, docker.errors.NotFound)
