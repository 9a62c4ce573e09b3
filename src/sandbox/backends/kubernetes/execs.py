"""Processes in the pod: an exec each, run under the toolkit's wrapper, killed by a
second exec.

Kubernetes has no call that signals an exec's process (kubelet's streaming server only
copies streams; closing the socket of a tty exec leaves the process running: containerd
`internal/cri/io/exec_io.go`). So, as on Docker, every command runs under the toolkit's
`sh` wrapper with a random tag in its environment (`scripts.PRELUDE` exports it, since
an exec takes no environment), and the toolkit's kill or interrupt script runs as a
short control exec that finds the tagged tree through /proc. The runtime makes an
exec's first process a session leader (runc), as the wrapper needs.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass

from ...backend import settle
from ...errors import ConnectionLostError, ProviderError
from ..toolkit import (
    grace_ticks,
    interrupt_script,
    kill_script,
    new_tag,
    tag_environment,
    wrapper_argv,
)
from . import bounds, scripts
from .channels import ExecStream, OnData
from .client import KubeClient


@dataclass(frozen=True)
class Target:
    """Where execs run: the pod, its container, and the directory to change to first
    (None when the container's working directory is the workspace)."""

    namespace: str
    pod: str
    container: str | None
    cwd: str | None


class KubeProcess:
    """One command's exec: start, stream, write, resize, interrupt, kill.

    `on_stdout`/`on_stderr` get output; `on_end(code_or_error)` once the stream ended.
    """

    def __init__(
        self,
        client: KubeClient,
        target: Target,
        argv: Sequence[str],
        *,
        tty: bool,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        rows: int | None = None,
        cols: int | None = None,
        on_stdout: OnData,
        on_stderr: OnData | None = None,
        on_end: Callable[[int | BaseException], None] | None = None,
        stdin: bool | None = None,
        wrap: bool = True,
    ) -> None:
        self._client = client
        self._target = target
        self.tty = tty
        self.tag = new_tag()
        environment = dict(env or {})
        if wrap:
            environment.update(tag_environment(self.tag))
            size = {"rows": rows, "cols": cols} if tty and rows and cols else {}
            argv = wrapper_argv(self.tag, argv, set_tag=False, **size)
        self._argv = scripts.prelude_argv(argv, env=environment, cwd=cwd or target.cwd)
        self._stdin = tty if stdin is None else stdin
        self._rows, self._cols = rows, cols
        self._on_stdout = on_stdout
        self._on_stderr = on_stderr
        self._on_end = on_end
        self.stream: ExecStream | None = None
        self.killed = False
        self._closed = False

    @property
    def ended(self) -> bool:
        """True once the exec's stream ended (exit or loss)."""
        return self.stream is not None and self.stream.ended

    async def start(self, what: str = "start the command") -> None:
        """Connect the exec (the command runs from then on); size a terminal at once."""
        ws = await self._client.exec_socket(
            self._target.namespace,
            self._target.pod,
            self._target.container,
            self._argv,
            stdin=self._stdin,
            tty=self.tty,
            what=what,
        )
        self.stream = ExecStream(
            ws,
            what=what,
            on_stdout=self._on_stdout,
            on_stderr=self._on_stderr,
            on_end=self._on_end,
        )
        if self.tty and self._rows and self._cols:
            await self.stream.resize(self._rows, self._cols)

    def require_stream(self) -> ExecStream:
        """The stream, or `ConnectionLostError` before the start."""
        if self.stream is None:
            raise ConnectionLostError("the command's exec is not connected")
        return self.stream

    async def wait(self) -> int:
        """The exit code (see `ExecStream.wait`)."""
        return await self.require_stream().wait()

    async def write(self, data: bytes) -> None:
        """Keystrokes on stdin."""
        await self.require_stream().write(data)

    async def resize(self, rows: int, cols: int) -> None:
        """The terminal's new size."""
        await self.require_stream().resize(rows, cols)

    async def interrupt(self) -> None:
        """SIGINT to the wrapper's process group, by the toolkit's interrupt script."""
        await run_control(
            self._client, self._target, interrupt_script([self.tag]), "interrupt the command"
        )

    async def terminate(self, grace_s: float, *, kill: bool = True) -> None:
        """Kill the tree (unless it exited, or `kill` is False because the pod goes
        anyway), then close the socket. Idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            # A stream that ended without an exit status (a dropped socket) leaves the
            # process running in the pod: it is killed too.
            exited = self.stream is not None and isinstance(self.stream.outcome(), int)
            if kill and self.stream is not None and not exited:
                self.killed = True
                script = kill_script([self.tag], ticks=grace_ticks(grace_s))
                await run_control(self._client, self._target, script, "kill the command")
        finally:
            if self.stream is not None:
                await self.stream.close()

    async def kill_unstarted(self) -> None:
        """After a start that was cut short: the exec may run without our knowing it
        (the upgrade reached the server), so its tag is killed anyway."""
        if self.stream is None and not self._closed:
            self._closed = True
            script = kill_script([self.tag], ticks=0)
            await run_control(self._client, self._target, script, "kill the command")
        else:
            await self.terminate(0)


class KubeOneShot:
    """A one-shot command (`OneShotProcess`): the base session waits, times out and
    kills; the kill is the tagged tree's."""

    def __init__(self, process: KubeProcess, grace_s: float) -> None:
        self._process = process
        self._grace_s = grace_s

    async def wait(self) -> int:
        """The exit code from the stream's final Status."""
        return await self._process.wait()

    async def kill(self) -> None:
        """Kill the tree, close the socket."""
        await self._process.terminate(self._grace_s)

    async def release(self) -> None:
        """Close the socket (the command ended)."""
        await self._process.terminate(0, kill=False)


async def run_control(
    client: KubeClient,
    target: Target,
    argv: Sequence[str],
    what: str,
    *,
    stdin: bytes | AsyncIterator[bytes] | None = None,
    on_stdout: Callable[[bytes], bool] | None = None,
) -> tuple[int, bytes]:
    """Run a short command of ours (not wrapped) to its end: its exit code and its
    first `MAX_CONTROL_OUTPUT_BYTES` of stdout and stderr together. With `stdin`, those
    bytes (or chunks) are sent and stdin closed (v5); `on_stdout` takes stdout instead
    and returns False to stop (the exec is then cut off; the caller kills what it
    left). Each step has `CONTROL_TIMEOUT_S`: the start, every stdin chunk, the wait for
    the status after the last one (so a long upload is bounded by its progress)."""
    output = bytearray()
    stopped = asyncio.Event()

    def keep(data: bytes) -> None:
        room = bounds.MAX_CONTROL_OUTPUT_BYTES - len(output)
        if room > 0:
            output.extend(data[:room])

    def take(data: bytes) -> None:
        if stopped.is_set():
            return
        assert on_stdout is not None
        if not on_stdout(data):
            stopped.set()

    process = KubeProcess(
        client,
        target,
        argv,
        tty=False,
        stdin=stdin is not None,
        wrap=False,
        on_stdout=take if on_stdout is not None else keep,
        on_stderr=keep,
    )
    step = bounds.CONTROL_TIMEOUT_S
    try:
        async with asyncio.timeout(step):
            await process.start(what)
        stream = process.require_stream()
        try:
            if isinstance(stdin, bytes):
                async with asyncio.timeout(step):
                    await stream.write(stdin)
            elif stdin is not None:
                async for chunk in stdin:
                    async with asyncio.timeout(step):
                        await stream.write(chunk)
            async with asyncio.timeout(step):
                if stdin is not None and stream.can_close_stdin:
                    await stream.close_stdin()
        except ConnectionLostError:
            # The command ended before reading all its input (a refusal): its status
            # has come, or the stream is really gone (then `wait` says so).
            if not stream.ended:
                raise
        async with asyncio.timeout(step):
            waiting = asyncio.ensure_future(stream.wait())
            stopping = asyncio.ensure_future(stopped.wait())
            try:
                await asyncio.wait([waiting, stopping], return_when=asyncio.FIRST_COMPLETED)
            finally:
                stopping.cancel()
                waiting.cancel()
            if not waiting.done() or waiting.cancelled():
                return -1, bytes(output)
            code = waiting.result()
    except TimeoutError:
        raise ProviderError(f"could not {what}: the exec did not finish in time") from None
    finally:
        await settle(process.terminate(0, kill=False))
    return code, bytes(output)
