"""The stop signals of every `sandbox` command: SIGTERM, SIGHUP and SIGINT.

Their default action kills the process on the spot: the session's processes and its
temporary workspace would be left behind. While a command runs, `StopSignals` turns them
into a call on the event loop instead, and `run_command` uses it for every CLI command:

- the first stop signal cancels the command's task, so its `async with` closes (or with
  `--session`, detaches) the session exactly as on an error;
- the process then exits 128+N, N being that first signal, as a shell expects of a tool
  a signal stopped;
- a later stop signal does not abandon the cleanup halfway: it is noted once on stderr
  and the close goes on to its end.

A stop signal the process was started with ignored (`nohup`, a background job of a
non-interactive shell) stays ignored. `sandbox mcp` stops its server on the same signals
through the same `StopSignals`.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable, Coroutine
from types import TracebackType
from typing import Any

from ..errors import SandboxError
from .std_streams import error_line, say

STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)

# What `signal.getsignal` returns: a handler, SIG_DFL/SIG_IGN, or None (set outside Python).
_Handler = Callable[[int, Any], Any] | int | signal.Handlers | None


class StopSignals:
    """While entered (on the event loop's thread, with a loop running), each stop signal
    calls `on_signal(signum)` on the loop instead of its default action; `first` is the
    first one received. Signals ignored when it is entered stay ignored; the previous
    handlers are put back on exit."""

    def __init__(self, on_signal: Callable[[int], None]) -> None:
        self._on_signal = on_signal
        self._saved: dict[int, _Handler] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self.first: int | None = None

    def __enter__(self) -> StopSignals:
        self._loop = asyncio.get_running_loop()
        for signum in STOP_SIGNALS:
            previous = signal.getsignal(signum)
            if previous == signal.SIG_IGN:
                continue  # the one who started us asked for it to be ignored
            self._loop.add_signal_handler(signum, self._received, signum)
            self._saved[signum] = previous
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        assert self._loop is not None
        for signum, previous in self._saved.items():
            self._loop.remove_signal_handler(signum)
            if previous is not None:
                # remove_signal_handler sets SIG_DFL (SIGINT: KeyboardInterrupt); put back
                # what was there, e.g. asyncio.run's own SIGINT handler.
                signal.signal(signum, previous)
        self._saved.clear()

    def _received(self, signum: int) -> None:
        if self.first is None:
            self.first = signum
        self._on_signal(signum)


def signal_name(signum: int) -> str:
    """`SIGTERM` for 15."""
    return signal.Signals(signum).name


def run_command(main: Coroutine[Any, Any, int]) -> int:
    """Run a CLI command's coroutine to its end (`asyncio.run`); its exit status, or
    128+N when stop signal N cut it short (after its cleanup ran to its end)."""
    return asyncio.run(_until_signalled(main))


async def _until_signalled(main: Coroutine[Any, Any, int]) -> int:
    task = asyncio.ensure_future(main)
    cancelled = noted = False

    def stop(signum: int) -> None:
        nonlocal cancelled, noted
        if not cancelled:
            cancelled = True
            task.cancel()
        elif not noted:
            # A second cancel would cut the close short: say once that it goes on.
            noted = True
            say(f"sandbox: {signal_name(signum)}: still closing the session, please wait")

    with StopSignals(stop) as signals:
        try:
            await asyncio.wait({task})
        except asyncio.CancelledError:
            task.cancel()
            await asyncio.wait({task})
            raise
    if signals.first is None:
        return task.result()
    try:
        task.result()
    except asyncio.CancelledError:
        pass
    except SandboxError as exc:
        # The cleanup itself failed (a close the provider refused): worth a line, but
        # the status still says what stopped the command.
        say(error_line(exc))
    except OSError:
        pass  # our output went away with the terminal (SIGHUP): the status tells
    return 128 + signals.first
