"""The runner: one small static process inside a sandbox that owns its processes
(docs/runner.md). This package is its Python side: the protocol's frames, the client,
the packaged binary, the local daemon, and the link over a text-only stream
(`text_link`)."""

from __future__ import annotations

from .binary import RunnerBinary, runner_binary, unavailable_reason
from .client import ProcessSink, RunnerClient
from .errors import (
    RunnerConnectionLost,
    RunnerError,
    RunnerProtocolError,
    RunnerRequestError,
    RunnerTimeout,
)
from .frames import FileStat, ProcessInfo, SignalScope, Stream
from .link_writer import LinkWriter
from .local import connect_local, local_socket_path, start_local
from .text_link import TextLink, TextLinkError

__all__ = [
    "FileStat",
    "LinkWriter",
    "ProcessInfo",
    "ProcessSink",
    "RunnerBinary",
    "RunnerClient",
    "RunnerConnectionLost",
    "RunnerError",
    "RunnerProtocolError",
    "RunnerRequestError",
    "RunnerTimeout",
    "SignalScope",
    "Stream",
    "TextLink",
    "TextLinkError",
    "connect_local",
    "local_socket_path",
    "runner_binary",
    "start_local",
    "unavailable_reason",
]
