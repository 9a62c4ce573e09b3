"""The e2b backend's processes: `E2BProcess`, the handle of a `pty_exec_start` process
(a `Process`: the base session's hooks write to it, resize it, interrupt it, end its
input and kill it through its methods), `spawn_process` that starts one, and the
one-shot `exec`'s start (`start_exec`, whose `OneShot` the base session drives), plus
how the SDK's text output becomes bytes again. With the runner (`runner_link`), their
twins `spawn_on_runner` and `start_on_runner` start the same through the runner.

Output: terminal output arrives as bytes. Pipe output arrives as `str`: the SDK decodes
each stream with an incremental UTF-8 decoder (so characters split across chunks are
kept whole) and we encode it back. Bytes that are not valid UTF-8 reach us as U+FFFD, so
binary output on pipes is not byte-exact (use a terminal or `read_file` for that).
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any, cast

from e2b import NotFoundException, PtySize

from ...backend import (
    CommandSpec,
    ExecCapture,
    OneShotProcess,
    OutputSink,
    Process,
    cancel_and_wait,
    settle,
)
from ..toolkit import (
    CommandCheck,
    RunnerProcess,
    ShellTrap,
    new_tag,
    spawn_through_runner,
    start_one_shot,
    tag_environment,
    wait_for_verdict,
)
from .client import E2BClient
from .runner_link import E2BRunner
from .scripts import TYPED_LINE, line_environment, pipe_line, tty_command


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
class E2BProcess(Process):
    """What the backend keeps about one process (`entry.handle`): its tags (`tag`, the
    command's, for the interrupt script; `outer_tag`, the process envd started, when it
    differs: see `scripts`), the start task (shielded: the teardown waits for it), the
    SDK handle, the waiter task reporting its end, and the shell trap filtering its
    output. As a `Process` it keeps what its controls need: `client` (the session's
    bounded view of the sandbox, whose `errors` translate the SDK's exceptions) and
    `keep` (the session keeps the sandbox at close: its deletion does not end this
    process)."""

    client: E2BClient = field(repr=False)
    tty: bool
    keep: bool = False
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

    async def watch(self, entry: OutputSink[Any]) -> None:
        """Wait for the process's end and report it (or report the stream lost)."""
        try:
            code = await self.client.wait_code(self.handle)
        except Exception as exc:
            self._flush_trap(entry)
            entry.report_lost(self.client.errors.lost_reason(exc))
            return
        self.ended = True
        self._flush_trap(entry)
        entry.report_exit(code)
        entry.report_eof()

    def _flush_trap(self, entry: OutputSink[Any]) -> None:
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

    # ---- the controls (`Process`) ----------------------------------------------------

    async def write(self, data: bytes) -> None:
        """Send keystrokes to the PTY, or bytes to a pipe command's open stdin (in
        pieces of at most `STDIN_CHUNK`)."""
        if self.tty:
            await self.client.send(self.handle.pid, data)
        else:
            await self.client.send_input(self.handle.pid, data)

    async def close_stdin(self) -> None:
        """`commands.close_stdin`: envd closes the command's stdin pipe after the input
        sent before (each `send_stdin` answered first). Asked once per process."""
        if not self.stdin_closed:
            await self.client.close_input(self.handle.pid)
            self.stdin_closed = True

    async def resize(self, rows: int, cols: int) -> None:
        """Resize the PTY (`pty.resize`); a process that just exited is left alone."""
        client = self.client
        try:
            await client.timed(
                client.sandbox.pty.resize(
                    self.handle.pid, PtySize(rows=rows, cols=cols), **client.request()
                ),
                "resize the terminal",
            )
        except NotFoundException:
            return  # it just exited: nothing to resize
        except Exception as exc:
            client.errors.fail(exc, "resize the terminal")

    async def interrupt(self) -> None:
        """SIGINT to a pipe command's process group, sent by the toolkit's interrupt
        script (a terminal gets the interrupt character through `write`)."""
        await self.client.interrupt(self.tag)

    async def kill(self, *, sandbox_stopping: bool = False) -> None:
        """Wait for an unfinished start, kill the tagged tree and the process (unless the
        sandbox is killed right after), then `release` it: the waiter task stopped, the
        SDK handle (its reader task) disconnected, whatever happened before."""
        handle = await self.started_handle()
        # A sandbox the close kills next takes every process with it: killing them one
        # by one first would only cost requests.
        sandbox_going = sandbox_stopping and not self.keep
        error: BaseException | None = None
        if handle is not None and not self.ended and not sandbox_going:
            try:
                await self.client.kill_tree(handle.pid, self.tags, tty=self.tty)
            except Exception as exc:
                error = exc
        await self.release()
        if error is not None:
            raise error

    async def release(self) -> None:
        """Stop following the process (its waiter, the SDK's reader); envd keeps it
        running (a detach, or the end of `kill`)."""
        handle = await self.started_handle()
        if self.waiter is not None:
            await cancel_and_wait([self.waiter])
        if handle is not None:
            await self.client.disconnect(handle)


async def spawn_process(entry: OutputSink[E2BProcess], client: E2BClient, *, keep: bool) -> None:
    """Start `entry.spec`, its handle an `E2BProcess` stored in `entry.handle` before
    anything starts. tty: an E2B PTY (a login bash) running the shell-trap line; pipes: a
    background command, its stdin closed unless `entry.stdin_open`. Output flows into
    `entry.feed`; with a command check, its verdict is waited for."""
    spec = entry.spec
    command = spec.command
    proc = E2BProcess(client, tty=spec.tty, keep=keep)
    entry.handle = proc
    # With a check (a `cwd`, or `shell=False`) the process starts in E2B's default
    # directory and the check enters `cwd`; its verdict is waited for below.
    check = CommandCheck.needed(command, cwd=command.cwd)
    shell_command = (
        command.shell_command if check is None else check.shell(command.argv, announce=True)
    )
    cwd = command.cwd if check is None else None
    if check is not None or spec.tty:
        proc.trap = ShellTrap(report_exit=False, token=None if check is None else check.token)
    trap = proc.trap
    if trap is not None and spec.tty:
        shell_trap = trap

        def on_data(data: bytes) -> None:
            """Terminal output, minus what the shell trap added."""
            shown = shell_trap.feed(bytes(data))
            if shown:
                entry.feed(shown)

        # The trap's line reaches the login bash through its environment; only a
        # short fixed line is typed (see `scripts.line_environment`).
        line = trap.line(tty_command(proc.tag, shell_command), tty=True, announced=bool(check))
        start: Coroutine[Any, Any, Any] = client.sandbox.pty.create(
            size=PtySize(rows=spec.rows, cols=spec.cols),
            on_data=on_data,
            cwd=cwd,
            envs={**(command.env or {}), **tag_environment(proc.tag), **line_environment(line)},
            timeout=client.process_timeout,
            **client.request(),
        )
    else:

        def on_output(chunk: str | bytes) -> None:
            """Pipe output (stdout and stderr, in arrival order) as bytes."""
            entry.feed(text_to_bytes(chunk))

        def on_stdout(chunk: str | bytes) -> None:
            """Stdout behind a check: the trap strips the check's start marker."""
            assert trap is not None
            shown = trap.feed(text_to_bytes(chunk))
            if shown:
                entry.feed(shown)

        start = client.sandbox.commands.run(
            pipe_line(proc.tag, shell_command, stdin=spec.stdin),
            background=True,
            envs={**(command.env or {}), **tag_environment(proc.outer_tag)},
            cwd=cwd,
            on_stdout=on_output if check is None else on_stdout,
            on_stderr=on_output,
            stdin=spec.stdin,
            timeout=client.process_timeout,
            retain_output=False,
            **client.request(),
        )
    # Our task, shielded: a cancelled caller leaves it to the teardown (`kill`), which
    # waits for it and kills what it started.
    proc.start_task = asyncio.ensure_future(client.bounded(start, client.start_timeout))
    try:
        proc.handle = await asyncio.shield(proc.start_task)
    except Exception as exc:
        client.errors.fail(exc, "start a process")
    proc.waiter = asyncio.ensure_future(proc.watch(entry))
    if spec.tty:
        await client.send(proc.handle.pid, TYPED_LINE.encode())
    if check is not None and trap is not None:
        await wait_for_verdict(entry, trap, check)


async def spawn_on_runner(entry: OutputSink[E2BProcess], runner: E2BRunner) -> None:
    """Start `entry.spec` as a process of the runner (its handle a `RunnerProcess`, its
    tree killed by the runner), in its folder (`E2BRunner.cwd`) with the runner's
    environment for it."""
    command = entry.spec.command
    env = runner.environment(command.env, tty=entry.spec.tty)
    sink = cast(OutputSink[RunnerProcess], entry)
    await spawn_through_runner(runner.client, sink, env=env, cwd=runner.cwd(command.cwd))


async def start_on_runner(
    runner: E2BRunner, spec: CommandSpec, capture: ExecCapture
) -> OneShotProcess:
    """The runner's one-shot of `spec`, stdout and stderr apart, byte-exact, in its folder
    (`E2BRunner.cwd`) with the runner's environment for it."""
    env = runner.environment(spec.env, tty=False)
    return await start_one_shot(runner.client, spec, capture, env=env, cwd=runner.cwd(spec.cwd))


async def start_exec(client: E2BClient, spec: CommandSpec, capture: ExecCapture) -> OneShotProcess:
    """Start a one-shot command as a background job under the tagged wrapper, its output
    streamed into the bounded capture (see `OneShot`). A `cwd` (or `shell=False`) runs
    behind the command check: E2B would refuse a missing `cwd` with an error of its own."""
    check = capture.check = CommandCheck.needed(spec, cwd=spec.cwd)
    command = spec.shell_command if check is None else check.shell(spec.argv, announce=False)
    proc = E2BProcess(client, tty=False)
    start = client.sandbox.commands.run(
        pipe_line(proc.tag, command),
        background=True,
        envs={**(spec.env or {}), **tag_environment(proc.outer_tag)},
        on_stdout=lambda chunk: capture.add_stdout(text_to_bytes(chunk)),
        on_stderr=lambda chunk: capture.add_stderr(text_to_bytes(chunk)),
        stdin=False,
        timeout=client.process_timeout,
        retain_output=False,
        **client.request(),
    )
    # Our task, shielded: if this caller is cancelled, wait for it and kill what it
    # started (nobody else knows the command yet).
    proc.start_task = asyncio.ensure_future(client.bounded(start, client.start_timeout))
    try:
        handle = await asyncio.shield(proc.start_task)
    except asyncio.CancelledError:
        await settle(_undo_start(proc))
        raise
    except Exception as exc:
        client.errors.fail(exc, "start a command")
    return OneShot(client, handle, proc.tags)


async def _undo_start(process: E2BProcess) -> None:
    """Kill what a cancelled one-shot start made, once the start came to its end."""
    handle = await process.started_handle()
    if handle is not None:
        await OneShot(process.client, handle, process.tags).kill()


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
