"""Detach and resume for `cloudflare`: a process's terminal session outlives the client,
with the last 256 KiB of its output.

Facts (cloudflare/sandbox-sdk at the commit docs/providers.md names, "Cloudflare",
"Durable sessions"):

- Each process runs on the PTY of a bridge session of its own. Closing its socket only
  unsubscribes it (pty-ws-handler.ts `onClose`): the shell and the command keep running,
  and the PTY keeps writing its output into a 256 KiB ring (pty.ts `DEFAULT_BUFFER_SIZE`,
  utils/ring-buffer.ts), also after the shell exited (only `destroy` clears it). A new
  socket with the same `Session-Id` gets that same PTY (session-manager.ts `getPty`),
  the ring replayed in one binary frame, then `ready`, then live output: nothing is lost
  or repeated between the replay and the live stream (the replay and the subscription
  happen in one synchronous step of `onOpen`). So `keeps_processes` is True.
- The bridge has no process routes (routes.ts: no `getProcess`/`streamProcessLogs`; those
  exist only on the Durable Object's API, inside a Worker): terminals are all there is.
- What is lost: a ring holds the last 256 KiB only, so a process that printed more since
  its start has lost its start marker from the replay (the output before is not shown,
  with a note); a container that stopped (it sleeps after `sleepAfter`, 10 minutes by
  default, with no request: sandbox.ts) is gone with every session, process and file,
  and the bridge's pool gives the same sandbox id a fresh container at the next request
  (warm-pool.ts `getContainer`), as it does for a deleted sandbox. Nothing in the bridge
  tells a fresh container from the old one, so each session marks its container with a
  bridge session of its own (`mark_id`) when it starts; a resume that finds no mark
  (its create succeeds instead of answering "already exists", session-manager.ts
  `createSession`) raises `SessionGoneError`.

Output positions: a ref keeps, per process, how many of the command's bytes (what the
trap let through) the client had returned. The replay is run through a fresh trap with
the same token, and that many bytes are skipped, so the first poll after a resume
returns exactly what came after (while the ring still holds the start marker).

With the runner (`runner=True`, `runner_link`) the runner keeps the processes instead,
each with the latest output in its ring: a ref names each by its runner id, and a resume
opens a new link to the same runner (found by its content-named socket) and follows each
again from the client's output position: what it printed meanwhile first, then live,
then its exit code, also when it ended while no client was connected; and past the
terminal ring's 256 KiB (the runner's ring is the session's output limit).

The lease is a file in the sandbox (`sandbox.backends.toolkit.lease`), read and swapped
by a control exec.

A ref keeps the Worker's URL (a bare origin) but a resume never takes it: the URL comes
from the caller's `worker_url=` or CLOUDFLARE_SANDBOX_WORKER_URL, and a ref made against
another Worker is refused unless the caller passes its URL (the API key goes only where
the caller or the environment says). Only the options of `TAKEN_FROM_REF` are read.
"""

from __future__ import annotations

import asyncio
import re
from typing import Any

from yarl import URL

from ...backend import (
    OutputSink,
    ProcessNotReattached,
    ProcessRef,
    SessionRef,
    durable_session_id,
)
from ...errors import ProviderError, SandboxError, SessionGoneError
from ...runner import RunnerClient
from ..toolkit import (
    RunnerDurability,
    RunnerProcess,
    ScriptLease,
    ShellTrap,
    attach_options,
    parse_lease,
    refuse_other_endpoint,
    runner_id_in,
    taken_from_ref,
)
from . import runner_link
from .client import WorkerClient
from .scripts import PID_MARKER
from .terminal import PtyHandle, WorkerTerminal, connect, pump

# `CloudflareSession`, untyped here: its module imports this one, and an import back
# (even a type-only one) would close a cycle (tests/meta/test_layering.py).
CloudflareSession = Any

# pty.ts `DEFAULT_BUFFER_SIZE`: the most of a terminal's output the container keeps.
PTY_RING_BYTES = 256 * 1024
REF_OPTIONS = ("call_timeout_s", "connect_timeout_s", "ready_timeout_s", "heartbeat_s")
# The options a resume takes from a ref (never an endpoint or a credential).
TAKEN_FROM_REF = taken_from_ref(*REF_OPTIONS, "runner")
# What a ref's handle may hold: our own session names and trap tokens only.
SESSION_NAME = re.compile(r"sandbox-py-[0-9a-f]{16}")
TOKEN = re.compile(r"[0-9a-f]{16}")

RING_NOTE = (
    "the Cloudflare container keeps only the last 256 KiB of a terminal's output: what "
    "the process printed before them is not shown, and the start of what follows may "
    "repeat output already returned"
)
LOST_NOTE = (
    "the Cloudflare container no longer has this process's terminal session (it was "
    "deleted, or the container was replaced)"
)
GONE = (
    "the Cloudflare sandbox {id} no longer holds this session: the sandbox was deleted, "
    "or its container stopped (it sleeps after 10 minutes without a request) and the "
    "bridge gave the id a fresh one"
)


def mark_id(session_id: str) -> str:
    """The bridge session that marks the container a durable session runs in."""
    return f"sandbox-py-mark-{session_id}"


def _kept_url(url_text: str) -> str | None:
    """The Worker URL when it is a bare origin (no user, path, query or fragment: any of
    them could carry a token of its own); else None, and the resume must give it."""
    try:
        url = URL(url_text)
    except (TypeError, ValueError):
        return None
    if url.user or url.password or url.query_string or url.fragment:
        return None
    if url.raw_path not in ("", "/"):
        return None
    return f"{url.scheme}://{url.raw_host}" + (f":{url.port}" if url.explicit_port else "")


def command_position(entry: OutputSink[PtyHandle]) -> int:
    """How many of the command's own bytes (past the trap) the client has returned."""
    handle = entry.require_handle()
    returned = entry.returned_position
    notes = sum(size for at, size in handle.notes if at + size <= returned)
    return max(0, handle.base_command + (returned - handle.base_position) - notes)


# ---- the mark ---------------------------------------------------------------------------


def _exists_answer(exc: SandboxError) -> bool:
    # routes.ts answers a create of an existing session with 502 and the container's
    # message, session-manager.ts: "Session '<id>' already exists".
    return "already exists" in str(exc)


async def _create_session(client: WorkerClient, name: str, what: str) -> bool:
    """Create the bridge session `name`: True when made now, False when it existed."""
    try:
        await client.call("POST", client.sandbox_url("session"), what, json_body={"id": name})
    except ProviderError as exc:
        if _exists_answer(exc):
            return False
        raise
    return True


async def _delete_session(client: WorkerClient, name: str) -> None:
    """Delete a bridge session we made (best effort: the sandbox delete ends it too)."""
    try:
        await client.call(
            "DELETE", client.sandbox_url("session", name), "delete a terminal session"
        )
    except SandboxError:
        pass


async def mark(session: CloudflareSession) -> None:
    """Mark the container this session runs in (see the module docstring)."""
    await _create_session(
        session._client, mark_id(durable_session_id(session)), "mark the sandbox's container"
    )


async def unmark(session: CloudflareSession) -> None:
    """Remove the mark of a kept sandbox at close (its control shell is no use now)."""
    client = session._client
    if client.http is not None and client.sandbox_id is not None:
        await _delete_session(client, mark_id(durable_session_id(session)))


# ---- processes --------------------------------------------------------------------------


def _handle_from_ref(process: ProcessRef) -> tuple[str, str, int | None, int]:
    handle = process.handle
    name, token = handle.get("session"), handle.get("token")
    pid, position = handle.get("shell_pid"), handle.get("position", 0)
    if not (isinstance(name, str) and SESSION_NAME.fullmatch(name)):
        raise ProcessNotReattached("the ref holds no cloudflare terminal session for this process")
    if not (isinstance(token, str) and TOKEN.fullmatch(token)):
        raise ProcessNotReattached("the ref holds no trap token for this process")
    if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 1:
        pid = None
    if isinstance(position, bool) or not isinstance(position, int) or position < 0:
        position = 0
    return name, token, pid, position


def _replay(entry: OutputSink[PtyHandle], handle: PtyHandle, ring: bytes, skip: int) -> None:
    """Feed the ring's replay: through the trap, past the `skip` bytes already returned;
    with a note when the ring no longer holds the command's start."""
    if handle.shell_pid is None:
        found = re.search(PID_MARKER % handle.trap.token.encode(), ring)
        if found is not None:
            handle.shell_pid = int(found.group(1))
    trap = handle.trap
    shown = trap.feed(ring)
    if trap.started:
        shown = shown[skip:]
    elif len(ring) >= PTY_RING_BYTES:
        # The start marker rolled out of the ring: what is left is all command output.
        handle.trap = trap = ShellTrap(report_exit=True, token=trap.token)
        trap.started = True
        handle.note(entry, f"\n[sandbox: {RING_NOTE}]\n".encode())
        shown = trap.feed(ring)
    # else: the shell has not printed the start yet; the live stream goes on from here.
    if shown:
        entry.feed(shown)
    if trap.done:
        assert trap.exit_code is not None
        entry.report_exit(trap.exit_code)
        entry.report_eof()


# ---- the lease and the capability ------------------------------------------------------


class SandboxLease(ScriptLease):
    """The lease in the sandbox, through a control exec."""

    async def run(self, argv: list[str]) -> str | None:
        """The script on the sandbox's control shell (`WorkerClient.control`)."""
        client: WorkerClient = self.session._client
        code, out = await client.control(argv, "check the session's lease")
        return parse_lease(out.decode("utf-8", "replace"), code, "cloudflare")


class CloudflareDurability(RunnerDurability):
    """The cloudflare backend's durable sessions (the module docstring says what outlives
    the client), over the session it was made with: its terminals, or the runner's
    processes."""

    keeps_processes = True
    # Never said: a session without the runner reattaches its terminals itself.
    not_reattached = "the session has no runner to reattach this process through"

    def runner_client(self) -> RunnerClient | None:
        """The link to the runner in the sandbox, while the session has one."""
        runner = self.session._runner
        return None if runner is None else runner.client

    def kill_grace_s(self) -> float:
        """None: the backend has no `terminate_grace_s` (a terminal's kill is a SIGKILL),
        and its processes through the runner are spawned without a grace either."""
        return 0.0

    def ref_sandbox(self) -> dict[str, Any]:
        """The sandbox id, and whether the close deletes it."""
        return {"sandbox_id": self.session.sandbox_id, "keep": self.session.keep}

    def ref_options(self, base: dict[str, Any]) -> dict[str, Any]:
        """The base options plus the timeouts and (when it is a bare origin) the Worker
        URL; never the API key."""
        session = self.session
        options = dict(base)
        options.update({name: getattr(session, name) for name in REF_OPTIONS})
        url = _kept_url(session._worker_url)
        if url is not None:
            options["worker_url"] = url
        # What the session ended up with (`runner=None` may have fallen back): a resume
        # reaches the same runner, or the terminals.
        options["runner"] = session._runner_choice.uses
        return options

    def ref_direct_process(self, handle: PtyHandle) -> dict[str, Any]:
        """A terminal's process: the bridge session, the trap's token, the shell's pid."""
        return {
            "session": handle.session_id,
            "token": handle.trap.token,
            "shell_pid": handle.shell_pid,
        }

    def ref_process(self, entry: OutputSink[Any]) -> dict[str, Any]:
        """The runner's id of a process it keeps; a terminal's `ref_direct_process` and
        the command position."""
        ref = super().ref_process(entry)
        if not isinstance(entry.handle, RunnerProcess):
            ref["position"] = command_position(entry)
        return ref

    @classmethod
    def options_from_ref(cls, ref: SessionRef) -> dict[str, Any]:
        """Reopen attached (`sandbox_id=`), deleted on close unless the first was kept."""
        # None is a value of `heartbeat_s` (no heartbeat), elsewhere "not kept".
        return attach_options(ref, "cloudflare", TAKEN_FROM_REF, none_is_a_value=("heartbeat_s",))

    def lease_store(self) -> SandboxLease:
        """The lease (`SandboxLease`)."""
        return SandboxLease(self.session, durable_session_id(self.session))

    def check_endpoint(self, ref: SessionRef) -> None:
        """Refuse a ref made against another Worker than this client's, unless the caller
        passed `worker_url=` (before any request)."""
        session = self.session
        if session._worker_url_given:
            return
        used = _kept_url(session._worker_url) or session._client.origin
        refuse_other_endpoint("cloudflare", "worker_url", ref.options.get("worker_url"), used)

    async def resume(self, ref: SessionRef) -> None:
        """Attach to the sandbox; `SessionGoneError` when it is not running or its
        container is not the one the ref's session marked."""
        session = self.session
        self.check_endpoint(ref)
        client = session._client
        try:
            await session._attach_sandbox()
        except ProviderError as exc:
            if "not running" in str(exc):
                raise SessionGoneError(GONE.format(id=session._requested_id)) from None
            raise
        name = mark_id(durable_session_id(session))
        if await _create_session(client, name, "look for the sandbox's container mark"):
            # A fresh container: our create made the mark just now. Undo that; the
            # container is not ours to delete (the sandbox id may be in use by another).
            await _delete_session(client, name)
            raise SessionGoneError(GONE.format(id=client.sandbox_id))
        await session._start_runner()

    async def reattach(self, entry: OutputSink[Any], process: ProcessRef) -> None:
        """A process the runner keeps: through the runner, from the ref's output position
        (`RunnerDurability.reattach`). Else the session's PTY again: its ring replayed
        past the ref's position, then live."""
        if runner_id_in(process.handle) is not None:
            await super().reattach(entry, process)
            return
        session = self.session
        client = session._client
        name, token, pid, position = _handle_from_ref(process)
        if await _create_session(client, name, "look for the process's terminal session"):
            await _delete_session(client, name)  # the one our look just made
            raise ProcessNotReattached(LOST_NOTE)
        handle = PtyHandle(
            client=client,
            keep=session.keep,
            trap=ShellTrap(report_exit=True, token=token),
            session_id=name,
            session_confirmed=True,
        )
        handle.shell_pid = pid
        handle.base_position = process.output_position
        handle.base_command = position
        entry.handle = handle
        ring = await connect(
            client,
            handle,
            rows=process.rows,
            cols=process.cols,
            ready_timeout_s=session.ready_timeout_s,
            heartbeat_s=session.heartbeat_s,
        )
        assert handle.ws is not None
        _replay(entry, handle, b"".join(ring), position)
        handle.terminal = WorkerTerminal(handle.ws, [])
        handle.reader = asyncio.create_task(pump(entry, handle, session._redact))

    async def release(self, entry: OutputSink[Any]) -> None:
        """Stop following the process: close its socket, stop its reader
        (`PtyHandle.release`; the session, its shell and its command stay:
        pty-ws-handler.ts `onClose` only unsubscribes), or its route in the runner
        (`RunnerProcess.release`: the runner keeps it)."""
        handle: PtyHandle | RunnerProcess | None = entry.handle
        if handle is not None:
            await handle.release()

    async def detach(self) -> None:
        """End the runner's link (its processes live on in the runner), then close the
        HTTP client; the sandbox and its sessions stay."""
        session = self.session
        runner, session._runner = session._runner, None
        try:
            await runner_link.shut_down(runner)
        finally:
            session._create_task = None
            await session._client.close()
