"""Detach and resume for `e2b`: sandboxes and their processes outlive the client.

Facts (e2b==2.63.0, the pinned SDK): envd runs every command and PTY itself, so closing
a client's stream (`AsyncCommandHandle.disconnect()`: "the process keeps running")
leaves the process running; `commands.connect(pid, timeout, ...)` and
`pty.connect(pid, on_data, timeout)` attach to it again (`keeps_processes` is True).
Their `ConnectRequest` selects the process and nothing else (envd/process/process_pb.py:
no output offset): a reattached client gets what the process prints from then on, and
what it printed while nobody was connected is lost, so the first poll after a resume
starts with an omission note. A process that ended while no client was connected is
forgotten by envd with its exit status: its `connect` raises `NotFoundException`, and
it is reported as ended with a note. `connect`'s own `timeout` (60 s by default) would
cut the stream: the session passes its `process_timeout_s` as on a start.

With the runner (`runner=True`, `runner_link`) the runner keeps the processes instead,
with the latest output of each in a ring: a ref names each by its runner id, and a resume
connects to the same runner (found by its content-named socket) and follows each again
from the output position the client had reached: what it printed meanwhile first (the
omission marker where the ring kept less), then live, then its exit code, also when it
ended while no client was connected. The reason to use it on E2B.

The lease is a file in the sandbox (`sandbox.backends.toolkit.lease`), read and swapped by
a short `commands.run`.

A ref says whether its session created the sandbox (`created`) and whether the close
deletes it (`keep`). A created sandbox carries our `sandbox.session` metadata key with the
durable session's id (set by the create). Before a resumed session takes on deleting the
sandbox, `check_created` reads the sandbox's metadata back (`get_info`): without that
key and the ref's session id the resume fails (`RefNotTrustedError`) and nothing is
deleted: the library deletes only a sandbox it shows it made, whatever a ref claims.
"""

from __future__ import annotations

import asyncio
from typing import Any

from e2b import NotFoundException

from ...backend import (
    OutputSink,
    ProcessNotReattached,
    ProcessRef,
    SessionRef,
    durable_session_id,
)
from ...errors import ProviderError, SandboxError
from ...runner import RunnerClient
from ..toolkit import (
    RunnerDurability,
    RunnerProcess,
    ScriptLease,
    attach_options,
    attach_or_gone,
    check_mark,
    check_tag,
    lease_line,
    new_tag,
    parse_lease,
    runner_id_in,
    taken_from_ref,
)
from . import runner_link
from .errors import GONE
from .processes import E2BProcess, text_to_bytes

REF_OPTIONS = (
    ("start_timeout_s", "start_timeout"),
    ("teardown_timeout_s", "kill_timeout"),
    ("process_timeout_s", "process_timeout"),
    ("call_timeout_s", "call_timeout"),
)
# The options a resume takes from a ref: never a credential, a class or an endpoint (the
# SDK finds its domain in the environment).
TAKEN_FROM_REF = taken_from_ref(
    *(option for option, _ in REF_OPTIONS), "sandbox_timeout_s", "runner"
)
NOT_KEPT = (
    "e2b keeps no output of a process while no client is connected: what it printed "
    "meanwhile is not shown"
)
GONE_NOTE = (
    "e2b no longer has this process: it ended while no client was connected (envd "
    "forgets a finished process, with its exit status)"
)


def _tag(process: ProcessRef, key: str) -> str:
    value = process.handle.get(key)
    try:
        return check_tag(value) if isinstance(value, str) else new_tag()
    except ValueError:
        return new_tag()


class SandboxLease(ScriptLease):
    """The lease in the sandbox, through `commands.run`."""

    async def run(self, argv: list[str]) -> str | None:
        """`commands.run` of the script's line, bounded by the kill timeout."""
        client = self.session._client
        line = lease_line(argv)
        try:
            result = await client.bounded(
                client.sandbox.commands.run(line, timeout=client.kill_timeout, **client.request()),
                client.kill_timeout,
            )
        except TimeoutError:
            raise ProviderError(
                "E2B did not answer the lease check in time", retryable=True
            ) from None
        except Exception as exc:
            self.session._errors.fail(exc, "check the session's lease")
        return parse_lease(result.stdout or "", result.exit_code, "e2b")


class E2BDurability(RunnerDurability):
    """The e2b backend's durable sessions (the module docstring says what outlives
    the client), over the session it was made with: envd's processes, or the runner's."""

    keeps_processes = True
    # Never said: a session without the runner reattaches envd's processes itself.
    not_reattached = "the session has no runner to reattach this process through"

    def kill_grace_s(self) -> float:
        """None: e2b has no `terminate_grace_s` (envd's kill is a SIGKILL), and its
        processes through the runner are spawned without a grace as well."""
        return 0.0

    def runner_client(self) -> RunnerClient | None:
        """The link to the runner in the sandbox, while the session has one."""
        runner = self.session._runner
        return None if runner is None else runner.client

    def ref_sandbox(self) -> dict[str, Any]:
        """The sandbox id, whether the session created it, and whether the close deletes it."""
        session = self.session
        return {
            "sandbox_id": session.sandbox_id,
            "created": session._created,
            "keep": session._keep,
        }

    def ref_options(self, base: dict[str, Any]) -> dict[str, Any]:
        """The base options plus the timeouts (never the API key, `env` or `labels`)."""
        options = dict(base)
        client = self.session._client
        for option, attribute in REF_OPTIONS:
            options[option] = getattr(client, attribute)
        options["sandbox_timeout_s"] = self.session._sandbox_timeout
        # What the session ended up with (`runner=None` may have fallen back): a resume
        # reaches the same runner, or envd's processes.
        options["runner"] = self.session._runner_choice.uses
        return options

    def ref_direct_process(self, handle: E2BProcess) -> dict[str, Any]:
        """envd's pid and the toolkit tags of the process's tree."""
        return {"pid": handle.handle.pid, "tag": handle.tag, "outer_tag": handle.outer_tag}

    @classmethod
    def options_from_ref(cls, ref: SessionRef) -> dict[str, Any]:
        """Reopen attached (`sandbox_id=`), kept or not as the first session was."""
        return attach_options(ref, "e2b", TAKEN_FROM_REF)

    def lease_store(self) -> SandboxLease:
        """The lease (`SandboxLease`)."""
        return SandboxLease(self.session, durable_session_id(self.session))

    async def resume(self, ref: SessionRef) -> None:
        """Connect to the sandbox (a missing one is `SessionGoneError`), check it is the
        library's before taking on its deletion (`check_created`), then connect to the
        runner if the ref's session had it."""
        session = self.session
        session._runner_deferred = True
        try:
            await attach_or_gone(session, "e2b", gone=GONE)
        finally:
            session._runner_deferred = False
        if not session._keep:
            await self.check_created(ref)
        session._created = ref.sandbox.get("created") is True
        await session._start_runner()

    async def check_created(self, ref: SessionRef) -> None:
        """The resumed close would kill the sandbox: E2B must show our `sandbox.session`
        metadata with the ref's session id on it (`AsyncSandbox.get_info`), else
        `RefNotTrustedError` (the resume then only detaches: nothing is killed)."""
        session = self.session
        client = session._client
        sandbox_id = session.sandbox_id
        try:
            info = await client.timed(
                client.sandbox.get_info(**session._api_params()), "read the sandbox's metadata"
            )
        except SandboxError:
            raise
        except Exception as exc:
            session._errors.fail(exc, "read the sandbox's metadata")
        metadata = getattr(info, "metadata", None)
        check_mark(
            ref, metadata, backend="e2b", what=f"the sandbox {sandbox_id!r}", kind="metadata"
        )

    async def reattach(self, entry: OutputSink[Any], process: ProcessRef) -> None:
        """A process the runner keeps: through the runner, from the ref's output position
        (`RunnerDurability.reattach`). Else `pty.connect` / `commands.connect` by pid;
        output from now on, after a note."""
        if runner_id_in(process.handle) is not None:
            await super().reattach(entry, process)
            return
        pid = process.handle.get("pid")
        if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 1:
            raise ProcessNotReattached("the ref holds no e2b pid for this process")
        client = self.session._client
        proc = E2BProcess(
            client,
            tty=process.tty,
            keep=self.session._keep,
            tag=_tag(process, "tag"),
            outer_tag=_tag(process, "outer_tag"),
        )
        entry.handle = proc
        entry.feed(f"\n[sandbox: {NOT_KEPT}]\n".encode())

        def on_output(chunk: str | bytes) -> None:
            entry.feed(text_to_bytes(chunk))

        if process.tty:
            connect = client.sandbox.pty.connect(
                pid, on_data=on_output, timeout=client.process_timeout, **client.request()
            )
        else:
            connect = client.sandbox.commands.connect(
                pid,
                timeout=client.process_timeout,
                on_stdout=on_output,
                on_stderr=on_output,
                retain_output=False,
                **client.request(),
            )
        proc.start_task = asyncio.ensure_future(client.bounded(connect, client.start_timeout))
        try:
            proc.handle = await asyncio.shield(proc.start_task)
        except NotFoundException:
            entry.handle = None
            raise ProcessNotReattached(GONE_NOTE) from None
        except Exception as exc:
            self.session._errors.fail(exc, "reconnect to a process")
        proc.waiter = asyncio.ensure_future(proc.watch(entry))

    async def release(self, entry: OutputSink[Any]) -> None:
        """Stop following the process (`E2BProcess.release`: its waiter, the SDK's
        reader; `RunnerProcess.release`: the runner's route); envd, or the runner,
        keeps it."""
        proc: E2BProcess | RunnerProcess | None = entry.handle
        if proc is not None:
            await proc.release()

    async def detach(self) -> None:
        """Close the runner's link (its processes live on in the runner), then forget the
        SDK sandbox object; the sandbox keeps running until its own timeout."""
        session = self.session
        runner, session._runner = session._runner, None

        async def forget() -> None:
            session._start_task = None
            session._client.sandbox = None

        await runner_link.shut_down(runner, forget)
