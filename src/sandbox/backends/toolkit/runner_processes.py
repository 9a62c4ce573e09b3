"""Processes through the runner (docs/runner.md): one handle any backend can give its
entries once it has a `RunnerClient` to the runner inside its sandbox.

The runner does what a backend otherwise builds from provider calls and shell scripts:
it spawns with the exact environment, reports a missing `cwd` or program itself (no
command check wrapper), keeps stdin open or closes it, kills a whole tree (escapees
included, without a /proc scan), and keeps every process's latest output in a ring, so
a process outlives its client and a later client reattaches to it from an offset.

`RunnerProcess` is the entry's handle: the hooks of a backend that uses the runner
forward to its methods (`write`, `close_stdin`, `resize`, `interrupt`, `terminate`,
`release`). `RunnerOneShot` is a one-shot command's `OneShotProcess`. `spawn`,
`reattach` and `start_one_shot` make them. `RunnerDurability` is the `Durability` part
every backend with the runner shares: a kept process in a ref, its reattach, its release.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import signal
from abc import abstractmethod
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from ...durable.refs import ProcessNotReattached
from ...errors import ConnectionLostError, ProcessExitedError, UnsupportedOperationError
from ...output.decoding import omission_marker
from ...process_handle import Process
from ...runner import (
    RunnerClient,
    RunnerConnectionLost,
    RunnerError,
    RunnerRequestError,
    SignalScope,
    Stream,
)
from ...session.capabilities import Durability
from .check import start_error

if TYPE_CHECKING:  # the core imports the toolkit: names for annotations only
    from ...durable.refs import ProcessRef
    from ...exec_output import ExecCapture
    from ...process_entry import CommandSpec, OutputSink

# The largest ring the runner keeps per stream (docs/runner.md); a session's output
# limit above it is clipped for the ring only.
MAX_RING_BYTES = 64 * 1024 * 1024
# After SIGKILL to a tree, how long the runner's EXIT may take (it reaps, then waits
# for the output to end) before the teardown stops waiting and forgets the process.
KILL_WAIT_S = 5.0
# Attempts at a fresh process id when the runner already keeps one by that id (another
# client's process: ids are random, so a second collision is as good as impossible).
ID_ATTEMPTS = 3
# A one-shot command is followed from its start, so its ring only serves a connection
# that fell behind (the runner then sends a GAP and what the ring holds).
ONE_SHOT_RING_BYTES = 1024 * 1024


def process_environment(
    base: Mapping[str, str], extra: Mapping[str, str] | None, *, tty: bool, term: str
) -> dict[str, str]:
    """The whole environment of one process through the runner (it spawns with exactly
    the environment it is given): the sandbox's `base`, the command's `extra`, and TERM
    for a terminal when neither set it."""
    env = {**base, **(extra or {})}
    if tty:
        env.setdefault("TERM", term)
    return env


def new_process_id() -> int:
    """A random runner process id (u32, never 0): unique among the runner's processes
    whoever made them, without asking."""
    return secrets.randbits(31) + 1


class _EntrySink:
    """What the runner tells about one process, told to its entry (`ProcessSink`)."""

    def __init__(
        self,
        entry: OutputSink[RunnerProcess],
        on_exit: Callable[[int], None],
        shown: Callable[[bytes], bytes] | None = None,
    ) -> None:
        self._entry = entry
        self._on_exit = on_exit
        self._shown = shown

    def feed(self, data: bytes, stream: Stream) -> None:
        """Output (stdout and stderr, merged in arrival order like every backend's)."""
        if self._shown is not None:
            data = self._shown(data)
        if data:
            self._entry.feed(data)

    def gap(self, start: int, end: int, stream: Stream) -> None:
        """The ring no longer held [start, end): the omission marker in its place."""
        self._entry.feed(omission_marker(end - start).encode())

    def exited(self, code: int) -> None:
        """The runner sends EXIT after the output ended: both at once."""
        self._on_exit(code)
        self._entry.report_eof()
        self._entry.report_exit(code)

    def lost(self, reason: str) -> None:
        """The connection to the runner ended (the process may well live on)."""
        self._on_exit(-1)
        self._entry.report_lost(reason)


class RunnerProcess(Process):
    """The handle of one process the runner keeps for an entry (`entry.handle`): a
    `Process`, so the base session's hooks write, resize, interrupt and end its input
    through it. `process_id` names it in errors; `grace_s` is the time a `kill` gives
    the tree between SIGTERM and SIGKILL."""

    def __init__(
        self,
        client: RunnerClient,
        runner_id: int,
        *,
        tty: bool,
        process_id: int = 0,
        grace_s: float = 0.0,
        on_written: Callable[[int], None] | None = None,
    ) -> None:
        self.client = client
        self.runner_id = runner_id
        self.tty = tty
        self.process_id = process_id
        self.grace_s = grace_s
        # The sink's `count_input`: a write is one frame, counted once the runner wrote it.
        self._on_written = on_written
        self.pid: int | None = None
        self._ended = asyncio.Event()

    def __repr__(self) -> str:
        return f"RunnerProcess(id={self.runner_id}, pid={self.pid})"

    @property
    def ended(self) -> bool:
        """True once the runner reported its exit (or the link to it was lost)."""
        return self._ended.is_set()

    def _exit_seen(self, code: int) -> None:
        self._ended.set()

    async def write(self, data: bytes) -> None:
        """Write to its stdin or terminal; returns once the runner wrote every byte."""
        process_id = self.process_id
        try:
            await self.client.write(self.runner_id, data)
            if self._on_written is not None:
                self._on_written(len(data))
        except RunnerConnectionLost as exc:
            raise ConnectionLostError(
                f"lost the connection to process {process_id}: {exc}"
            ) from None
        except RunnerRequestError as exc:
            if self.ended or exc.kind in ("not_found", "invalid", "io"):
                raise ProcessExitedError(
                    f"process {process_id} has exited (or closed its input); poll it with "
                    "empty chars to collect its remaining output and exit code"
                ) from None
            raise

    async def close_stdin(self) -> None:
        """EOF on its stdin pipe, after every byte written before."""
        await self.client.close_stdin(self.runner_id)

    async def resize(self, rows: int, cols: int) -> None:
        """Set its terminal's size."""
        await self.client.resize(self.runner_id, rows, cols)

    async def interrupt(self) -> None:
        """SIGINT to its process group (a tty gets ^C as input from the caller)."""
        await self.client.signal(self.runner_id, signal.SIGINT, SignalScope.GROUP)

    async def terminate(self, grace_s: float) -> None:
        """End the whole tree: SIGTERM, `grace_s` for it to exit, SIGKILL; then forget
        the runner's record and stop routing its output. Idempotent; a lost link ends
        nothing more (the runner's orphan policy ends what it keeps)."""
        client = self.client
        if client.closed:
            return
        try:
            if not self.ended:
                if grace_s > 0:
                    await client.signal(self.runner_id, signal.SIGTERM, SignalScope.TREE)
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(grace_s):
                            await self._ended.wait()
                if not self.ended:
                    await client.signal(self.runner_id, signal.SIGKILL, SignalScope.TREE)
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(KILL_WAIT_S):
                            await self._ended.wait()
            with contextlib.suppress(RunnerRequestError):
                await client.forget(self.runner_id)
        except RunnerConnectionLost:
            return
        except RunnerRequestError as exc:
            if exc.kind != "not_found":  # forgotten already, or never made
                raise
        finally:
            await self._stop_routing()

    async def kill(self, *, sandbox_stopping: bool = False) -> None:
        """`terminate` with the handle's grace."""
        await self.terminate(self.grace_s)

    async def release(self) -> None:
        """Stop following it without ending it (detach): the runner keeps it and its
        ring for the next client."""
        await self._stop_routing()

    async def _stop_routing(self) -> None:
        client = self.client
        if self.runner_id in client.attached and not client.closed:
            with contextlib.suppress(RunnerError):
                await client.detach(self.runner_id)


def _start_error(exc: RunnerRequestError, spec: CommandSpec) -> Exception:
    """The session's error for a spawn the runner refused, in the words of every
    backend (`toolkit.check.start_error`)."""
    detail = exc.detail.lower()
    if exc.kind == "workdir":
        kind = (
            "notdir"
            if "not a directory" in detail
            else "noaccess"
            if "permission" in detail
            else "nocwd"
        )
        return start_error(kind, spec.cwd or "", "")
    if exc.kind == "command_not_found":
        kind = "noexec" if "permission" in detail or "exec format" in detail else "noprog"
        return start_error(kind, "", spec.argv[0] if spec.argv else "")
    if exc.kind == "unsupported":
        return UnsupportedOperationError(str(exc))
    return exc


async def spawn(
    client: RunnerClient,
    entry: OutputSink[RunnerProcess],
    *,
    env: Mapping[str, str],
    cwd: str | None,
    argv: Sequence[str] | None = None,
    shown: Callable[[bytes], bytes] | None = None,
    grace_s: float = 0.0,
) -> None:
    """Start `entry.spec` through the runner with exactly `env` in `cwd`, its output (and
    stderr merged into it, as on every backend) into the entry. The handle is set before
    the first await, so a teardown of a cancelled spawn finds it. `argv`: what to run
    instead of the spec's own (its command wrapped, as in a jail); `shown`: what of each
    chunk of output the entry gets (a `ShellTrap`'s `feed` takes its markers out);
    `grace_s`: the handle's (`RunnerProcess`)."""
    spec = entry.spec
    for attempt in range(ID_ATTEMPTS):
        handle = RunnerProcess(
            client,
            new_process_id(),
            tty=spec.tty,
            process_id=entry.process_id,
            grace_s=grace_s,
            on_written=entry.count_input,
        )
        entry.handle = handle
        sink = _EntrySink(entry, handle._exit_seen, shown)
        try:
            handle.pid = await client.spawn(
                handle.runner_id,
                spec.command.argv if argv is None else argv,
                env=dict(env),
                sink=sink,
                cwd=cwd,
                tty=spec.tty,
                rows=spec.rows,
                cols=spec.cols,
                stdin_open=spec.stdin or spec.tty,  # a terminal always takes input
                merge_stderr=True,
                ring_bytes=min(entry.output_limit, MAX_RING_BYTES),
                # The session reads all the time: a lag is the loop's, never lose to it.
                backpressure=True,
            )
            return
        except RunnerRequestError as exc:
            if exc.kind == "exists" and attempt + 1 < ID_ATTEMPTS:
                continue
            raise _start_error(exc, spec.command) from None


REF_KEY = "runner_id"
# Runner process ids a client makes (`new_process_id`): what a ref may name.
MAX_RUNNER_ID = 2**31


def ref_process(handle: object) -> dict[str, Any] | None:
    """The ref's handle of a process the runner keeps, None for another handle."""
    return {REF_KEY: handle.runner_id} if isinstance(handle, RunnerProcess) else None


def runner_id_in(handle: Mapping[str, Any]) -> int | None:
    """The runner id a ref's process handle names, None when it names none or one no
    client of ours could have made (a ref is caller data: checked, never trusted)."""
    value = handle.get(REF_KEY)
    if isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= MAX_RUNNER_ID:
        return value
    return None


async def reattach_ref(
    client: RunnerClient,
    entry: OutputSink[RunnerProcess],
    process: ProcessRef,
    *,
    grace_s: float = 0.0,
) -> None:
    """`Durability.reattach` through the runner: follow the ref's process again from
    the client's output position, or `ProcessNotReattached` saying why not."""
    runner_id = runner_id_in(process.handle)
    if runner_id is None:
        raise ProcessNotReattached("the ref names no process the runner keeps")
    try:
        await reattach(client, entry, runner_id, process.output_position, grace_s=grace_s)
    except RunnerRequestError as exc:
        raise ProcessNotReattached(f"the runner no longer keeps the process ({exc.kind})") from None


class RunnerDurability(Durability):
    """The durability of a backend whose sessions may run their processes through the
    runner, in what does not depend on the backend: a process the runner keeps is named
    in a ref by its runner id (`ref_process`), followed again through the runner
    (`reattach_ref`) and left to it by a release; any other process is the backend's
    own, named as `ref_direct_process` says, never reattached (`not_reattached` says
    why) and terminated by a release (`Durability.release`). A subclass says how to
    reach the session's runner (`runner_client`)."""

    # Why a process the runner does not keep cannot be reattached (the note of the
    # `ProcessNotReattached` a resume reports for it).
    not_reattached: ClassVar[str]

    @abstractmethod
    def runner_client(self) -> RunnerClient | None:
        """The link to the session's runner; None for a session without the runner."""

    @abstractmethod
    def kill_grace_s(self) -> float:
        """How long a kill of a reattached process waits between SIGTERM and SIGKILL: the
        session's `terminate_grace_s`."""

    @abstractmethod
    def ref_direct_process(self, handle: Any) -> dict[str, Any]:
        """The ref's handle of a process the runner does not keep (`handle`: the entry's
        handle), JSON, no secret."""

    def ref_process(self, entry: OutputSink[Any]) -> dict[str, Any]:
        """The runner's id of a process it keeps, else `ref_direct_process`."""
        handle = entry.require_handle()
        kept = ref_process(handle)
        if kept is not None:
            return kept
        return self.ref_direct_process(handle)

    async def reattach(self, entry: OutputSink[Any], process: ProcessRef) -> None:
        """Through the runner: follow its process again from the ref's output position.
        Never possible for a session without the runner (`not_reattached`)."""
        client = self.runner_client()
        if client is None:
            raise ProcessNotReattached(self.not_reattached)
        await reattach_ref(client, entry, process, grace_s=self.kill_grace_s())

    async def release(self, entry: OutputSink[Any]) -> None:
        """A process the runner keeps is left to it (only followed no more); any other is
        terminated."""
        handle = entry.handle
        if isinstance(handle, RunnerProcess):
            await handle.release()
        else:
            await super().release(entry)


async def reattach(
    client: RunnerClient,
    entry: OutputSink[RunnerProcess],
    runner_id: int,
    offset: int,
    *,
    grace_s: float = 0.0,
) -> None:
    """Follow the runner's process `runner_id` again as `entry`, from the output offset
    `offset` (what it printed meanwhile first, the omission marker where the ring kept
    less), then live, then its exit."""
    handle = RunnerProcess(
        client,
        runner_id,
        tty=entry.spec.tty,
        process_id=entry.process_id,
        grace_s=grace_s,
        on_written=entry.count_input,
    )
    entry.handle = handle
    await client.attach(runner_id, _EntrySink(entry, handle._exit_seen), stdout_offset=offset)


class _CaptureSink:
    """A one-shot command's output into its bounded capture (`ProcessSink`)."""

    def __init__(self, capture: ExecCapture) -> None:
        self._capture = capture
        self.code: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    def feed(self, data: bytes, stream: Stream) -> None:
        """stdout and stderr kept apart."""
        if stream == Stream.STDERR:
            self._capture.add_stderr(data)
        else:
            self._capture.add_stdout(data)

    def gap(self, start: int, end: int, stream: Stream) -> None:
        """Never for a command followed from its start (the capture bounds itself)."""

    def exited(self, code: int) -> None:
        """Its exit, after all of its output."""
        if not self.code.done():
            self.code.set_result(code)

    def lost(self, reason: str) -> None:
        """The link to the runner ended before the command did."""
        if not self.code.done():
            self.code.set_exception(ConnectionLostError(f"lost the command: {reason}"))


class RunnerOneShot:
    """A one-shot command kept by the runner (`OneShotProcess`)."""

    def __init__(self, process: RunnerProcess, sink: _CaptureSink) -> None:
        self._process = process
        self._sink = sink
        sink.code.add_done_callback(lambda _: process._exit_seen(0))

    async def wait(self) -> int:
        """Its exit status, once its output is in the capture."""
        return await asyncio.shield(self._sink.code)

    async def kill(self) -> None:
        """SIGKILL to its tree at once (a one-shot has no grace), then forget it."""
        await self._process.terminate(0)

    async def release(self) -> None:
        """Forget the ended command's record in the runner."""
        await self._process.terminate(0)


async def start_one_shot(
    client: RunnerClient,
    spec: CommandSpec,
    capture: ExecCapture,
    *,
    env: Mapping[str, str],
    cwd: str | None,
) -> RunnerOneShot:
    """Start a one-shot command through the runner, stdout and stderr apart, stdin
    closed. If this is cancelled after the runner started it, it is killed here."""
    sink = _CaptureSink(capture)
    for attempt in range(ID_ATTEMPTS):
        process = RunnerProcess(client, new_process_id(), tty=False)
        try:
            process.pid = await client.spawn(
                process.runner_id,
                spec.argv,
                env=dict(env),
                sink=sink,
                cwd=cwd,
                ring_bytes=ONE_SHOT_RING_BYTES,
                backpressure=True,  # the capture keeps the exact head: lose nothing
            )
        except RunnerRequestError as exc:
            if exc.kind == "exists" and attempt + 1 < ID_ATTEMPTS:
                continue
            raise _start_error(exc, spec) from None
        except BaseException:
            with contextlib.suppress(Exception):
                await asyncio.shield(process.terminate(0))
            if sink.code.done() and not sink.code.cancelled():
                sink.code.exception()  # a lost link's, told by this raise: not unretrieved
            raise
        return RunnerOneShot(process, sink)
    raise AssertionError("unreachable")  # pragma: no cover
