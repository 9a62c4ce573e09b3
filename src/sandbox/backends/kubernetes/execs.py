"""Processes in the pod: an exec each, run under the toolkit's wrapper, killed by a
second exec.

Kubernetes has no call that signals an exec's process (kubelet's streaming server only
copies streams; closing the socket of a tty exec leaves the process running: containerd
`internal/cri/io/exec_io.go`). So, as on Docker, every command runs under the toolkit's
`sh` wrapper with a random tag in its environment (`scripts.PRELUDE` exports it, since
an exec takes no environment), and the toolkit's kill or interrupt script runs as a
short control exec that finds the tagged tree through /proc. The runtime makes an
exec's first process a session leader (runc), as the wrapper needs.

`KubeProcess` is a process's handle (a `Process`: the base session's hooks write,
resize, interrupt and end its input through it); `spawn` makes one for an entry and
`start_command` one for a one-shot command (`KubeOneShot`); `run_control` runs a short
command of ours to its end, `check_workdir` the probe of a session's start.
"""

from __future__ import annotations

import asyncio
import posixpath
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass

from ...backend import (
    CommandCheck,
    CommandSpec,
    ExecCapture,
    OutputSink,
    Process,
    ShellTrap,
    settle,
    wait_for_verdict,
)
from ...errors import (
    ConnectionLostError,
    ProcessExitedError,
    ProviderError,
    UnsupportedOperationError,
    WorkdirError,
)
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
from .client import V4_PROTOCOL, KubeClient

# A terminal's TERM when the command's environment names none.
DEFAULT_TERM = "xterm-256color"


@dataclass(frozen=True)
class Target:
    """Where execs run: the pod, its container, and the directory to change to first
    (None when the container's working directory is the workspace)."""

    namespace: str
    pod: str
    container: str | None
    cwd: str | None


class KubeProcess(Process):
    """One command's exec: start, stream, write, resize, interrupt, kill; a `Process`,
    so the base session's hooks drive an entry's exec through it.

    `on_stdout`/`on_stderr` get output; `on_end(code_or_error)` once the stream ended.
    `process_id` names it in errors; `grace_s` is the time a `kill` gives the tree
    between SIGTERM and SIGKILL.
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
        process_id: int = 0,
        grace_s: float = 0.0,
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
        self.process_id = process_id
        self.grace_s = grace_s
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

    def _lost(self, exc: ConnectionLostError) -> Exception:
        """The error of a write or a close of stdin the stream refused: the process
        exited (its status came), else the connection is lost."""
        if self.ended and isinstance(self.require_stream().outcome(), int):
            return ProcessExitedError(
                f"process {self.process_id} has exited; poll it with empty chars to "
                "collect its remaining output and exit code"
            )
        return ConnectionLostError(f"lost the connection to process {self.process_id}: {exc}")

    async def write(self, data: bytes) -> None:
        """Keystrokes (or data on an open stdin) on the exec's stdin channel."""
        try:
            await self.require_stream().write(data)
        except ConnectionLostError as exc:
            raise self._lost(exc) from None

    async def close_stdin(self) -> None:
        """v5's CLOSE of the stdin channel (`[255, 0]`): the kubelet closes the
        process's stdin after the frames sent before it; the output goes on. (A spawn
        with open stdin under v4 is refused before this can be asked.)"""
        try:
            await self.require_stream().close_stdin()
        except ConnectionLostError as exc:
            raise self._lost(exc) from None

    async def resize(self, rows: int, cols: int) -> None:
        """The terminal's new size, on the resize channel (4)."""
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

    async def kill(self, *, sandbox_stopping: bool = False) -> None:
        """Kill the tree (`grace_s`, then SIGKILL) by a second exec, close the socket;
        after a start cut short, kill its tag anyway (`kill_unstarted`). Whether the
        pod's deletion makes the kill needless is the session's to say (it asks for
        `release` instead), so `sandbox_stopping` changes nothing here."""
        if self.stream is None:
            await self.kill_unstarted()
        else:
            await self.terminate(self.grace_s)

    async def release(self) -> None:
        """Close the socket without killing: the pod's deletion, next, ends the
        process."""
        await self.terminate(self.grace_s, kill=False)


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


def command_argv(spec: CommandSpec, *, announce: bool) -> tuple[Sequence[str], CommandCheck | None]:
    """What an exec runs for `spec`: its argv, behind the command check when it needs
    one (then the check too)."""
    # Relative stays relative: every exec starts in the workspace.
    cwd = None if spec.cwd is None else posixpath.normpath(spec.cwd)
    check = CommandCheck.needed(spec, cwd=cwd)
    if check is None:
        return spec.argv, None
    return check.argv(spec.argv, announce=announce), check


def command_environment(env: Mapping[str, str], spec: CommandSpec, *, tty: bool) -> dict[str, str]:
    """A command's variables: the session's `env`, the command's over them, and TERM
    for a terminal that names none."""
    merged = {**env, **(spec.env or {})}
    if tty:
        merged.setdefault("TERM", DEFAULT_TERM)
    return merged


async def start_command(
    client: KubeClient,
    target: Target,
    spec: CommandSpec,
    capture: ExecCapture,
    *,
    env: Mapping[str, str],
    grace_s: float,
) -> KubeOneShot:
    """A one-shot command: one exec on pipes, stdout and stderr apart, straight into
    `capture` (its `check` set when the command runs behind one), with the session's
    `env`. If its start fails or is cancelled, its tag is killed here (nobody else
    knows it)."""
    argv, capture.check = command_argv(spec, announce=False)
    process = KubeProcess(
        client,
        target,
        argv,
        tty=False,
        env=command_environment(env, spec, tty=False),
        on_stdout=capture.add_stdout,
        on_stderr=capture.add_stderr,
    )
    try:
        await process.start()
    except BaseException as exc:
        try:
            await settle(process.kill_unstarted())
        except Exception as cleanup_exc:
            exc.add_note(f"killing the half-started command also failed: {cleanup_exc}")
        raise
    return KubeOneShot(process, grace_s)


async def spawn(
    client: KubeClient,
    target: Target,
    entry: OutputSink[KubeProcess],
    *,
    env: Mapping[str, str],
    grace_s: float,
) -> None:
    """Start `entry.spec` as an exec (the command behind its check, if it needs one),
    with the session's `env`, whose socket feeds the entry, the handle stored before
    the first await; with a check, wait for its verdict. Pipes processes get no stdin
    at all (their EOF, under v4 too), unless started with `stdin=True`: that needs v5's
    CLOSE to end it, so under v4 it is refused (before the exec when an earlier one
    agreed on v4, else right after)."""
    spec = entry.spec
    argv, check = command_argv(spec.command, announce=True)
    environment = command_environment(env, spec.command, tty=spec.tty)
    if spec.stdin and client.agreed == V4_PROTOCOL:
        raise _no_stdin_close(V4_PROTOCOL)
    trap = None if check is None else ShellTrap(report_exit=False, token=check.token)

    def on_stdout(data: bytes) -> None:
        entry.feed(trap.feed(data) if trap is not None else data)

    def on_end(outcome: int | BaseException) -> None:
        entry.report_eof()
        if isinstance(outcome, int):
            entry.report_exit(outcome)
        else:
            entry.report_lost(str(outcome))

    process = KubeProcess(
        client,
        target,
        argv,
        tty=spec.tty,
        env=environment,
        rows=spec.rows if spec.tty else None,
        cols=spec.cols if spec.tty else None,
        on_stdout=on_stdout,
        on_stderr=entry.feed,
        on_end=on_end,
        stdin=spec.tty or spec.stdin,
        process_id=entry.process_id,
        grace_s=grace_s,
    )
    entry.handle = process
    await process.start()
    stream = process.require_stream()
    if spec.stdin and not stream.can_close_stdin:
        # The teardown of the failed start ends the command, which never ran long.
        raise _no_stdin_close(stream.protocol)
    if trap is not None and check is not None:
        await wait_for_verdict(entry, trap, check)


def _no_stdin_close(protocol: str) -> UnsupportedOperationError:
    return UnsupportedOperationError(
        f"stdin=True: this cluster's pods/exec speaks {protocol or 'an old protocol'}, "
        "which cannot end a process's stdin while its output goes on (v5.channel.k8s.io "
        "can); use tty=True, or redirect the input from a file"
    )


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


async def check_workdir(client: KubeClient, target: Target, workdir: str) -> None:
    """Reach the pod by an exec that enters the workspace: `WorkdirError` when it
    cannot (the exec's exit status and first words)."""
    code, output = await run_control(
        client,
        target,
        scripts.prelude_argv(["sh", "-c", ":"], cwd=target.cwd),
        "reach the pod",
    )
    if code != 0:
        raise WorkdirError(
            f"the workdir {workdir!r} is not usable in the pod (exit {code}): "
            + output.decode("utf-8", "replace").strip()[:200],
            cwd=workdir,
        )
