"""The errors of the runner client (docs/runner.md).

Every one derives from `RunnerError`, a `ProviderError`: the runner stands where a
provider's daemon would, and the session maps these to its own errors where it needs to.
"""

from __future__ import annotations

from sandbox.errors import ConnectionLostError, ProviderError


class RunnerError(ProviderError):
    """Base class of every error the runner client raises."""


class RunnerProtocolError(RunnerError):
    """The runner broke the protocol (a frame too long, a payload that does not parse,
    an offset that goes backwards, a reply nobody asked for...). The connection is
    closed when a client sees one: nothing after it can be trusted."""


class RunnerConnectionLost(ConnectionLostError, RunnerError):
    """The connection to the runner ended (closed, reset, or closed by the client
    after a protocol error) before the call got its answer. Retryable: the runner and
    its processes may well live on; a new connection can reattach to them."""

    retryable = True


class RunnerTimeout(RunnerError, TimeoutError):
    """The runner did not answer within the deadline the caller gave."""

    retryable = True


class RunnerRequestError(RunnerError):
    """The runner answered the call with an ERROR frame.

    `kind` is one of the protocol's error kinds ("not_found", "exists", "workdir",
    "command_not_found", "not_a_file", "too_large", "unsupported", "invalid", "io",
    "protocol"), or another short word from a newer runner; `detail` is its message.
    """

    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(f"runner: {kind}: {detail}" if detail else f"runner: {kind}")
        self.kind = kind
        self.detail = detail
