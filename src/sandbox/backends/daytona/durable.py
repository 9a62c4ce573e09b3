"""Detach and resume for `daytona`: session commands (with their logs) and PTY sessions
(without their output) outlive the client.

Facts (daytona SDK, pinned): a pipe process is a session command started with
`run_async=True` (`process.execute_session_command`); it runs in the sandbox's daemon,
not on the client's connection, and its output is kept by the daemon for the
command's whole life: `process.get_session_command_logs_async(session_id, cmd_id, ...)`
streams it from the command's start (`get_session_command` has its `exit_code` once it
ended). So a reattached pipe process replays its log, skips what the earlier client had
already returned (the ref's `output_position`), and gets everything it printed while
no client was attached, and its exit code (`keeps_processes` is True).

A PTY session also outlives its client (daytona v0.190.0, the daemon's
`apps/daemon/pkg/toolbox/process/pty/`): a connection that closes only unregisters
itself, and `process.connect_pty_session(id, on_data)` connects again. But the daemon
keeps none of its output (it is broadcast to the clients connected at that moment), so
a reattached terminal starts with an omission note and shows what it prints from then
on; and when its process ends the daemon deletes the session with its exit status, so
a terminal that ended while no client was connected is reported ended with a note.
`detach()` disconnects PTYs and stops the log readers of pipes; nothing is killed.

With the runner (`runner=True`, `runner_link`) the runner keeps the processes instead,
with the latest output of each in a ring: a ref names each by its runner id, and a resume
connects to the same runner (found by its content-named socket) and follows each again
from the output position the client had reached: what it printed meanwhile first (the
omission marker where the ring kept less), then live, then its exit code, also when it
ended while no client was connected. For a terminal this is the replay the daemon
cannot give.

The lease is a file in the sandbox (`sandbox.backends.toolkit.lease`) through
`process.exec`.

A ref says whether its session created the sandbox (`created`) and whether the close
deletes it (`keep`). A created sandbox carries our `sandbox.session` label with the
durable session's id. Before a resumed session takes on deleting the sandbox,
`check_created` reads its labels as the attach's `get` answered them: without that
label and the ref's session id the resume fails (`RefNotTrustedError`) and nothing is
deleted: the library deletes only a sandbox it shows it made, whatever a ref claims.
"""

from __future__ import annotations

import asyncio
import os
import re
from typing import Any

from ...backend import (
    OutputSink,
    ProcessNotReattached,
    ProcessRef,
    SessionRef,
    durable_session_id,
    kill_handle,
)
from ...errors import (
    ProviderError,
)
from ...runner import RunnerClient
from ..toolkit import (
    RunnerDurability,
    RunnerProcess,
    ScriptLease,
    attach_options,
    attach_or_gone,
    check_mark,
    lease_line,
    parse_lease,
    refuse_other_endpoint,
    runner_id_in,
    taken_from_ref,
)
from . import commands, terminal
from .commands import PipeState
from .handles import DaytonaHandle
from .terminal import PtyState

SAFE = re.compile(r"[A-Za-z0-9/._-]{1,256}")
REF_OPTIONS = ("create_timeout_s", "terminate_grace_s", "teardown_timeout_s")
# The options a resume takes from a ref: never `api_url` (see `check_endpoint`) or a
# credential. `target` (a region of the same API) is kept.
TAKEN_FROM_REF = taken_from_ref(*REF_OPTIONS, "call_timeout_s", "target", "runner")
# The SDK's API when neither `api_url=` nor DAYTONA_API_URL says (daytona `DaytonaConfig`).
DEFAULT_API_URL = "https://app.daytona.io/api"
PTY_NOT_KEPT = (
    "daytona keeps no output of a terminal while no client is connected: what it "
    "printed meanwhile is not shown"
)
PTY_GONE_NOTE = (
    "daytona no longer has this terminal: it ended while no client was connected (the "
    "daemon deletes a PTY session, with its exit status, when its process ends)"
)
GONE_NOTE = "daytona no longer has this session command (its session was deleted)"
LEASE_TIMEOUT_S = 30.0


def _safe(process: ProcessRef, key: str) -> str | None:
    value = process.handle.get(key)
    return value if isinstance(value, str) and SAFE.fullmatch(value) else None


class SandboxLease(ScriptLease):
    """The lease in the sandbox, through `process.exec`."""

    async def run(self, argv: list[str]) -> str | None:
        """`process.exec` of the script's line, within `LEASE_TIMEOUT_S`."""
        client = self.session._client
        try:
            async with asyncio.timeout(LEASE_TIMEOUT_S):
                response = await client.process.exec(lease_line(argv))
        except TimeoutError:
            raise ProviderError(
                "Daytona did not answer the lease check in time", retryable=True
            ) from None
        except Exception as exc:
            raise client.error(exc, "check the session's lease") from None
        return parse_lease(response.result or "", response.exit_code, "daytona")


class DaytonaDurability(RunnerDurability):
    """The daytona backend's durable sessions (the module docstring says what outlives
    the client), over the session it was made with: the daemon's processes, or the
    runner's."""

    keeps_processes = True
    # Never said: a session without the runner reattaches the daemon's processes itself.
    not_reattached = "the session has no runner to reattach this process through"

    def runner_client(self) -> RunnerClient | None:
        """The link to the runner in the sandbox, while the session has one."""
        runner = self.session._runner
        return None if runner is None else runner.client

    def kill_grace_s(self) -> float:
        """The session's `terminate_grace_s`."""
        return float(self.session.terminate_grace_s)

    def ref_sandbox(self) -> dict[str, Any]:
        """The sandbox id, whether the session created it, and whether the close deletes it."""
        session = self.session
        return {"sandbox_id": session.sandbox_id, "created": session._created, "keep": session.keep}

    def ref_options(self, base: dict[str, Any]) -> dict[str, Any]:
        """The base options plus the timeouts (never the API key or `create_options`)."""
        session = self.session
        options = dict(base)
        options.update({name: getattr(session, name) for name in REF_OPTIONS})
        options["call_timeout_s"] = session._client.options.call_timeout_s
        # The API this session used (given, from the environment or the SDK's default).
        for name, value in (
            ("api_url", self.api_url_used()),
            ("target", session._client.options.target),
        ):
            if isinstance(value, str) and "@" not in value:
                options[name] = value
        # What the session ended up with (`runner=None` may have fallen back): a resume
        # reaches the same runner, or the daemon's processes.
        options["runner"] = session._runner_choice.uses
        return options

    def api_url_used(self) -> str:
        """The API the SDK talks to: `api_url=`, else DAYTONA_API_URL (or the older
        DAYTONA_SERVER_URL) from the process environment, else its default."""
        given = self.session._client.options.api_url
        return str(
            given
            or os.environ.get("DAYTONA_API_URL")
            or os.environ.get("DAYTONA_SERVER_URL")
            or DEFAULT_API_URL
        )

    @classmethod
    def options_from_ref(cls, ref: SessionRef) -> dict[str, Any]:
        """Reopen attached (`sandbox_id=`), deleted on close unless the first was kept."""
        return attach_options(ref, "daytona", TAKEN_FROM_REF)

    def check_endpoint(self, ref: SessionRef) -> None:
        """Refuse a ref made against another API than this client's (`api_url_used`),
        unless the caller passed `api_url=` (before any request)."""
        if self.session._client.options.api_url is not None:
            return
        refuse_other_endpoint("daytona", "api_url", ref.options.get("api_url"), self.api_url_used())

    def ref_direct_process(self, handle: DaytonaHandle) -> dict[str, Any]:
        """The session and command ids and the pid file (pipes), or the PTY session id."""
        return handle.ref_handle()

    def lease_store(self) -> SandboxLease:
        """The lease (`SandboxLease`)."""
        return SandboxLease(self.session, durable_session_id(self.session))

    async def resume(self, ref: SessionRef) -> None:
        """Attach to the sandbox (the API checked first: `check_endpoint`); a missing one is
        `SessionGoneError`. Then connect to the runner if the ref's session had it."""
        session = self.session
        self.check_endpoint(ref)
        session._runner_deferred = True
        try:
            await attach_or_gone(session, "daytona", gone_words=("not found", "404"))
        finally:
            session._runner_deferred = False
        if not session.keep:
            self.check_created(ref)
        session._created = ref.sandbox.get("created") is True
        await session._start_runner()

    def check_created(self, ref: SessionRef) -> None:
        """The resumed close would delete the sandbox: its labels (as `AsyncDaytona.get`
        answered them at the attach) must carry our `sandbox.session` label with the ref's
        session id, else `RefNotTrustedError` (the resume then only detaches)."""
        session = self.session
        labels = getattr(session._client.sandbox, "labels", None)
        check_mark(ref, labels, backend="daytona", what=f"the sandbox {session.sandbox_id!r}")

    async def reattach(self, entry: OutputSink[Any], process: ProcessRef) -> None:
        """A process the runner keeps: through the runner, from the ref's output position
        (`RunnerDurability.reattach`). Pipes: replay the command's log past
        `output_position`; PTYs: connect again, output from now on after a note (see the
        module docstring)."""
        if runner_id_in(process.handle) is not None:
            await super().reattach(entry, process)
            return
        session = self.session
        client, grace_s = session._client, session.terminate_grace_s
        pidfile = _safe(process, "pidfile")
        if process.tty:
            pty_id = _safe(process, "pty_id")
            if pty_id is None or pidfile is None:
                raise ProcessNotReattached("the ref holds no daytona PTY session for this process")
            note = f"\n[sandbox: {PTY_NOT_KEPT}]\n".encode()
            if not await terminal.reconnect(client, entry, pty_id, pidfile, note, grace_s):
                raise ProcessNotReattached(PTY_GONE_NOTE)
            return
        session_id, cmd_id = _safe(process, "session_id"), _safe(process, "cmd_id")
        if session_id is None or cmd_id is None or pidfile is None:
            raise ProcessNotReattached("the ref holds no daytona session command for this process")
        state = PipeState(
            client=client,
            pidfile=pidfile,
            grace_s=grace_s,
            session_id=session_id,
            session_attempted=True,
            execute_attempted=True,
            cmd_id=cmd_id,
        )
        try:
            await client.timed(
                "find the command", client.process.get_session_command(session_id, cmd_id)
            )
        except Exception as exc:
            raise ProcessNotReattached(f"{GONE_NOTE}: {client.describe(exc)}") from None
        entry.handle = state
        state.pump = asyncio.create_task(
            commands.pump(client, entry, state, None, skip=process.output_position)
        )

    async def release(self, entry: OutputSink[Any]) -> None:
        """Stop following a process without ending it: a pipe command's log reader, a PTY
        session's connection; the daemon keeps both. A runner's process: its route only
        (`RunnerProcess.release`); the runner keeps it."""
        state = entry.handle
        if state is None:
            return
        if isinstance(state, RunnerProcess):
            await state.release()
            return
        if isinstance(state, PtyState) and not state.line_sent:
            # Half-started: its command never ran, nothing to keep.
            await kill_handle(entry)
            return
        await state.release()

    async def detach(self) -> None:
        """Close the runner's link (its processes live on in the runner), then the SDK
        client; the sandbox stays."""
        session = self.session
        runner, session._runner = session._runner, None
        try:
            if runner is not None:
                await runner.aclose()
        finally:
            await self._close_client()

    async def _close_client(self) -> None:
        client = self.session._client
        sdk_client = client.client
        client.sandbox = client.client = None
        client._ready = False
        if sdk_client is not None:
            try:
                await client.bounded(sdk_client.close())
            except Exception as exc:  # the sandbox is not ours to touch now: only noted
                raise ProviderError(
                    f"closing the daytona client failed: {client.describe(exc)}"
                ) from None
