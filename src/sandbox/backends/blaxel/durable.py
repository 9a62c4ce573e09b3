"""Detach and resume for `blaxel`: terminal sessions outlive their client.

Facts (the sandbox API, github.com/blaxel-ai/sandbox at bfecd2e7da6a,
`sandbox-api/src/handler/terminal.go` and `handler/terminal/session_manager.go`; the
SDK, blaxel==0.4.24):

- A terminal session is kept by its `sessionId` across WebSocket disconnects
  (`ManagedSession`: "keeps the terminal session alive across WebSocket disconnects");
  a connection with the same id reattaches to it (`GetOrCreate`), resizes it to its own
  size, and first gets the session's output ring replayed as ONE `output` frame: at
  most 100 KiB (`maxBufferSize`), its front cut at a line start, prefixed with
  `ESC [0m` (`GetBuffer`); then the live output. So every process of a session keeps
  running with no client, and `keeps_processes` is True.
- A session with no client is closed, everything in it SIGKILLed, once it has had no
  activity for 10 minutes (`sessionIdleTimeout`, checked every 30 s; activity is output
  appended or a client leaving): a detached process silent that long is lost.
- When the shell exits the session is closed at once and marked dead; a connection to
  a dead id starts a new shell. The wrapper therefore lingers after the end marker
  (`terminal`, "Lingering") until a client has read it, so a command that ended while
  no client was attached is still in its ring, with its exit status.
- `GetOrCreate` uses the `shell` query parameter only to make a NEW session. A reattach
  names a shell that does not exist: a session that is gone then answers an `error`
  frame (Go's "fork/exec ...") and closes, instead of a fresh shell under the old id.

A reattached process replays the ring through a new `ShellTrap` of the same token and
skips the `output_position` bytes the earlier client had returned; where the ring was
cut before the command's start marker, what it printed first is lost: a note says so,
and the ring's whole remainder follows (it may repeat output returned before).
Positions are counted on the replay: a UTF-8 character split between two PTY reads
arrived as U+FFFDs live but whole in the replay, so a few bytes may repeat or be
skipped around one. The sandbox is found again by name (`SandboxInstance.get`, never a
create: a deleted sandbox is `SessionGoneError`). The lease is a file in the sandbox
(`sandbox.backends.toolkit.lease`), read and swapped by a waited `process.exec`.

With the runner (`runner=True`, `runner_link`) the runner keeps the processes instead,
with the latest output of each in a ring: a ref names each by its runner id, and a
resume connects to the same runner (found by its content-named socket, through a new
terminal link) and follows each again from the output position the client had reached:
what it printed meanwhile first (the omission marker where the ring kept less), then
live, then its exit code, also when it ended while no client was connected; byte-exact,
with no 10-minute bound on a silent process (the runner is no terminal session).

A ref keeps the control-plane URL (`api_url`) but a resume never takes it: the URL comes
from the caller's `api_url=` or the SDK's default, and a ref made against another API is
refused unless the caller passes its URL (the API key goes only where the caller or the
environment says). Only the options of `TAKEN_FROM_REF` are read.

A ref says whether its session created the sandbox (`created`) and whether the close
deletes it (`keep`). A created sandbox carries our `sandbox.session` label with the
durable session's id (`metadata.labels`, given to the create). Before a resumed session
takes on deleting the sandbox, `check_created` reads its labels as `SandboxInstance.get`
answered them at the attach: without that label and the ref's session id the resume
fails (`RefNotTrustedError`) and nothing is deleted: the library deletes only a sandbox
it shows it made, whatever a ref claims.
"""

from __future__ import annotations

import asyncio
import re
import secrets
from typing import Any

import aiohttp

from ...backend import (
    OutputSink,
    ProcessNotReattached,
    ProcessRef,
    SessionRef,
    durable_session_id,
)
from ...errors import ProviderError
from ...runner import RunnerClient
from ..toolkit import (
    RunnerDurability,
    RunnerProcess,
    ScriptLease,
    ShellTrap,
    attach_options,
    check_mark,
    check_tag,
    lease_line,
    parse_lease,
    refuse_other_endpoint,
    runner_id_in,
    taken_from_ref,
)
from . import runner_link, terminal
from .process import Terminal
from .sdk import default_api_url
from .terminal import parse_terminal_frame, text_to_bytes

# A shell no sandbox has: a reattach must never start a new session (see above).
MISSING_SHELL = "/nonexistent/sandbox-reattach-only"
# What `GetBuffer` puts before the replayed ring.
REPLAY_PREFIX = "\x1b[0m"
HEX = re.compile(r"[0-9a-f]{8,64}")
REF_OPTIONS = (
    "call_timeout_s",
    "connect_timeout_s",
    "close_timeout_s",
    "heartbeat_s",
    "probe_interval_s",
    "terminate_grace_s",
    "max_response_bytes",
    "max_terminal_frame_bytes",
)
# The options a resume takes from a ref (never an endpoint or a credential).
TAKEN_FROM_REF = taken_from_ref(*REF_OPTIONS, "workdir", "runner")
GONE_NOTE = (
    "Blaxel no longer has this terminal session: its shell ended, or the sandbox closed "
    "it after 10 minutes without a client or output"
)
CUT_NOTE = (
    "Blaxel keeps the last 100 KiB of a terminal's output: what this process printed "
    "before that is not shown"
)
NO_REPLAY_NOTE = "Blaxel replayed none of this terminal's output: what it printed is not shown"
LEASE_TIMEOUT_S = 30


def _handle(process: ProcessRef) -> tuple[str, str, str]:
    handle = process.handle
    sid, tag, token = handle.get("session_id"), handle.get("tag"), handle.get("token")
    if not all(isinstance(v, str) and HEX.fullmatch(v) for v in (sid, token)):
        raise ProcessNotReattached("the ref holds no blaxel terminal session for this process")
    assert isinstance(sid, str) and isinstance(token, str)
    try:
        checked = check_tag(tag) if isinstance(tag, str) else None
    except ValueError:
        checked = None
    if checked is None:
        raise ProcessNotReattached("the ref holds no blaxel terminal session for this process")
    return sid, checked, token


async def _first_output(ws: aiohttp.ClientWebSocketResponse, timeout: float) -> str | None:
    """The replay frame's text ("" when none came in `timeout`), or None when the
    session is gone (an `error` frame, or the socket closed first)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        try:
            msg = await ws.receive(timeout=max(0.0, deadline - loop.time()))
        except TimeoutError:
            return ""
        if msg.type not in (aiohttp.WSMsgType.TEXT, aiohttp.WSMsgType.BINARY):
            return None  # closed, or failed: nothing to follow
        frame = parse_terminal_frame(msg.data)
        if frame is None:
            continue  # a malformed frame is skipped, as the reader does
        kind, data = frame
        return data if kind == "output" else None


def _show_replay(entry: OutputSink[Terminal], term: Terminal, replay: str, position: int) -> None:
    """Feed the ring through the trap: from the command's start when the ring still
    holds it (minus the `position` bytes returned before), else after a note."""
    data = text_to_bytes(replay.removeprefix(REPLAY_PREFIX))
    if replay.startswith(REPLAY_PREFIX):
        probe = ShellTrap(report_exit=True, token=term.trap.token)
        shown = probe.feed(data)
        if probe.started:
            term.trap = probe
            term.started.set()
            term.skip = position
            visible = term.visible(shown)
            if visible:
                entry.feed(visible)
            return
    # The start marker is not in the ring: the ring was cut past it.
    note = CUT_NOTE if replay.startswith(REPLAY_PREFIX) else NO_REPLAY_NOTE
    entry.feed(f"\n[sandbox: {note}]\n".encode())
    term.trap.started = True
    term.trap.decided.set()
    term.started.set()
    shown = term.trap.feed(data)
    if shown:
        entry.feed(shown)


class SandboxLease(ScriptLease):
    """The lease in the sandbox, through a waited `process.exec`."""

    async def run(self, argv: list[str]) -> str | None:
        """A waited `process.exec` of the script's line, under a fresh process name."""
        client = self.session._client
        instance = client.sandbox()
        response = await client.call(
            "check the session's lease",
            lambda: instance.process.exec(
                {
                    "command": lease_line(argv),
                    "name": f"lease-{secrets.token_hex(6)}",
                    "wait_for_completion": True,
                    "timeout": LEASE_TIMEOUT_S,
                }
            ),
            timeout=min(client.api_timeout_s, LEASE_TIMEOUT_S + 10.0),
        )
        return parse_lease(response.stdout or "", response.exit_code, "blaxel")


class BlaxelDurability(RunnerDurability):
    """The blaxel backend's durable sessions (the module docstring says what outlives
    the client), over the session it was made with: terminal sessions, or the
    runner's processes."""

    keeps_processes = True
    # Never said: a session without the runner reattaches its terminals itself.
    not_reattached = "the session has no runner to reattach this process through"

    def runner_client(self) -> RunnerClient | None:
        """The link to the runner in the sandbox, while the session has one."""
        runner = self.session._runner
        return None if runner is None else runner.client

    def kill_grace_s(self) -> float:
        """The session's `terminate_grace_s` (a reattached runner's process is killed
        as a spawned one is)."""
        return float(self.session.terminate_grace_s)

    def ref_sandbox(self) -> dict[str, Any]:
        """The sandbox's name, whether the session created it, and whether the close
        deletes it."""
        session = self.session
        return {"name": session.sandbox_name, "created": session._created, "keep": session.keep}

    def ref_options(self, base: dict[str, Any]) -> dict[str, Any]:
        """The base options plus `workdir`, the API URL and the bounds (never the API key,
        the workspace, `labels` or the create options)."""
        session = self.session
        options = dict(base)
        options["workdir"] = session.workdir
        term = session._terminal_options
        values = {
            "call_timeout_s": session._client.api_timeout_s,
            "connect_timeout_s": term.connect_timeout_s,
            "close_timeout_s": term.close_timeout_s,
            "heartbeat_s": term.heartbeat_s,
            "probe_interval_s": term.probe_interval_s,
            "terminate_grace_s": session.terminate_grace_s,
            "max_response_bytes": session._client.max_response_bytes,
            "max_terminal_frame_bytes": term.max_frame_bytes,
        }
        options.update({name: values[name] for name in REF_OPTIONS})
        # The control plane this session used (given, else the SDK's default).
        url = session._client._api_url or default_api_url()
        if isinstance(url, str) and "@" not in url:  # never a URL with credentials in it
            options["api_url"] = url
        # What the session ended up with (`runner=None` may have fallen back): a resume
        # reaches the same runner, or the terminal sessions.
        options["runner"] = session._runner_choice.uses
        return options

    def ref_direct_process(self, handle: Terminal) -> dict[str, Any]:
        """The terminal's session id, the tag of its tree and the trap's token."""
        term = handle
        return {"session_id": term.session_id, "tag": term.tag, "token": term.trap.token}

    @classmethod
    def options_from_ref(cls, ref: SessionRef) -> dict[str, Any]:
        """Reattach by name, deleted on close unless the first session kept it."""
        # None is a value of `heartbeat_s` (no heartbeat), elsewhere "not kept".
        return attach_options(
            ref, "blaxel", TAKEN_FROM_REF, key="name", none_is_a_value=("heartbeat_s",)
        )

    def lease_store(self) -> SandboxLease:
        """The lease (`SandboxLease`)."""
        return SandboxLease(self.session, durable_session_id(self.session))

    def check_endpoint(self, ref: SessionRef) -> None:
        """Refuse a ref made against another control plane than this client's, unless the
        caller passed `api_url=` (before any request)."""
        if self.session._client._api_url is not None:
            return
        refuse_other_endpoint("blaxel", "api_url", ref.options.get("api_url"), default_api_url())

    async def resume(self, ref: SessionRef) -> None:
        """Find the sandbox by name (`SessionGoneError` when it is gone) and bind to it;
        closing the resumed session deletes it as the first one's close would have;
        then connect to the runner if the ref's session had it."""
        session = self.session
        self.check_endpoint(ref)
        session._create_attempted = False
        await session._client.attach(session.sandbox_name)
        if not session.keep:
            self.check_created(ref)
        session._created = ref.sandbox.get("created") is True
        session._create_attempted = True
        session._deleted = False
        await session._start_runner()

    def check_created(self, ref: SessionRef) -> None:
        """The resumed close would delete the sandbox: its labels must carry our
        `sandbox.session` label with the ref's session id, else `RefNotTrustedError`
        (raised before the session takes on the deletion: the resume then only
        detaches)."""
        labels = self.session._client.labels()
        check_mark(ref, labels, backend="blaxel", what=f"the sandbox {self.session.sandbox_name!r}")

    async def reattach(self, entry: OutputSink[Terminal], process: ProcessRef) -> None:
        """A process the runner keeps: through the runner, from the ref's output position
        (`RunnerDurability.reattach`). Else reconnect to the process's terminal session
        (never a new one), replay its ring past `output_position`, then follow it as a
        spawn does."""
        if runner_id_in(process.handle) is not None:
            await super().reattach(entry, process)
            return
        session = self.session
        sid, tag, token = _handle(process)
        client, options = session._client, session._terminal_options
        term = Terminal(
            entry, client, options, keep=session.keep, token=token, session_id=sid, tag=tag
        )
        term.line_sent = True
        entry.handle = term  # from here a cancelled reattach closes the socket, kills nothing
        http = client.http
        if http is None:
            raise ProviderError("the blaxel session is not started", retryable=False)
        term.ws = await terminal.connect(
            http,
            client.terminal_url(sid, process.rows, process.cols, session.workdir, MISSING_SHELL),
            client.auth_headers(),
            options,
            f"reconnect to a terminal in the Blaxel sandbox {session.sandbox_name!r}",
        )
        replay = await _first_output(term.ws, options.connect_timeout_s)
        if replay is None:
            await term.close()
            entry.handle = None
            raise ProcessNotReattached(GONE_NOTE)
        _show_replay(entry, term, replay, process.output_position)
        if term.trap.done:
            assert term.trap.exit_code is not None
            entry.report_exit(term.trap.exit_code)
            entry.report_eof()
            await term.release_shell(options.close_timeout_s)
        term.follow()

    async def release(self, entry: OutputSink[Terminal]) -> None:
        """Stop following the process (its reader, its socket); the session keeps it. The
        release line is not typed: the ref's next owner still has to read the ring. A
        runner's process: its route dropped (`RunnerProcess.release`); the runner keeps
        it."""
        term = entry.handle
        if isinstance(term, Terminal):
            await term.close()
        elif isinstance(term, RunnerProcess):
            await term.release()

    async def detach(self) -> None:
        """Close the runner's link (its processes live on in the runner), then release
        the clients; the sandbox stays (no close of this client deletes it)."""
        session = self.session
        runner, session._runner = session._runner, None

        async def forget() -> None:
            session._create_attempted = False
            await session._client.close()

        await runner_link.shut_down(runner, forget)
