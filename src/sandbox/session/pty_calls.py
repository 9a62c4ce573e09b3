"""`PtyCalls`: the work of the session's `pty_*` calls once their arguments are checked.

A start reserves an id (settling the pruned victim), opens the recording, spawns
through `OwnedTasks` and collects the first window; a write writes within the window
(`write_within`) and collects the rest of it; resize, interrupt and screen look the
process up and call one hook. The session checks the arguments first (they are its
public signature's meaning); the registry, the owned tasks and the recordings each keep
their own state, and the hooks are looked up at each call (a test's `HookGate` may wrap
one on the session later).
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
from typing import TYPE_CHECKING, Generic

from ..errors import (
    InvalidArgumentError,
    ProcessExitedError,
    SandboxError,
    SessionClosedError,
    StdinClosedError,
)
from ..output.until import UntilPattern
from ..process_entry import H, ProcessSpec, PtyEntry
from ..types import PtyUpdate
from .admission import Admission
from .hooks import SessionHooks
from .ownership import OwnedTasks, closed_error
from .recordings import Recordings
from .registry import ProcessRegistry
from .windows import SCREEN_CHECK_SLICE_S, check_until_screen, collect_window
from .writes import EntryRemoved, close_input, write_within

if TYPE_CHECKING:  # the emulator (pyte) is imported only when a screen is made
    from ..terminal.screen import ScreenSnapshot


class PtyCalls(Generic[H]):
    """The `pty_*` work of one session over its collaborators and `hooks`.

    `admission` is the session's lifecycle: each call is admitted by it first, and its
    `closing` says whether a removed process is reported as the session's close."""

    def __init__(
        self,
        hooks: SessionHooks[H],
        processes: ProcessRegistry[H],
        owned: OwnedTasks[H],
        recordings: Recordings,
        *,
        admission: Admission,
    ) -> None:
        self._hooks = hooks
        self._processes = processes
        self._owned = owned
        self._recordings = recordings
        self._admission = admission

    def closed_error(self) -> SessionClosedError:
        """The error a call gets when the session closed under it."""
        return closed_error(self._hooks.backend_name)

    def gone(self, entry: PtyEntry[H]) -> SandboxError:
        """The error for a call that finds its process removed while it waited."""
        return self.closed_error() if self._admission.closing else self._processes.gone(entry)

    def lookup(self, process_id: int) -> PtyEntry[H]:
        """The registered entry of `process_id` (the session must be running)."""
        self._admission.admit_now()
        return self._processes.lookup(process_id)

    async def admitted(self, process_id: int) -> PtyEntry[H]:
        """The registered entry of `process_id`, once the call was admitted."""
        await self._admission.admit()
        return self._processes.lookup(process_id)

    async def start(
        self,
        spec: ProcessSpec,
        window: float,
        until: UntilPattern | None,
        max_tokens: int | None,
        until_screen: UntilPattern | None,
        record: str | os.PathLike[str] | None,
        record_input: bool,
    ) -> PtyUpdate:
        """`pty_exec_start` after its checks: reserve, (settle the victim), record,
        spawn, admit, then the first window. A cancelled caller tears the process down:
        nobody would know its id."""
        entry, victim = await self._processes.reserve(
            spec,
            check_open=self._admission.admit_now,
            name_taken=self._recordings.name_taken if spec.tty and record is None else None,
        )

        def prepare() -> None:  # after the victim went, before the spawn
            if spec.tty:
                self._recordings.start(entry, record, record_input, closed=self.closed_error())

        await self._owned.start_process(
            entry, victim, prepare=prepare, spawn=self._hooks._spawn_process
        )
        try:
            async with entry.call_lock:
                return await self.collect(
                    entry, window, until, max_tokens, until_screen=until_screen
                )
        except asyncio.CancelledError:
            await self._owned.discard(entry)
            raise

    async def write(
        self,
        process_id: int,
        data: bytes,
        window: float,
        until: UntilPattern | None,
        max_tokens: int | None,
        until_screen: object,
    ) -> PtyUpdate:
        """`pty_write_stdin` after its argument checks: `data` written within the window
        (empty: a poll), then the rest of the window collected."""
        entry = await self.admitted(process_id)
        screen_pattern = check_until_screen(until_screen, entry.screen is not None)
        if screen_pattern is not None and entry.screen is not None:
            entry.screen.check_size()
        if data and not entry.tty and not entry.stdin_open:
            raise StdinClosedError(
                f"process {process_id} was started with tty=False, so its stdin is closed; "
                "start it with tty=True, or with stdin=True to keep its stdin open, to "
                "write to it (empty chars still polls it)"
            )
        # Keystrokes never wait behind a poll of the same process, whichever came first:
        # while this write waits for the entry, every poll window on it ends at once.
        async with entry.call_turn(write=bool(data)):
            if entry.removed:
                raise self.gone(entry)
            entry.touch()
            unwritten = 0
            loop = entry.loop
            window_end = loop.time() + window
            if data:
                if entry.stdin_ended:
                    raise StdinClosedError(_stdin_ended(process_id))
                if entry.exited:
                    raise ProcessExitedError(
                        f"process {process_id} has exited; poll it with empty chars to "
                        "collect its remaining output and exit code"
                    )
                entry.record_input(data)
                try:
                    unwritten = await write_within(
                        entry, data, window_end, write=self._hooks._write_stdin
                    )
                except EntryRemoved as removed:
                    raise self.gone(entry) from removed.__cause__
            remaining = max(0.0, window_end - loop.time())
            update = await self.collect(
                entry, remaining, until, max_tokens, poll=not data, until_screen=screen_pattern
            )
            if unwritten:
                update = dataclasses.replace(update, unwritten_bytes=unwritten)
            return update

    async def close_stdin(self, process_id: int) -> None:
        """`pty_close_stdin`: after every earlier write, the backend's `_close_stdin`."""
        entry = await self.admitted(process_id)
        if entry.tty:
            raise InvalidArgumentError(
                f"process {process_id} runs on a terminal (tty=True), whose input has no "
                "end to close (write Ctrl-D, \\x04, at the start of a line: the terminal's "
                "end of input), or start it with tty=False, stdin=True"
            )
        if not entry.stdin_open:
            raise StdinClosedError(
                f"process {process_id} was started with stdin closed (tty=False without "
                "stdin=True): there is nothing to close"
            )
        # Taken as a write: it waits for the writes before it (so their bytes reach
        # the process before its end of input) and ends a poll's window at once.
        async with entry.call_turn(write=True):
            if entry.removed:
                raise self.gone(entry)
            entry.touch()
            if entry.stdin_closed:
                return  # a second close: nothing more to end
            if entry.exited:
                raise ProcessExitedError(
                    f"process {process_id} has exited; poll it with empty chars to "
                    "collect its remaining output and exit code"
                )
            entry.stdin_ended = True
            try:
                await close_input(entry, close=self._hooks._close_stdin)
            except EntryRemoved as removed:
                raise self.gone(entry) from removed.__cause__

    async def resize(self, process_id: int, rows: int, cols: int) -> None:
        """`pty_resize` after its size check."""
        entry = await self.admitted(process_id)
        if not entry.tty:
            raise InvalidArgumentError(f"process {process_id} has no terminal (tty=False)")
        entry.touch()
        if entry.exited:
            return
        await self._hooks._resize(entry, rows, cols)
        entry.resize_terminal(rows, cols)

    async def interrupt(self, process_id: int) -> None:
        """`pty_interrupt`: a pending write ends first, then the hook."""
        entry = await self.admitted(process_id)
        entry.touch()
        if entry.exited:
            return
        write = entry.write_task
        if write is not None and not write.done() and not entry.stdin_ended:
            # (A pending close of stdin is no write: it is not cut short.)
            # Ctrl-C never queues behind input the process is not reading: the pending
            # write ends (its caller learns how much was not written), then this goes.
            write.cancel()
            await asyncio.wait({write})
        if entry.tty:
            entry.record_input(b"\x03")
        await self._hooks._interrupt(entry)

    async def screen(self, process_id: int) -> ScreenSnapshot:
        """`pty_screen`: the entry's screen rendered a slice at a time."""
        entry = self.lookup(process_id)
        screen = entry.screen
        if screen is None:
            if not entry.tty:
                raise InvalidArgumentError(
                    f"process {process_id} has no terminal (tty=False), so no screen"
                )
            raise InvalidArgumentError(f"process {process_id} was started with screen=False")
        entry.touch()
        return await screen.render(SCREEN_CHECK_SLICE_S)

    async def collect(
        self,
        entry: PtyEntry[H],
        window_s: float,
        until: UntilPattern | None,
        max_tokens: int | None,
        *,
        poll: bool = False,
        until_screen: UntilPattern | None = None,
    ) -> PtyUpdate:
        """One window over `entry` (`windows.collect_window`); a finished entry leaves."""
        update, finished = await collect_window(
            entry,
            window_s,
            until,
            max_tokens,
            final_drain=self._hooks._final_drain,
            poll=poll,
            until_screen=until_screen,
        )
        if finished:
            await self._owned.discard(entry)
        return update


def _stdin_ended(process_id: int) -> str:
    return (
        f"process {process_id}'s stdin was closed by pty_close_stdin; nothing more can be "
        "written to it (empty chars still polls it)"
    )
