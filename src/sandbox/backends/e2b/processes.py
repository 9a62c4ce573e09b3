"""What the e2b backend keeps about a running command: `E2BProcess` (a PTY entry's
handle) and `OneShot` (a one-shot `exec`, a `OneShotProcess` the base session drives),
plus how the SDK's text output becomes bytes again.

Output: terminal output arrives as bytes. Pipe output arrives as `str`: the SDK decodes
each stream with an incremental UTF-8 decoder (so characters split across chunks are
kept whole) and we encode it back. Bytes that are not valid UTF-8 reach us as U+FFFD, so
binary output on pipes is not byte-exact (use a terminal or `read_file` for that).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from ...backend import OutputSink
from ..toolkit import ShellTrap, new_tag
from .client import E2BClient


def text_to_bytes(chunk: str | bytes | bytearray) -> bytes:
    """Bytes for an output chunk the SDK handed over as text (or already as bytes).

    `surrogateescape` gives back the original bytes should the SDK ever decode that way;
    text that cannot be encoded so (lone surrogates) is replaced, never raised on.
    """
    if isinstance(chunk, bytes | bytearray):
        return bytes(chunk)
    try:
        return chunk.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return chunk.encode("utf-8", "replace")


@dataclass(eq=False)
class E2BProcess:
    """What the session keeps about one process (`entry.handle`): its tags (`tag`, the
    command's, for the interrupt script; `outer_tag`, the process envd started, when it
    differs: see `scripts`), the start task (shielded: the teardown waits for it), the
    SDK handle, the waiter task reporting its end, and the shell trap filtering its
    output."""

    tty: bool
    tag: str = field(default_factory=new_tag)
    outer_tag: str = field(default_factory=new_tag)
    start_task: asyncio.Task[Any] | None = None
    handle: Any = None
    waiter: asyncio.Task[None] | None = None
    trap: ShellTrap | None = None
    ended: bool = False
    stdin_closed: bool = False  # `commands.close_stdin` answered (a retry skips it)

    @property
    def tags(self) -> tuple[str, ...]:
        """Every tag of the process's tree (for the kill script)."""
        return (self.tag,) if self.tty else (self.tag, self.outer_tag)

    async def watch(self, entry: OutputSink, client: E2BClient) -> None:
        """Wait for the process's end and report it (or report the stream lost)."""
        try:
            code = await client.wait_code(self.handle)
        except Exception as exc:
            self._flush_trap(entry)
            entry.report_lost(client.errors.lost_reason(exc))
            return
        self.ended = True
        self._flush_trap(entry)
        entry.report_exit(code)
        entry.report_eof()

    def _flush_trap(self, entry: OutputSink) -> None:
        if self.trap is not None:
            entry.feed(self.trap.flush())

    async def started_handle(self) -> Any:
        """The SDK handle, once an unfinished start (cancelled or failed half-way) has
        come to its end: what did it start? None if nothing."""
        task = self.start_task
        if self.handle is None and task is not None:
            if not task.done():
                await asyncio.wait([task])  # bounded by start_timeout_s
            if not task.cancelled() and task.exception() is None:
                self.handle = task.result()
        return self.handle


class OneShot:
    """A one-shot command on pipes (a `OneShotProcess`): the base session waits for it
    within its timeout and kills it (settled) at the timeout, on cancellation or at the
    close. A stream E2B cut (its own `timeout`, a dropped connection) makes `wait` raise
    our error; the base session then kills the tree too."""

    def __init__(self, client: E2BClient, handle: Any, tags: tuple[str, ...]) -> None:
        self._client = client
        self._handle = handle
        self._tags = tags
        self._done = False

    async def wait(self) -> int:
        """The exit status, once the SDK delivered every output chunk."""
        try:
            return await self._client.wait_code(self._handle)
        except Exception as exc:
            self._client.errors.fail(exc, "run a command")

    async def kill(self) -> None:
        """Kill the command's whole tree, then stop reading it. Idempotent."""
        if self._done:
            return
        self._done = True
        try:
            await self._client.kill_tree(self._handle.pid, self._tags, tty=False)
        finally:
            await self._client.disconnect(self._handle)

    async def release(self) -> None:
        """After `wait()`: stop the SDK's reader (the wrapper swept the job's group)."""
        if not self._done:
            self._done = True
            await self._client.disconnect(self._handle)
