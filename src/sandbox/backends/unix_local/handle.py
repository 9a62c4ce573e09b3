"""The handles of unix_local's children (`LocalProcess`es): `LocalHandle`, a `pty_*`
process as the `Process` its spawn stores, so the base session's hooks write, resize,
interrupt, end input and drain through it; `LocalOneShot`, a one-shot command.

Every control but `write` and `kill` is one synchronous call on the child: a write
takes what the terminal has room for at once (`try_write`), and an exited process with
nobody left alive in its cgroup leaf is torn down without waiting (`finish_now`).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Callable
from typing import Any, ClassVar

from ...backend import EXIT_DRAIN_GRACE_S, ExecCapture, LocalProcess, OutputSink, Process


class LocalHandle(Process):
    """The controls of one `LocalProcess` started for `sink`; `grace_s` is the time a
    `kill` gives its tree between the polite signals and SIGKILL."""

    # Ctrl-C on a terminal that has no room for it still signals its foreground group.
    interrupts_terminal: ClassVar[bool] = True

    def __init__(self, process: LocalProcess, sink: OutputSink[Any], *, grace_s: float) -> None:
        self.process = process
        self.grace_s = grace_s
        # For `count_input` (a write cut short says how much went) and `sandbox_stopping`.
        self._sink = sink

    def __repr__(self) -> str:
        return f"LocalHandle(pid={self.process.pid})"

    @property
    def pid(self) -> int:
        """The child's pid on this host."""
        return self.process.pid

    @property
    def tag(self) -> str | None:
        """The tag its tree carries (`sandbox.local.tree`): a crash's leftovers are found by it."""
        return self.process.tag

    def try_write(self, data: bytes) -> int:
        """What the terminal (or the open stdin pipe) takes right now."""
        return self.process.write_some(data)

    async def write(self, data: bytes) -> None:
        """All of `data`, waiting for room; each part taken is counted into the sink."""
        await self.process.write(data, on_progress=self._sink.count_input)

    async def close_stdin(self) -> None:
        """Close our end of the stdin pipe: the process reads what is in it, then
        end-of-file."""
        self.process.close_stdin()

    async def resize(self, rows: int, cols: int) -> None:
        """Set the terminal's size."""
        self.process.resize(rows, cols)

    async def interrupt(self) -> None:
        """On a terminal: the interrupt character, or SIGINT to the terminal's
        foreground group when it has no room for it (`LocalProcess.interrupt_terminal`);
        without one: SIGINT to the process's group."""
        if self.process.tty:
            self.process.interrupt_terminal()
        else:
            self.process.signal_group(signal.SIGINT)

    async def drain(self) -> None:
        """Read what already waits in the kernel (no await: it is all there)."""
        self.process.drain_now()

    def finish_now(self) -> bool:
        """The teardown of an exited leader whose cgroup leaf holds nobody alive, done
        now (`LocalProcess.finish_now`); False for any other process."""
        return self.process.finish_now(escapees=not self._sink.sandbox_stopping)

    async def kill(self, *, sandbox_stopping: bool = False) -> None:
        """The whole tree: polite signals, the grace, SIGKILL; reaped, every fd closed.
        When the sandbox stops right after, the session's own sweep finds what escaped
        the tree once, instead of every teardown looking through /proc for it."""
        await self.process.terminate(self.grace_s, escapees=not sandbox_stopping)

    def kill_now(self) -> None:
        """SIGKILL the tree synchronously, touching no event loop (an unclosed session
        being garbage-collected)."""
        self.process.kill_now()


class LocalOneShot:
    """A one-shot local command (`OneShotProcess`)."""

    def __init__(
        self, proc: LocalProcess, capture: ExecCapture, memory_note: Callable[[int], bytes]
    ) -> None:
        self._proc = proc
        self._capture = capture
        self._memory_note = memory_note

    async def wait(self) -> int:
        """The exit status, once the output ended (or its short grace passed); the
        memory limit's note goes to stderr."""
        code = await self._proc.wait()
        note = self._memory_note(code)
        if note:
            self._capture.add_stderr(note)
        # A background child may hold the pipes open: give it the same short grace a
        # PTY window gives, then `release` kills the whole group.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(EXIT_DRAIN_GRACE_S):
                await self._proc.wait_eof()
        self._proc.drain_now()
        return code

    async def kill(self) -> None:
        """SIGKILL at once (a timed-out or cancelled command)."""
        await self._proc.terminate(0)

    async def release(self) -> None:
        """Kill what is left of its group, reap it, close its fds."""
        self._proc.close()
