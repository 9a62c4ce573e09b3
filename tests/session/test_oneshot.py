"""`sandbox.session.oneshot.run_one_shot`: the skeleton every backend's `exec` runs in.

Driven by real local children (`LocalProcess`, as the unix_local backend and the
stand-ins use it) and, for the faults a local child cannot produce on cue (a provider's
own timeout, a failing kill), by `Scripted`: a `OneShotProcess` written here the way a
backend writes one, whose steps park on events.
"""

from __future__ import annotations

import asyncio
import os
import secrets
from collections.abc import Awaitable, Callable

import pytest

from sandbox import arguments
from sandbox.backend import ExecCapture, LocalProcess
from sandbox.errors import ConnectionLostError, ExecTimeoutError
from sandbox.process_entry import CommandSpec
from sandbox.session.oneshot import run_one_shot
from tests.helpers import eventually, host_pids_with_arg


def _spec(script: str) -> CommandSpec:
    return arguments.build_command((script,), shell=True, env=None, cwd=None)


class Local:
    """A one-shot local command, as a backend's `OneShotProcess` (counts its calls)."""

    def __init__(self, proc: LocalProcess) -> None:
        self.proc = proc
        self.kills = 0
        self.released = False

    async def wait(self) -> int:
        code = await self.proc.wait()
        await self.proc.wait_eof()
        return code

    async def kill(self) -> None:
        self.kills += 1
        await self.proc.terminate(0)
        self.proc.close()

    async def release(self) -> None:
        self.released = True
        self.proc.close()


class Starter:
    """`_start_exec` over `LocalProcess`: remembers the processes it started."""

    def __init__(self) -> None:
        self.started: list[Local] = []

    async def __call__(self, spec: CommandSpec, capture: ExecCapture) -> Local:
        proc = LocalProcess.spawn(
            spec.argv,
            tty=False,
            env=dict(os.environ),
            cwd=None,
            on_stdout=capture.add_stdout,
            on_stderr=capture.add_stderr,
        )
        process = Local(proc)
        self.started.append(process)
        return process


async def test_a_finished_command_is_released_and_its_output_returned() -> None:
    start = Starter()
    capture = ExecCapture(1 << 20, timeout=None)
    result = await run_one_shot(start, _spec("echo out; echo err >&2; exit 7"), None, capture)
    assert (result.stdout, result.stderr, result.exit_code) == (b"out\n", b"err\n", 7)
    (process,) = start.started
    assert process.released and process.kills == 0


async def test_our_timeout_kills_the_tree_and_raises_with_what_it_printed() -> None:
    marker = f"oneshot-timeout-{secrets.token_hex(4)}"
    start = Starter()
    capture = ExecCapture(1 << 20, timeout=0.5)
    script = f"echo before; sleep 3600 & sh -c 'sleep 3600 # {marker}'; wait"
    with pytest.raises(ExecTimeoutError) as caught:
        await run_one_shot(start, _spec(script), 0.5, capture)
    assert caught.value.stdout == b"before\n"
    assert start.started[0].kills == 1 and not start.started[0].released
    assert host_pids_with_arg(marker) == []


async def test_a_cancelled_caller_kills_the_command_before_the_cancellation_leaves() -> None:
    marker = f"oneshot-cancel-{secrets.token_hex(4)}"
    start = Starter()
    capture = ExecCapture(1 << 20, timeout=None)
    task = asyncio.ensure_future(
        run_one_shot(start, _spec(f"echo up; sleep 3600 # {marker}"), None, capture)
    )
    assert await eventually(lambda: capture.stdout.value() == b"up\n")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert start.started[0].kills == 1
    assert host_pids_with_arg(marker) == []


class Scripted:
    """A backend's `OneShotProcess` whose `wait` raises `wait_error` once `go` is set
    (or returns 0), and whose `kill` appends to the capture, then raises `kill_error`."""

    def __init__(
        self,
        capture: ExecCapture,
        *,
        wait_error: BaseException | None = None,
        kill_error: Exception | None = None,
    ) -> None:
        self.capture = capture
        self.wait_error = wait_error
        self.kill_error = kill_error
        self.waiting = asyncio.Event()
        self.go = asyncio.Event()
        self.kills = 0
        self.released = False

    async def wait(self) -> int:
        self.waiting.set()
        await self.go.wait()
        if self.wait_error is not None:
            raise self.wait_error
        return 0

    async def kill(self) -> None:
        self.kills += 1
        self.capture.add_stdout(b"said while killed\n")
        if self.kill_error is not None:
            raise self.kill_error

    async def release(self) -> None:
        self.released = True


def _starting(process: Scripted) -> Callable[[CommandSpec, ExecCapture], Awaitable[Scripted]]:
    async def start(spec: CommandSpec, capture: ExecCapture) -> Scripted:
        return process

    return start


async def test_the_providers_timeout_is_rebuilt_after_the_kill_with_its_output() -> None:
    capture = ExecCapture(1 << 20, timeout=5.0)
    provider_says = capture.timeout_error("cmd", 5.0)
    process = Scripted(capture, wait_error=provider_says)
    process.go.set()
    with pytest.raises(ExecTimeoutError) as caught:
        await run_one_shot(_starting(process), _spec("cmd"), 5.0, capture)
    assert caught.value is not provider_says
    assert caught.value.stdout == b"said while killed\n"
    assert process.kills == 1 and not process.released


async def test_a_failed_kill_at_the_timeout_is_a_note_on_the_timeout_error() -> None:
    capture = ExecCapture(1 << 20, timeout=0.0)
    process = Scripted(capture, kill_error=ConnectionLostError("gone"))
    with pytest.raises(ExecTimeoutError) as caught:
        await run_one_shot(_starting(process), _spec("cmd"), 0.0, capture)
    assert any("killing the command's tree also failed: gone" in n for n in caught.value.__notes__)


async def test_a_backend_timeout_that_is_not_ours_is_raised_as_it_is_after_a_kill() -> None:
    capture = ExecCapture(1 << 20, timeout=None)
    own = TimeoutError("the transport's own")
    process = Scripted(capture, wait_error=own, kill_error=ConnectionLostError("no"))
    process.go.set()
    with pytest.raises(TimeoutError) as caught:
        await run_one_shot(_starting(process), _spec("cmd"), 3600.0, capture)
    assert caught.value is own and process.kills == 1
    assert caught.value.__notes__ == ["killing the command's tree also failed: no"]


async def test_a_failing_wait_kills_and_keeps_its_own_error() -> None:
    capture = ExecCapture(1 << 20, timeout=None)
    lost = ConnectionLostError("stream cut")
    process = Scripted(capture, wait_error=lost)
    task = asyncio.ensure_future(run_one_shot(_starting(process), _spec("cmd"), None, capture))
    await process.waiting.wait()
    process.go.set()
    with pytest.raises(ConnectionLostError) as caught:
        await task
    assert caught.value is lost and process.kills == 1 and not process.released


async def test_a_cancellation_during_a_failing_kill_still_raises_the_cancellation() -> None:
    capture = ExecCapture(1 << 20, timeout=None)
    process = Scripted(capture, kill_error=ConnectionLostError("no"))
    task = asyncio.ensure_future(run_one_shot(_starting(process), _spec("cmd"), None, capture))
    await process.waiting.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError) as caught:
        await task
    assert process.kills == 1
    assert caught.value.__notes__ == ["killing the command's tree also failed: no"]
