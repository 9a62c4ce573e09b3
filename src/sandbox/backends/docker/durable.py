"""Detach and resume for `docker`: the container outlives the client, exec streams do not
(the runner's processes do).

With the runner (the default where this install has it and the container takes it:
`runner=None`, or `runner=True`) the runner inside the container keeps every process,
and its latest output in a ring (docs/runner.md), so `keeps_processes` is True for such
a session:
`detach()` stops following each process and closes the link, the ref lists each by its
runner id, and `resume_session` reattaches each from the output position the client had
reached (what it printed meanwhile first, the omission marker past the ring, its exit
code if it ended). The ref's `runner` option says what the session used, not what it
was asked: True makes the resume require the runner (its processes are there), False
(a per-exec session, `runner=False` or auto's fallback; a ref without it, made before
the runner, too) keeps the resume on the per-exec path.

Without it, the Engine API has no call that attaches to a running exec's streams
again (an exec is started attached once: `POST /exec/{id}/start`;
`/containers/{id}/attach` reaches the container's main process only), so
`keeps_processes` is False:

- `detach()` kills each process's tree with the toolkit's kill script, as
  `pty_terminate` does, and the ref lists it as ended with its exit code; the container
  keeps running, and a container the session created is removed by the resumed
  session's close (unless `keep`).

- After a crash (the client SIGKILLed), the engine keeps the exec processes running
  with nobody reading their output (a full pipe or terminal then blocks them); the ref
  file lists their toolkit tags, and `resume_session` kills those trees by tag (the
  same kill script) and reports each as ended, with a note.

The lease is a file in the container (`sandbox.backends.toolkit.lease`: one exec per read
or swap, since the engine has no owner notion).

What a ref says is checked, even when its seal is good (a program may build one from
data it does not control): only the options of `REF_OPTIONS` are taken from it; the
engine comes from the caller's `api_url=`/`client=` or the environment (DOCKER_HOST, else
the local socket), and a ref made against another engine is refused unless the caller
names it; a container the ref says the session created is removed by the resumed close
only if the engine shows it carries our `sandbox.session` label with the ref's session id.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from ...backend import SessionRef, durable_session_id
from ...errors import InvalidArgumentError, ProviderError, RefNotTrustedError, SessionGoneError
from ...runner import RunnerClient
from ..toolkit import (
    RunnerDurability,
    ScriptLease,
    grace_ticks,
    parse_lease,
    running_tags,
    taken_from_ref,
)
from .container import LABEL_BACKEND, LABEL_SESSION, disconnect
from .errors import is_not_found
from .execs import DockerExec, run_kill_script

# `DockerSession`, untyped here: its module imports this one, and an import back (even a
# type-only one) would close a cycle (tests/meta/test_layering.py).
DockerSession = Any

REF_OPTIONS = ("terminate_grace_s", "detach_keys")
# The options a resume takes from a ref: none of them names an engine, loads code or
# holds a credential.
TAKEN_FROM_REF = taken_from_ref(
    "terminate_grace_s",
    "detach_keys",
    "workdir",
    "user",
    "call_timeout_s",
    "api_version",
    "runner",
)
# The docker SDK's default engine (`docker.constants.DEFAULT_UNIX_SOCKET`), as the CLI
# spells it.
DEFAULT_ENGINE = "unix:///var/run/docker.sock"
LEASE_TIMEOUT_S = 30.0


def engine_url(api_url: str | None) -> str:
    """The engine a session with this `api_url` talks to: it, else DOCKER_HOST, else the
    local socket (`unix://` however it was spelled)."""
    url = api_url or os.environ.get("DOCKER_HOST") or DEFAULT_ENGINE
    return "unix://" + url.removeprefix("http+unix://") if url.startswith("http+unix://") else url


class ContainerLease(ScriptLease):
    """The session's lease in its container (a `sandbox.durable.lease.LeaseStore`): the
    lease script run by an exec."""

    async def run(self, argv: list[str]) -> str | None:
        """One exec of the lease script; its stdout is the value."""
        engine, options = self.session._require_engine()
        output = bytearray()
        proc = DockerExec(
            engine,
            options,
            argv,
            tty=False,
            wrap=False,
            on_output=lambda stream, data: output.extend(data) if stream == 1 else None,
        )
        try:
            async with asyncio.timeout(LEASE_TIMEOUT_S):
                await proc.start()
                await proc.wait_eof()
                await proc.wait_ended()
        except TimeoutError:
            raise ProviderError(
                "the Docker engine did not answer the lease check in time", retryable=True
            ) from None
        finally:
            await proc.aclose()
        return parse_lease(output.decode("utf-8", "replace"), proc.exit_code, "docker")


class DockerDurability(RunnerDurability):
    """The docker backend's durable sessions (the module docstring says what outlives
    the client), over the session it was made with."""

    not_reattached = (
        "the Docker engine cannot reattach an exec's output stream: the process the "
        "earlier client started was killed at resume"
    )

    @property
    def keeps_processes(self) -> bool:
        """True for a session with the runner (it keeps the processes), else False;
        before start, what its options would pick."""
        return bool(self.session._runner_choice.uses)

    def ref_sandbox(self) -> dict[str, Any]:
        """The container, whether the session made it (then a close removes it), and the
        engine it is on (a URL without credentials in it; none for a caller's `client=`)."""
        session = self.session
        data: dict[str, Any] = {
            "container_id": session._container_id,
            "created_name": session._created_name,
            "keep": session._keep_container,
        }
        if session._docker_options.client is None:
            engine = engine_url(session._docker_options.api_url)
            if "@" not in engine:
                data["engine"] = engine
        return data

    def ref_options(self, base: dict[str, Any]) -> dict[str, Any]:
        """The base options plus this backend's non-secret ones (no `env`, no client; an
        engine URL only without credentials in it)."""
        session = self.session
        given = session._docker_options
        options = dict(base)
        options.update({name: getattr(session, name, None) for name in REF_OPTIONS})
        options["detach_keys"] = given.detach_keys
        options["workdir"] = session._workdir
        options["user"] = given.user or None
        options["call_timeout_s"] = given.call_timeout_s
        options["api_version"] = given.api_version
        # What the session used, not what it asked (auto may have fallen back): a resume
        # then takes the same path, the runner's processes being only in the runner.
        options["runner"] = bool(session._runner_choice.uses)
        return options

    def ref_direct_process(self, handle: DockerExec) -> dict[str, Any]:
        """An exec: its id and its toolkit tag (the tag finds its tree after a crash)."""
        return {"tag": handle.tag, "exec_id": handle.exec_id}

    @classmethod
    def options_from_ref(cls, ref: SessionRef) -> dict[str, Any]:
        """Reopen as an attached session (`container=`) of the ref's container, with the
        ref's options of `TAKEN_FROM_REF` only (never an engine: see `check_engine`)."""
        options = {k: v for k, v in ref.options.items() if k in TAKEN_FROM_REF and v is not None}
        container = ref.sandbox.get("container_id")
        if not isinstance(container, str) or not container:
            raise SessionGoneError("the docker ref names no container")
        options["container"] = container
        # A ref without it was made before the runner: its session was per-exec.
        options.setdefault("runner", False)
        return options

    def lease_store(self) -> ContainerLease:
        """The lease (`ContainerLease`)."""
        return ContainerLease(self.session, durable_session_id(self.session))

    def check_engine(self, ref: SessionRef) -> None:
        """Refuse a ref made against another engine than the one this client would use,
        unless the caller named the engine (`api_url=` or `client=`)."""
        given = self.session._docker_options
        if given.api_url is not None or given.client is not None:
            return
        recorded = ref.sandbox.get("engine")
        if recorded is None:
            return
        used = engine_url(None)
        if not isinstance(recorded, str) or engine_url(recorded) != used:
            raise InvalidArgumentError(
                f"the docker ref was made against the engine {recorded!r}; this client would "
                f"use {used!r} (DOCKER_HOST or the local socket); pass api_url={recorded!r} "
                "to resume it there"
            )

    async def _check_created(self, ref: SessionRef, name: str) -> None:
        """The ref says the session created the container `name`: the engine must show it
        is the session's container, labelled by this library with the ref's session id."""
        session = self.session
        engine, _ = session._require_engine()
        try:
            info = await engine.call(
                "look at the container's labels", engine.api.inspect_container, name
            )
        except ProviderError as exc:
            if not is_not_found(exc):
                raise
            info = {}
        labels = (info.get("Config") or {}).get("Labels") or {}
        if (
            info.get("Id") != session._container_id
            or labels.get(LABEL_BACKEND) != "docker"
            or labels.get(LABEL_SESSION) != ref.session_id
        ):
            raise RefNotTrustedError(
                f"the docker ref says its session created the container {name!r}, but the "
                f"engine shows no {LABEL_SESSION} label of session {ref.session_id} on the "
                "container it names: the library did not make it, so it is not resumed (and "
                "not removed)"
            )

    async def resume(self, ref: SessionRef) -> None:
        """Attach to the container (missing or stopped: `SessionGoneError`), take on its
        removal if the first session made it (checked with the engine: `_check_created`),
        kill the trees a dead client left."""
        session = self.session
        self.check_engine(ref)
        try:
            await session._start_backend()
        except ProviderError as exc:
            if is_not_found(exc) or "is not running" in str(exc):
                raise SessionGoneError(f"the docker container of this ref is gone: {exc}") from None
            raise
        created = ref.sandbox.get("created_name")
        if isinstance(created, str):
            await self._check_created(ref, created)
            session._created_name = created
        session._keep_container = bool(ref.sandbox.get("keep"))
        tags = running_tags(ref.processes)
        if tags:
            engine, options = session._require_engine()
            await run_kill_script(engine, options, tags, "term", grace_ticks(0))

    def kill_grace_s(self) -> float:
        """The session's `terminate_grace_s`."""
        return float(self.session.terminate_grace_s)

    def runner_client(self) -> RunnerClient | None:
        """The link to the runner in the container, while the session has one."""
        runner = self.session._runner
        return None if runner is None else runner.client

    async def detach(self) -> None:
        """Close the engine connection; the container stays."""
        session = self.session
        engine = session._engine
        if engine is None:
            return
        # The runner's link is closed: its processes live on in the runner.
        runner, session._runner = session._runner, None
        await disconnect(engine, runner, session._killer, remove=None)
