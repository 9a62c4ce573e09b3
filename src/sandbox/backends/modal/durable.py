"""Detach and resume for `modal`: the sandbox outlives the client, exec streams do not
(the runner's processes do).

With the runner (`runner=True`, or `runner=None` where it started) the runner inside the
sandbox keeps every process and its latest output in a ring (docs/runner.md), so
`keeps_processes` is True for such a session: `detach()` stops following each process
and ends the link's exec, the ref lists each by its runner id (and says `runner: true`
in its options), and `resume_session` reaches the same runner through a new exec
(`connect`: no second runner, no second upload when the digest matches) and reattaches
each process from the output position the client had reached (what it printed
meanwhile first, the omission marker past the ring, its exit code if it ended).

Without the runner: facts (modal==the pinned SDK): `Sandbox.from_id(sandbox_id)`
attaches to a running sandbox (`modal/sandbox/_sandbox.py`); an exec's
`ContainerProcess` is built by `Sandbox.exec` from the exec id the server returns and
read through the client's own command-router stream (`modal/container_process.py`);
the SDK has no call that finds a process by id again. So `keeps_processes` is False:
`detach()` kills each tree by its toolkit tag (as `pty_terminate`), and after a crash
`resume_session` kills the trees the ref file lists by their tags, reporting each as
ended with a note. A sandbox that is
gone (`NotFoundError` from `from_id`) is `SessionGoneError`.

The lease is a file in the sandbox (`sandbox.backends.toolkit.lease`), one exec each.

A ref says whether its session created the sandbox (`created`) and whether the close
terminates it (`keep`). A created sandbox carries our `sandbox.session` tag with the
durable session's id (`Sandbox.create(tags=...)`). Before a resumed session takes on
terminating the sandbox, `check_created` reads its tags back (`Sandbox.get_tags`):
without that tag and the ref's session id the resume fails (`RefNotTrustedError`) and
nothing is terminated: the library ends only a sandbox it shows it made, whatever a
ref claims.
"""

from __future__ import annotations

import asyncio
from typing import Any

from ...backend import SessionRef, durable_session_id
from ...errors import ProviderError, SessionGoneError
from ...runner import RunnerClient
from ..toolkit import (
    RunnerDurability,
    ScriptLease,
    attach_or_gone,
    check_mark,
    check_tag,
    parse_lease,
    taken_from_ref,
)
from .commands import Command, read_stream
from .errors import SANDBOX_GONE, SDK_ERRORS
from .lifecycle import quietly

# `ModalSession`, untyped here: its module imports this one, and an import back (even a
# type-only one) would close a cycle (tests/meta/test_layering.py).
ModalSession = Any

REF_OPTIONS = (
    "app_name",
    "workdir",
    "sandbox_timeout_s",
    "terminate_grace_s",
    "create_timeout_s",
)
NOT_REATTACHED = (
    "Modal's SDK cannot reattach an exec's output stream: the process the earlier "
    "client started was killed at resume"
)
LEASE_TIMEOUT_S = 30.0
# The options a resume takes from a ref: never a token, a client or an SDK.
TAKEN_FROM_REF = taken_from_ref(*REF_OPTIONS, "call_timeout_s", "term", "runner")


class SandboxLease(ScriptLease):
    """The lease in the sandbox (a `LeaseStore`): the lease script run by an exec."""

    async def run(self, argv: list[str]) -> str | None:
        """One exec of the lease script; its stdout is the value."""
        sandbox = self.session._commands.require_sandbox()
        output = bytearray()
        try:
            async with asyncio.timeout(LEASE_TIMEOUT_S):
                process = await sandbox.exec.aio(*argv, text=False)
                await read_stream(process.stdout, output.extend)
                code = await process.wait.aio()
        except TimeoutError:
            raise ProviderError(
                "Modal did not answer the lease check in time", retryable=True
            ) from None
        except SDK_ERRORS as exc:
            raise self.session._errors.map("check the session's lease", exc) from None
        return parse_lease(output.decode("utf-8", "replace"), code, "modal")


class ModalDurability(RunnerDurability):
    """The modal backend's durable sessions (the module docstring says what outlives
    the client), over the session it was made with."""

    not_reattached = NOT_REATTACHED

    @property
    def keeps_processes(self) -> bool:
        """True for a session whose processes the runner keeps, else False."""
        return bool(self.session._runner_choice.uses)

    def ref_sandbox(self) -> dict[str, Any]:
        """The sandbox id, whether the session created it, and whether the close
        terminates it."""
        session = self.session
        return {"sandbox_id": session.sandbox_id, "created": session._created, "keep": session.keep}

    def ref_options(self, base: dict[str, Any]) -> dict[str, Any]:
        """The base options plus the non-secret ones (never a token, `env` or `client`)."""
        session = self.session
        options = dict(base)
        options.update({name: getattr(session, name) for name in REF_OPTIONS})
        options["call_timeout_s"] = session._errors.call_timeout_s
        options["term"] = session._commands._term
        # What the session ended up with (`runner=None` may have fallen back): a resume
        # reaches the same runner, or keeps the per-exec path.
        options["runner"] = session._runner_choice.uses
        return options

    def ref_direct_process(self, handle: Any) -> dict[str, Any]:
        """An exec of the per-exec path: the toolkit tag that finds its tree."""
        return {"tag": handle.tag}

    def kill_grace_s(self) -> float:
        """The session's `terminate_grace_s`."""
        return float(self.session.terminate_grace_s)

    def runner_client(self) -> RunnerClient | None:
        """The link to the runner in the sandbox, while the session has one."""
        runner = self.session._runner
        return None if runner is None else runner.client

    @classmethod
    def options_from_ref(cls, ref: SessionRef) -> dict[str, Any]:
        """Reopen attached (`sandbox_id=`), terminated on close unless the first was kept."""
        sandbox_id = ref.sandbox.get("sandbox_id")
        if not isinstance(sandbox_id, str) or not sandbox_id:
            raise SessionGoneError("the modal ref names no sandbox")
        options = {k: v for k, v in ref.options.items() if k in TAKEN_FROM_REF and v is not None}
        options["sandbox_id"] = sandbox_id
        options["keep"] = bool(ref.sandbox.get("keep"))
        return options

    def lease_store(self) -> SandboxLease:
        """The lease (`SandboxLease`)."""
        return SandboxLease(self.session, durable_session_id(self.session))

    async def check_created(self, ref: SessionRef) -> None:
        """The resumed close would terminate the sandbox: Modal must show our
        `sandbox.session` tag with the ref's session id on it (`Sandbox.get_tags`), else
        `RefNotTrustedError` (the resume then only detaches: nothing is terminated)."""
        session = self.session
        sandbox = session._commands.require_sandbox()
        tags = await session._errors.call("read the sandbox's tags", sandbox.get_tags.aio)
        check_mark(
            ref,
            tags,
            backend="modal",
            what=f"the sandbox {session.sandbox_id!r}",
            kind="tag",
            ending="terminates",
        )

    async def resume(self, ref: SessionRef) -> None:
        """`Sandbox.from_id`; connect to the runner if the ref's session had it (once the
        sandbox is known to run); then kill the trees a dead client left (by tag)."""
        session = self.session
        session._runner_deferred = True
        try:
            await attach_or_gone(session, "modal", gone=SANDBOX_GONE)
        finally:
            session._runner_deferred = False
        # `from_id` also finds a sandbox that finished (modal/sandbox/_sandbox.py): `poll`
        # says which (None while it runs).
        sandbox = session._commands.require_sandbox()
        if await session._errors.call("check the sandbox", sandbox.poll.aio) is not None:
            raise SessionGoneError("the modal sandbox of this ref has finished")
        if not session.keep:
            await self.check_created(ref)
        session._created = ref.sandbox.get("created") is True
        await session._start_runner()
        commands = session._commands
        for process in ref.processes:
            tag = process.handle.get("tag")
            if not process.running or not isinstance(tag, str):
                continue
            try:
                check_tag(tag)
            except ValueError:
                continue
            # A stand-in for the exec's answer: the command is known to have started.
            stand_in = Command(commands, tty=process.tty, keep=session.keep, tag=tag, process=True)
            await commands.control(stand_in, "kill")

    async def detach(self) -> None:
        """Close the runner's link (its processes live on in the runner), detach from
        the sandbox (it keeps running) and close the client we opened."""
        session = self.session
        runner, session._runner = session._runner, None
        sandbox, session._sandbox = session._sandbox, None
        session._commands.sandbox = None
        session._create_name = None
        try:
            if runner is not None:
                await runner.aclose()
            if sandbox is not None:
                await quietly(session._errors, sandbox.detach.aio(), "detaching from the sandbox")
        finally:
            client, session._client = session._client, None
            if session._owns_client and client is not None:
                session._owns_client = False
                await quietly(session._errors, client.close.aio(), "closing the Modal client")
