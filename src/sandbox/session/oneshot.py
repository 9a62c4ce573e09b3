"""The one-shot skeleton: how every backend's `exec` is run to completion.

A backend implements one hook, `_start_exec` (start the command, append its output to
an `ExecCapture`, return a `OneShotProcess`); `run_one_shot` does the rest for all of
them: the wait within the timeout, and on a timeout, a cancellation, a failure or the
session's close, the kill of the command's tree, settled, before the error leaves.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from ..errors import ExecTimeoutError
from ..exec_output import ExecCapture, OneShotProcess
from ..process_entry import CommandSpec
from ..settle import settle
from ..types import ExecResult

StartExec = Callable[[CommandSpec, ExecCapture], Awaitable[OneShotProcess]]


async def run_one_shot(
    start: StartExec, spec: CommandSpec, timeout: float | None, capture: ExecCapture
) -> ExecResult:
    """Start `spec` with `start` (a backend's `_start_exec`) and wait for it within
    `timeout`, then release it and return `capture.result(code)`.

    At our timeout, or a timeout the backend reports as `ExecTimeoutError` (the
    provider's own), the tree is killed and `capture.timeout_error(...)` is raised,
    built after the kill so it carries the kill's last output. Any other error or a
    cancellation kills the tree too and propagates; a failed kill is a note on it.
    """
    process = await start(spec, capture)
    try:
        async with asyncio.timeout(timeout) as scope:
            code = await process.wait()
    except TimeoutError as exc:
        if not scope.expired():  # the backend's own timeout, not ours
            await kill_noting(process, exc)
            raise
        raise await killed_at_timeout(process, capture, spec.display, timeout) from None
    except ExecTimeoutError:
        raise await killed_at_timeout(process, capture, spec.display, timeout) from None
    except BaseException as exc:
        await kill_noting(process, exc)
        raise
    await settle(process.release())
    return capture.result(code)


async def kill_noting(process: OneShotProcess, error: BaseException | list[str]) -> None:
    """Kill a one-shot command (settled) on the way out with `error`: a kill that fails
    is noted on `error` (or appended to a list of notes), which stays the one raised
    (it says what happened first)."""
    try:
        await settle(process.kill())
    except Exception as kill_error:
        note = f"killing the command's tree also failed: {kill_error}"
        if isinstance(error, list):
            error.append(note)
        else:
            error.add_note(note)


async def killed_at_timeout(
    process: OneShotProcess, capture: ExecCapture, display: str, timeout: float | None
) -> ExecTimeoutError:
    """Kill a timed-out one-shot command (settled), then the `ExecTimeoutError` with what
    it printed, the kill's own output collection included, and a note if the kill failed."""
    notes: list[str] = []
    await kill_noting(process, notes)
    error = capture.timeout_error(display, timeout)
    for note in notes:
        error.add_note(note)
    return error
