"""One process in the container: an exec, its stream, its exit, and how to kill it.

Docker has no call that kills an exec. Every command therefore runs under the
toolkit's `sh` wrapper (`sandbox.backends.toolkit.shell`), the exec's first process,
with a random tag in the exec's environment: it survives Ctrl-C itself, reports a
signal death as 128+N without the shell's notice, kills the rest of its session when
the command exits, and exits with the command's status. The runtime makes each exec's
first process a session leader, as the wrapper needs. A second, short exec runs the
toolkit's kill script, which finds the tree through /proc (tagged processes, the
sessions they lead, their descendants) and signals it: SIGINT to the wrapper's process
group for an interrupt; for a teardown SIGHUP/SIGTERM/SIGCONT, a grace period, then
SIGKILL until nothing is left. The wrapper stays the tagged parent even when the
command replaces its own environment, so the tree can always be found.

Exits are detected by event, never by polling every process: the end of the exec's
stream followed by one `exec_inspect` (the engine records the exit code before it closes
the stream), or the engine's `exec_die` event (which it sends only once the stream is
closed, and which also ends a process that closed its output early). A process whose
output ended but which still runs is looked at again with a growing delay.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import docker.errors

from ...backend import EXIT_DRAIN_GRACE_S, Process, settle
from ...errors import (
    ConnectionLostError,
    ProcessExitedError,
    ProviderError,
    UnsupportedOperationError,
)
from ..toolkit import (
    KILL_TICK_S,
    grace_ticks,
    interrupt_script,
    kill_script,
    new_tag,
    parse_kill_report,
    tag_environment,
    wrapper_argv,
)
from .engine import Engine
from .errors import is_not_found
from .frames import FrameDecoder, PayloadCallback
from .stream import RawStream, StreamClosedError

logger = logging.getLogger("sandbox.docker")

# How long an exit reported by event waits for the end of the stream, so that output
# still in flight inside the engine is not cut off (the engine itself waits at most ~2 s
# for a stream held open by a background child).
EXIT_WAITS_FOR_EOF_S = 0.25
ENGINE_GAVE_UP_CODES = frozenset({126, 127})
KILL_SCRIPT_TIMEOUT_S = 30.0
# Bounds of the delay between two looks at a process whose output ended before its exit.
INSPECT_FIRST_DELAY_S = 0.05
INSPECT_MAX_DELAY_S = 2.0
INSPECT_MAX_DELAY_WITH_EVENTS_S = 10.0
# A SIGKILL exit (137) under a memory limit waits this long at most for the container's
# `oom` event (it precedes the `exec_die` event, which ends the wait too) so the exit
# can say whether the limit killed it; the exit's stream may end before either arrives.
OOM_EVENT_WAIT_S = 0.5
SIGKILL_EXIT = 137

OutputCallback = PayloadCallback  # (stream, data), as the frame decoder gives them


class ExecOptions:
    """Where and as whom execs run: fixed per session."""

    def __init__(
        self,
        *,
        container_id: str,
        user: str,
        env: Mapping[str, str],
        workdir: str,
        detach_keys: str,
        memory_limited: bool = False,
    ) -> None:
        self.container_id = container_id
        self.user = user
        self.env = dict(env)
        self.workdir = workdir
        self.detach_keys = detach_keys
        self.memory_limited = memory_limited  # the session set the container's memory


# After killing a tree whose background child held the output open: how long the
# engine may take to deliver the rest and close the stream.
EOF_AFTER_KILL_S = 3.0
# What runc prints, as the exec's output with exit 126, for an exec in a stopped container.
RUNTIME_STOPPED = b"cannot exec in a stopped state"
# What the engine prints, as the exec's output with exit 126, when runc could not start
# the exec's process at all (e.g. a container at its pids limit: runc's own init
# cannot fork). No process of ours exists then.
RUNTIME_FAILED = b"OCI runtime exec failed"
HEAD_BYTES = 256
# What a shell prints when fork() fails (EAGAIN: the container's pids limit), and what
# the runtime's Go code prints when it cannot make a thread there (it then dumps its
# registers and exits 2): either way the container is full.
FORK_FAILED = "can't fork"
FORK_FAILURES = (
    FORK_FAILED,
    "pthread_create failed",
    "failed to create new OS thread",
    "Resource temporarily unavailable",
)


class DockerExec(Process):
    """One exec: start it, stream it, learn its end, write to it, kill its tree.

    Callbacks run on the event loop: `on_output(stream, data)` (1 stdout, 2 stderr, 3
    engine error), `on_eof()`, `on_exit(code)`, `on_lost(reason)`. At most one of
    `on_exit`/`on_lost` is called.

    The handle of a session's process (`entry.handle`) is a `Process`, whose methods the
    base session's hooks call: `process_id` names it in the errors of a write, and
    `grace_s` is what a `kill` gives its tree between SIGTERM and SIGKILL. The session's
    own execs (the probe, the kill script, the lease) use the same class, unnamed.
    """

    def __init__(
        self,
        engine: Engine,
        options: ExecOptions,
        argv: Sequence[str],
        *,
        tty: bool,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        rows: int = 24,
        cols: int = 80,
        stdin: bool = False,
        on_output: OutputCallback | None = None,
        on_eof: Callable[[], None] | None = None,
        on_exit: Callable[[int], None] | None = None,
        on_lost: Callable[[str], None] | None = None,
        wrap: bool = True,
        killer: KillBatcher | None = None,
        process_id: int = 0,
        grace_s: float = 0.0,
    ) -> None:
        self._engine = engine
        self.process_id = process_id
        self.grace_s = grace_s
        self._options = options
        self._killer = killer or KillBatcher(engine, options)
        self.tty = tty
        # A process on pipes with its stdin attached: writes go to it, and
        # `close_stdin` half-closes the socket (the engine then closes the stdin).
        self.stdin = stdin and not tty
        self.tag = new_tag()
        environment = dict(options.env)
        if env:
            environment.update(env)
        if wrap:
            environment.update(tag_environment(self.tag))
            size: dict[str, int | None] = {"rows": rows, "cols": cols} if tty else {}
            self._argv = wrapper_argv(self.tag, argv, set_tag=False, **size)
        else:
            self._argv = list(argv)
        self._environment = environment
        self._workdir = cwd or options.workdir or None
        self._on_output = on_output
        self._on_eof = on_eof
        self._on_exit = on_exit
        self._on_lost = on_lost
        self._decoder = None if tty else FrameDecoder(self._output)
        self.exec_id: str | None = None
        self.exit_code: int | None = None
        self.lost_reason: str | None = None
        self.eof = False
        self._stream: RawStream | None = None
        self._create_future: asyncio.Future[Any] | None = None
        self._start_future: asyncio.Future[Any] | None = None
        # "no": never attempted; "failed": the engine refused it (no process exists);
        # "unknown": sent, outcome not known (a process may exist); "yes": attached.
        self._start_state = "no"
        self._ended = asyncio.Event()  # exit or loss known
        self._eof_event = asyncio.Event()
        self._pending_exit: int | None = None
        self._exit_timer: asyncio.TimerHandle | None = None
        self._inspector: asyncio.Task[None] | None = None
        self._closed = False
        self._head = bytearray()  # the first output bytes: where the runtime's refusal shows
        self._oom_mark = engine.oom_kills
        self._oom_hold: asyncio.TimerHandle | None = None  # a 137 waiting for `oom`
        self._held_code = SIGKILL_EXIT

    def __repr__(self) -> str:
        return f"<DockerExec exec_id={(self.exec_id or '')[:12]!r} tty={self.tty}>"

    @property
    def ended(self) -> bool:
        """True once the exit (or the loss) of the process is known."""
        return self._ended.is_set()

    @property
    def runtime_refused(self) -> str | None:
        """The runtime's error when it could not start the process at all (exit 126 and
        its "OCI runtime exec failed" message as the output), else None."""
        if self.exit_code != 126 or RUNTIME_FAILED not in self._head:
            return None
        text = self._head.decode("utf-8", "replace")
        return text[text.index(RUNTIME_FAILED.decode()) :].strip().splitlines()[0]

    @property
    def memory_killed(self) -> bool:
        """True when the process died of SIGKILL after the engine reported an OOM kill
        in the container since it started: the memory limit killed it (or, if several
        processes died at once, one beside it; the engine names no process)."""
        return self.exit_code == SIGKILL_EXIT and self._engine.oom_kills > self._oom_mark

    # ---- start -------------------------------------------------------------------------

    async def start(self) -> None:
        """Create and start the exec, attached. Cancellation is safe at any point: the
        blocking calls finish in the background and `terminate()` undoes them."""
        api = self._engine.api
        self._create_future = self._engine.submit(
            "create an exec",
            api.exec_create,
            self._options.container_id,
            self._argv,
            stdout=True,
            stderr=True,
            stdin=self.tty or self.stdin,
            tty=self.tty,
            user=self._options.user,
            environment=self._environment,
            workdir=self._workdir,
            detach_keys=self._options.detach_keys if self.tty else None,
        )
        self._create_future.add_done_callback(self._created)
        await asyncio.shield(self._create_future)
        if self._closed:
            return
        self._start_state = "unknown"
        self._start_future = self._engine.submit(
            "start an exec", _start_attached, api, self.exec_id, self.tty
        )
        self._start_future.add_done_callback(self._attached)
        await asyncio.shield(self._start_future)

    def _created(self, future: asyncio.Future[Any]) -> None:
        if future.cancelled() or future.exception() is not None:
            return
        self.exec_id = str(future.result()["Id"])
        self._engine.register(self.exec_id, self)

    def _attached(self, future: asyncio.Future[Any]) -> None:
        if future.cancelled():
            return
        error = future.exception()
        if error is not None:
            # An answer from the engine (an HTTP error) means it did not start the exec;
            # a broken connection leaves that open, so the teardown still sweeps.
            if isinstance(error.__cause__, docker.errors.APIError):
                self._start_state = "failed"
            return
        sock, leftover, keep = future.result()
        self._start_state = "yes"
        if self._closed:
            _close_quietly(sock, keep)
            return
        self._stream = RawStream(
            sock, on_data=self._data, on_end=self._stream_ended, leftover=leftover, keep=keep
        )
        self._stream.start()

    # ---- output and exit ---------------------------------------------------------------

    def _data(self, data: bytes) -> None:
        if self._decoder is not None:
            self._decoder.feed(data)
        else:
            self._output(1, data)

    def _output(self, stream: int, data: bytes) -> None:
        if len(self._head) < HEAD_BYTES:
            self._head.extend(data[: HEAD_BYTES - len(self._head)])
        if self._on_output is not None:
            self._on_output(stream, data)

    def _stream_ended(self, error: BaseException | None) -> None:
        if error is not None:
            logger.debug("exec %s stream ended: %s", self.exec_id, type(error).__name__)
        self.eof = True
        self._eof_event.set()
        if self._on_eof is not None:
            self._on_eof()
        if self._pending_exit is not None:
            self._report_exit(self._pending_exit)
        elif not self.ended and not self._closed:
            self._inspect_soon()

    def exec_died(self, exit_code: int | None) -> None:
        """The engine's `exec_die` event for this exec."""
        if self._oom_hold is not None:
            self._finish_exit(self._held_code)  # any `oom` event came before this one
        if self.ended or self._closed:
            return
        if exit_code is None:
            self._inspect_soon()
            return
        if self.eof:
            self._report_exit(exit_code)
            return
        # Output may still be in flight inside the engine: read what arrived, then give
        # the end of the stream a moment before reporting the exit.
        if self._stream is not None:
            self._stream.drain_now()
        if self.eof or self.ended:
            self._report_exit(exit_code)
            return
        self._pending_exit = exit_code
        loop = asyncio.get_running_loop()
        self._exit_timer = loop.call_later(EXIT_WAITS_FOR_EOF_S, self._report_exit, exit_code)

    def container_oom(self) -> None:
        """The engine's `oom` event for the container: a held 137 exit is reported."""
        if self._oom_hold is not None:
            self._finish_exit(self._held_code)

    def container_gone(self, reason: str) -> None:
        """The container stopped or was removed under the process."""
        if self._oom_hold is not None:
            self._finish_exit(self._held_code)
        if self._pending_exit is not None:
            self._report_exit(self._pending_exit)
        else:
            self._report_lost(reason)

    def _report_exit(self, code: int) -> None:
        if self._exit_timer is not None:
            self._exit_timer.cancel()
            self._exit_timer = None
        self._pending_exit = None
        if self.ended or self._oom_hold is not None:
            return
        if (
            code == SIGKILL_EXIT
            and self._options.memory_limited
            and self._engine.oom_kills == self._oom_mark
            and self._engine.events_alive
        ):
            self._held_code = code
            loop = asyncio.get_running_loop()
            self._oom_hold = loop.call_later(OOM_EVENT_WAIT_S, self._finish_exit, code)
            return
        self._finish_exit(code)

    def _finish_exit(self, code: int) -> None:
        if self._oom_hold is not None:
            self._oom_hold.cancel()
            self._oom_hold = None
        if self.ended:
            return
        self.exit_code = code
        self._ended.set()
        if self._on_exit is not None:
            self._on_exit(code)

    def _report_lost(self, reason: str) -> None:
        if self.ended:
            return
        self.lost_reason = reason
        self._ended.set()
        if self._on_lost is not None:
            self._on_lost(reason)

    def _inspect_soon(self) -> None:
        if self._inspector is None or self._inspector.done():
            self._inspector = asyncio.get_running_loop().create_task(self._inspect_until_ended())

    async def _inspect_until_ended(self) -> None:
        delay = 0.0
        while not self.ended and not self._closed:
            if self.exec_id is None:
                return
            try:
                info = await self._engine.call(
                    "inspect an exec", self._engine.api.exec_inspect, self.exec_id
                )
            except ProviderError as exc:
                if is_not_found(exc):
                    self._report_lost(self._engine.gone_reason or "the container is gone")
                elif exc.retryable:
                    self._report_lost("lost the connection to the Docker engine")
                else:
                    self._report_lost(f"the Docker engine failed: {exc}")
                return
            code = info.get("ExitCode")
            if not info.get("Running") and code is not None:
                self._report_exit(int(code))
                return
            if not info.get("Running") and not info.get("Pid") and self._start_state != "yes":
                self._report_lost("the process never started")
                return
            if self._engine.gone_reason is not None:
                self._report_lost(self._engine.gone_reason)
                return
            # Still running with its output closed (or the engine has not processed the
            # exit yet): look again later; the exec_die event usually comes first.
            events = self._engine.events_alive
            cap = INSPECT_MAX_DELAY_WITH_EVENTS_S if events else INSPECT_MAX_DELAY_S
            delay = min(cap, max(INSPECT_FIRST_DELAY_S, delay * 2))
            await asyncio.sleep(delay)

    async def wait_ended(self) -> None:
        """Wait until the exit (or loss) is known."""
        await self._ended.wait()

    async def wait_eof(self) -> None:
        """Wait until the output stream ended."""
        await self._eof_event.wait()

    def drain_now(self) -> None:
        """Read output that already arrived at the socket."""
        if self._stream is not None:
            self._stream.drain_now()

    async def drain(self) -> None:
        """At a window's deadline: read what already arrived at the socket, then let
        pending callbacks run once."""
        self.drain_now()
        await asyncio.sleep(0)

    # ---- input and control -------------------------------------------------------------

    async def write(self, data: bytes) -> None:
        """Write to the process's terminal (or its attached stdin) over the socket. A
        closed socket is the process's end (`ProcessExitedError`) when its exit or the
        end of its output is known, else a lost connection (`ConnectionLostError`)."""
        if self._stream is None:
            raise ProviderError("the process is not attached", retryable=False)
        try:
            await self._stream.write(data)
        except StreamClosedError as exc:
            if self.ended or self.eof:
                raise ProcessExitedError(
                    f"process {self.process_id} has exited; poll it with empty chars to "
                    "collect its remaining output and exit code"
                ) from None
            raise ConnectionLostError(
                f"lost the connection to process {self.process_id}: {exc}"
            ) from None

    async def close_stdin(self) -> None:
        """End the attached stdin of a process on pipes: half-close the socket. The
        engine reads the end of the hijacked stream after every byte sent before it and
        closes the process's stdin; the output keeps flowing back. Idempotent (a TLS
        connection cannot half-close: `processes.check_half_close` refuses it at start)."""
        if self._stream is None:
            raise ProviderError("the process is not attached", retryable=False)
        self._stream.shutdown_write()

    async def resize(self, rows: int, cols: int) -> None:
        """Resize the terminal (`exec_resize`; the initial size was set by the wrapper
        with stty). A process that is still starting gets a few more tries; one that
        already ended is left alone."""
        delay = 0.02
        for attempt in range(6):
            try:
                await self._engine.call(
                    "resize a terminal",
                    self._engine.api.exec_resize,
                    self.exec_id,
                    height=rows,
                    width=cols,
                )
                return
            except ProviderError:
                if self.ended or self.eof:
                    return
                if attempt == 5:
                    raise
            await asyncio.sleep(delay)
            delay *= 2

    async def interrupt(self) -> None:
        """SIGINT to the wrapper's process group (Ctrl-C for a process without a tty)."""
        await self._killer.run(self.tag, "int", 0)

    # ---- teardown ----------------------------------------------------------------------

    def _needs_kill(self) -> bool:
        if self._start_state in ("no", "failed"):
            return False
        if self._engine.gone_reason is not None:
            return False  # nothing can run in a stopped or removed container
        if self.lost_reason is not None and self._start_state == "yes":
            return True  # try: the engine may be back; failures are tolerated then
        if self.runtime_refused is not None:
            return False  # runc started nothing
        if self.exit_code in ENGINE_GAVE_UP_CODES:
            # The engine ends an exec it could not keep attached (the detach keys were
            # typed, an attach error) with 126 or 127 while its process may still run.
            # (A command that was not found exits 127 too: a needless sweep, no harm.)
            return True
        return not (self.ended and self.eof)

    async def terminate(self, grace_s: float) -> None:
        """Kill the process's whole tree (unless it already ended and its output closed),
        then release the socket. Idempotent; copes with a start cancelled half-way."""
        try:
            for future in (self._create_future, self._start_future):
                if future is not None and not future.done():
                    await asyncio.wait([future])
            if self._needs_kill():
                try:
                    await self.kill_tree(grace_s)
                except ProviderError as exc:
                    if self.lost_reason is None:
                        raise
                    logger.warning("could not kill a lost process (%s): %s", self.lost_reason, exc)
        finally:
            await self.aclose()

    async def kill(self, *, sandbox_stopping: bool = False) -> None:
        """`terminate` with the handle's grace, even when the sandbox stops right after:
        a container the session attached to (or keeps) outlives the close, and so would
        the tree."""
        await self.terminate(self.grace_s)

    async def kill_tree(self, grace_s: float) -> None:
        """Signal the whole tree now (see the module docstring); wait for the exit."""
        ticks = grace_ticks(grace_s)
        for attempt in range(3):
            await self._killer.run(self.tag, "term", ticks if attempt == 0 else 0)
            if self.ended or self.exec_id is None:
                return
            if self._stream is None or self._stream.ended:
                self._inspect_soon()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(1.0 + attempt):
                    await self._ended.wait()
                    return
        raise ProviderError(
            "could not stop a process in the container: it is still running after SIGKILL",
            retryable=True,
        )

    async def aclose(self) -> None:
        """Release the socket, the event route and the helper task. Idempotent."""
        if self._closed:
            return
        self._closed = True
        for timer in (self._exit_timer, self._oom_hold):
            if timer is not None:
                timer.cancel()
        self._exit_timer = self._oom_hold = None
        if self._stream is not None:
            self._stream.close()
        if self.exec_id is not None:
            self._engine.unregister(self.exec_id)
        inspector = self._inspector
        if inspector is not None and not inspector.done():
            inspector.cancel()
            with contextlib.suppress(BaseException):
                await inspector


class KillBatcher:
    """Merges the kill requests made at about the same moment (a terminate-all, a
    session close) into one kill-script exec per kind of request, so tearing down 64
    processes costs a few execs, not 64. Each batch is a task owned here; a requester
    that is cancelled does not cancel the batch it joined."""

    def __init__(self, engine: Engine, options: ExecOptions) -> None:
        self._engine = engine
        self._options = options
        self._forming: dict[tuple[str, int], tuple[list[str], asyncio.Task[str]]] = {}
        self._running: set[asyncio.Task[str]] = set()

    async def run(self, tag: str, mode: str, ticks: int) -> None:
        """Signal the tree tagged `tag` (mode `int` or `term`, see `run_kill_script`),
        with whoever else asks now."""
        key = (mode, ticks)
        forming = self._forming.get(key)
        if forming is None:
            tags: list[str] = []
            task = asyncio.get_running_loop().create_task(self._flush(key, tags))
            self._running.add(task)
            task.add_done_callback(self._running.discard)
            task.add_done_callback(_mark_retrieved)
            forming = (tags, task)
            self._forming[key] = forming
        forming[0].append(tag)
        await asyncio.shield(forming[1])

    async def _flush(self, key: tuple[str, int], tags: list[str]) -> str:
        # Let the teardowns started in the same moment join this batch.
        for _ in range(2):
            await asyncio.sleep(0)
        if self._forming.get(key, (None,))[0] is tags:
            del self._forming[key]
        mode, ticks = key
        return await run_kill_script(self._engine, self._options, tags, mode, ticks)

    async def settle(self) -> None:
        """Wait for every batch started so far (used before the engine closes)."""
        if self._running:
            await asyncio.wait(list(self._running))


def _mark_retrieved(task: asyncio.Task[str]) -> None:
    if not task.cancelled():
        task.exception()


async def run_kill_script(
    engine: Engine, options: ExecOptions, tags: Sequence[str], mode: str, ticks: int
) -> str:
    """Run the toolkit's interrupt (`mode` "int") or kill script ("term", with `ticks`
    rescans of grace) in the container as the session's user; returns its report."""
    output = bytearray()
    argv = interrupt_script(tags) if mode == "int" else kill_script(tags, ticks=ticks)
    killer = DockerExec(
        engine,
        options,
        argv,
        tty=False,
        wrap=False,
        on_output=lambda stream, data: output.extend(data),
    )
    try:
        async with asyncio.timeout(ticks * KILL_TICK_S + KILL_SCRIPT_TIMEOUT_S):
            await killer.start()
            await killer.wait_eof()
            await killer.wait_ended()
    except TimeoutError:
        raise ProviderError(
            "could not signal a process in the container: the Docker engine did not finish "
            "the kill in time",
            retryable=True,
        ) from None
    finally:
        await killer.aclose()
    text = output.decode("utf-8", "replace").strip()
    report = parse_kill_report(text)
    if report is None and (engine.gone_reason is not None or RUNTIME_STOPPED.decode() in text):
        # The container stopped (the runtime refuses the exec): nothing in it is left
        # to signal, which is what the kill was for.
        return "gone"
    full = next((said for said in FORK_FAILURES if said in text), None)
    refused = killer.runtime_refused or full
    if refused is not None:
        # Said apart from a missing program: here the container is full, not the image.
        raise ProviderError(
            f"could not signal a process in the container: the kill could not start "
            f"({refused[:200]}); a container at its process_limit cannot start one",
            retryable=True,
        )
    if killer.exit_code != 0 or report is None:
        raise ProviderError(
            f"could not signal a process in the container (exit {killer.exit_code}): "
            f"{text[-300:] or 'no output'}; the image needs sh, grep and kill",
            retryable=False,
        )
    return report


def _start_attached(
    api: Any, exec_id: str, tty: bool
) -> tuple[socket.socket, bytes, tuple[Any, ...]]:
    """(In a worker thread) start the exec attached; return its socket, the bytes the
    HTTP client already read past the response headers, and what to keep alive."""
    raw = api.exec_start(exec_id, tty=tty, socket=True)
    response = getattr(raw, "_response", None)
    sock = getattr(raw, "_sock", raw) if isinstance(raw, socket.SocketIO) else raw
    keep: tuple[Any, ...] = (raw, response) if response is not None else (raw,)
    if not isinstance(sock, socket.socket):
        _close_quietly(None, keep)
        raise UnsupportedOperationError(
            "the docker backend streams processes over a unix, tcp or tls connection to "
            "the engine; this DOCKER_HOST transport (ssh or a named pipe) is not supported"
        )
    leftover = b""
    buffered = getattr(getattr(getattr(response, "raw", None), "_fp", None), "fp", None)
    sock.setblocking(False)
    if buffered is not None and hasattr(buffered, "peek"):
        with contextlib.suppress(OSError, ValueError):
            # Non-blocking: returns what the HTTP parser buffered, or b"".
            leftover = bytes(buffered.peek())
    return sock, leftover, keep


def _close_quietly(sock: socket.socket | None, keep: tuple[Any, ...]) -> None:
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.close()
    for obj in keep:
        with contextlib.suppress(Exception):
            obj.close()


class DockerOneShot:
    """A one-shot exec (`OneShotProcess`): its exit, then what the engine still had."""

    def __init__(
        self,
        proc: DockerExec,
        engine: Engine,
        first_output: bytearray,
        on_memory_kill: Callable[[], None] | None = None,
    ) -> None:
        self._proc = proc
        self._engine = engine
        self._first_output = first_output  # where the runtime's own refusal would show
        self._on_memory_kill = on_memory_kill  # adds the note that the limit killed it

    async def wait(self) -> int:
        proc = self._proc
        await proc.wait_ended()
        if not proc.eof and proc.lost_reason is None:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(EXIT_DRAIN_GRACE_S):
                    await proc.wait_eof()
        if not proc.eof and proc.lost_reason is None:
            # A background child holds the output open: kill the rest of the tree, then
            # collect what the engine still had.
            await settle(proc.kill_tree(0))
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(EOF_AFTER_KILL_S):
                    await proc.wait_eof()
        proc.drain_now()
        if proc.lost_reason is not None:
            raise ConnectionLostError(
                f"the command did not finish: {proc.lost_reason}",
                retryable=self._engine.gone_reason is None,
            )
        assert proc.exit_code is not None
        if proc.exit_code == 126 and RUNTIME_STOPPED in self._first_output:
            # The runtime refused to start the exec (the container stopped before the
            # engine's event said so) and printed its error as the output.
            raise ProviderError(
                "the container is not running (it stopped); start a new session",
                retryable=False,
            )
        refused = proc.runtime_refused
        if refused is not None:
            raise ProviderError(
                f"the container runtime could not start the command ({refused[:200]}); a "
                "container at its process_limit cannot start one",
                retryable=True,
            )
        if proc.memory_killed and self._on_memory_kill is not None:
            self._on_memory_kill()
        return proc.exit_code

    async def kill(self) -> None:
        await self._proc.terminate(0)

    async def release(self) -> None:
        await self._proc.terminate(0)
