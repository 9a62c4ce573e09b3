"""Detach and resume for `kubernetes`: the pod outlives the client, exec streams do not
come back (the runner's processes do).

With the runner (the default where this install has it and the pod takes it:
`runner=None`, or `runner=True`) the runner inside the pod keeps every process, and its
latest output in a ring (docs/runner.md), so `keeps_processes` is True for such a
session: `detach()`
stops following each process and closes the link (the exec that carried it ends; the
runner does not), the ref lists each by its runner id, and `resume_session` reaches the
same runner through a new exec and reattaches each from the output position the client
had reached (what it printed meanwhile first, the omission marker past the ring, its
exit code if it ended). The pod's deletion ends the runner with everything it keeps.
The ref's `runner` option says what the session used, not what it was asked: True
makes the resume require the runner (its processes are there), False (a per-exec
session, `runner=False` or auto's fallback; a ref without it, made before the runner,
too) keeps the resume on the per-exec path.

Without the runner, no API call reattaches to a running exec: pods/exec starts a new
process each time, pods/attach reaches the container's main process only, and the CRI
has no exec id a client could name again. So `keeps_processes` is False. What happens
to an exec's process when its client goes (docs/providers.md, "Kubernetes", cites the files):

- The process is not killed. containerd's CRI plugin waits for its exit
  (`execInternal` kills only when its context ends, and the request context of a
  hijacked (upgraded) connection lasts until the handler returns); the stdin copy ends:
  a pipes exec that had stdin gets EOF (`CloseStdin`), a tty exec keeps its terminal
  (stdin is not closed for a tty, so the shim never closes the console: no hangup).
  containerd stops reading its output, and the shim holds its FIFOs open both ways, so
  the process blocks once the FIFO and pipe (or terminal) buffers are full. (CRI-O
  was not checked; nothing below depends on the difference.)
- So `detach()` kills each process's tree by its toolkit tag (a control exec), as
  `pty_terminate` does; the ref lists it as ended with its exit code. After a crash
  (the client SIGKILLed), the ref file lists the tags of the processes still running,
  and `resume_session` kills those trees by tag and reports each as ended, with a note.

The pod is found by namespace and name; its `metadata.uid` is kept in the ref, so a
pod deleted and made again under the same name (a StatefulSet, a script) is not taken
for the ref's: that, a missing pod, or one being deleted or ended, is
`SessionGoneError`. A pod the first session created is deleted by the close of the
session that owns it last (the lease says which); an attached pod is left running.

The lease is a file in the container (`sandbox.backends.toolkit.lease`, one control
exec per read or swap: Kubernetes has no owner notion for a pod's users), under the
container's `$TMPDIR` (else /tmp): every exec of a container shares its environment
(the CRI runs an exec with the container's process spec), so every client finds the
same file.

The ref holds the API server's URL, the kubeconfig path(s) and the context name, never
a token or a client key. A resume takes none of them from the ref (a kubeconfig can
run code, an exec plugin, and names the credentials): they come from the caller
(`kubeconfig=`, `context=`) or the environment (`KUBECONFIG`, ~/.kube/config, in-cluster).
A ref made against another API server than the one they lead to is refused, unless the
caller named the kubeconfig or context (`check_server`). A pod the ref says the session
created is deleted by the resumed close only if it carries our `sandbox.session` label
with the ref's session id (`check_created`).
"""

from __future__ import annotations

import posixpath
from typing import Any

from ...backend import SessionRef, SessionState, durable_session_id
from ...errors import InvalidArgumentError, ProviderError, SessionGoneError
from ...runner import RunnerClient
from ..toolkit import (
    RunnerDurability,
    ScriptLease,
    check_mark,
    grace_ticks,
    kill_script,
    parse_lease,
    running_tags,
    taken_from_ref,
)
from . import bounds
from .execs import KubeProcess, run_control
from .pods import (
    CONTAINER_NAME,
    PodStartError,
    pod_uid,
    pods_path,
    readiness,
)

# `KubernetesSession`, untyped here: its module imports this one, and an import back
# (even a type-only one) would close a cycle (tests/meta/test_layering.py).
KubernetesSession = Any

# The lease value of a closed session (`sandbox.durable.lease`).
CLOSED = "closed"
# `sh -c LEASE_IN_TMP sandbox-lease SCRIPT NAME ARGS...`: the toolkit's lease script run
# on `${TMPDIR:-/tmp}/NAME`, the directory resolved in the container.
LEASE_IN_TMP = 's=$1; f="${TMPDIR:-/tmp}/$2"; shift 2; exec sh -c "$s" sh "$f" "$@"'
# The options a resume takes from a ref: none names a cluster, loads code or credentials
# (never `kubeconfig` or `context`: see the module docstring).
TAKEN_FROM_REF = taken_from_ref(
    "workdir",
    "terminate_grace_s",
    "call_timeout_s",
    "delete_grace_s",
    "protocols",
    "runner",
    "runner_dir",
)


class ServerRefused(InvalidArgumentError):
    """The ref was made against another API server (`check_server`): not a pod gone."""


def check_server(session: KubernetesSession, server: str) -> None:
    """Called by `_start_backend` once the credentials are loaded, before any request:
    refuse a ref made against another API server than `server` (where the caller's or
    the environment's kubeconfig leads), unless the caller named a kubeconfig or
    context."""
    expected = session._expected_server
    given = session._settings
    if expected is None or given.kubeconfig is not None or given.context is not None:
        return
    recorded, kubeconfig, context = expected
    if recorded.rstrip("/") == server.rstrip("/"):
        return
    how = f"kubeconfig={kubeconfig!r}" if kubeconfig else "kubeconfig="
    if context:
        how += f" and context={context!r}"
    raise ServerRefused(
        f"the kubernetes ref was made against the API server {recorded!r}; this client's "
        f"kubeconfig (KUBECONFIG or ~/.kube/config) leads to {server!r}; pass {how} to "
        "resume it there"
    )


def check_pod_uid(session: KubernetesSession) -> None:
    """Called by `_start_backend` once it found the pod to attach to: a resume attaches
    only to the pod with the ref's uid (one made again under the same name is not it)."""
    expected = session._expected_uid
    if expected is not None and session._pod_uid != expected:
        raise SessionGoneError(
            f"the pod {session.pod_name!r} was deleted and made again (another uid): "
            "the files and processes of the session are gone"
        )


class PodLease(ScriptLease):
    """The session's lease in its pod (a `sandbox.durable.lease.LeaseStore`), its file
    named relative to the container's TMPDIR (`LEASE_IN_TMP`)."""

    def __init__(self, session: KubernetesSession, session_id: str) -> None:
        super().__init__(session, session_id)
        self.path = posixpath.basename(self.path)

    async def run(self, argv: list[str]) -> str | None:
        """One control exec of the lease script; its stdout is the value. A failed exec
        into a pod that is gone is `SessionGoneError` (or the closed value at a close)."""
        # The toolkit's `sh -c SCRIPT sh FILE ARGS...`, its FILE named relative to the
        # container's TMPDIR instead.
        assert argv[:2] == ["sh", "-c"] and argv[4] == self.path, argv[:2]
        script, rest = argv[2], argv[5:]
        wrapped = ["sh", "-c", LEASE_IN_TMP, "sandbox-lease", script, self.path, *rest]
        client, target = self.session._require()
        stdout = bytearray()

        def keep(data: bytes) -> bool:
            # stdout alone (the value); bounded like every control exec's output.
            stdout.extend(data[: bounds.MAX_CONTROL_OUTPUT_BYTES - len(stdout)])
            return True

        try:
            code, errors = await run_control(
                client, target, wrapped, "check the session's lease", on_stdout=keep
            )
        except ProviderError as failure:
            try:
                gone = await self._pod_gone()
            except ProviderError:
                gone = False  # the API cannot say either: the exec's error stands
            if not gone:
                raise failure from None
            if self.session.state is SessionState.CLOSING:
                # A close (of a client taken over, whose new owner deleted the pod):
                # nothing is left to claim, so it only lets go.
                return CLOSED
            raise SessionGoneError(
                f"the kubernetes pod {target.pod!r} of this session is gone"
            ) from None
        text = stdout.decode("utf-8", "replace") or errors.decode("utf-8", "replace")
        return parse_lease(text, code, "kubernetes")

    async def _pod_gone(self) -> bool:
        """Whether the session's pod is no more: absent, made again (another uid), being
        deleted or ended (an exec into it fails then)."""
        client, target = self.session._require()
        status, pod = await client.call(
            "GET", pods_path(target.namespace, target.pod), "look at the pod", allow=(404,)
        )
        if status == 404 or pod_uid(pod) != self.session._pod_uid:
            return True
        running, _, _ = readiness(pod, target.container or CONTAINER_NAME)
        return not running


class KubernetesDurability(RunnerDurability):
    """The kubernetes backend's durable sessions (the module docstring says what outlives
    the client), over the session it was made with."""

    not_reattached = (
        "Kubernetes cannot reattach an exec's streams: the process the earlier client "
        "started was killed at resume"
    )

    @property
    def keeps_processes(self) -> bool:
        """True for a session with the runner (it keeps the processes), else False;
        before start, what its options would pick."""
        return bool(self.session._runner_choice.uses)

    def ref_sandbox(self) -> dict[str, Any]:
        """The pod (namespace, name, uid, container), and whether the session created it
        (then the close of its last owner deletes it)."""
        session = self.session
        target = session._target
        return {
            "namespace": session.namespace,
            "pod": session.pod_name,
            "uid": session._pod_uid,
            "container": target.container if target is not None else session._settings.container,
            "created": session._created,
            "keep": session._keep_pod,
            "server": session._server,
        }

    def ref_options(self, base: dict[str, Any]) -> dict[str, Any]:
        """The base options plus this backend's non-secret ones: the kubeconfig path(s)
        loaded and the context (never their contents), no `env`."""
        session = self.session
        given = session._settings
        options = dict(base)
        options.update(
            kubeconfig=session._kubeconfig_loaded,
            context=session._context_loaded,
            workdir=given.workdir,
            terminate_grace_s=session.terminate_grace_s,
            call_timeout_s=given.call_timeout_s,
            delete_grace_s=given.pod_options.grace_period_s,
            protocols=list(given.protocols),
            # What the session used, not what it asked (auto may have fallen back): a
            # resume then takes the same path, the runner's processes being only there.
            runner=bool(session._runner_choice.uses),
            runner_dir=given.runner_dir,
        )
        return options

    def ref_direct_process(self, handle: KubeProcess) -> dict[str, Any]:
        """An exec's toolkit tag (what finds the process's tree after a crash)."""
        return {"tag": handle.tag}

    @classmethod
    def options_from_ref(cls, ref: SessionRef) -> dict[str, Any]:
        """Reopen as an attached session (`pod=`) of the ref's pod, in its namespace, with
        the ref's options of `TAKEN_FROM_REF` only (never `kubeconfig` or `context`)."""
        options = {k: v for k, v in ref.options.items() if k in TAKEN_FROM_REF and v is not None}
        pod = ref.sandbox.get("pod")
        namespace = ref.sandbox.get("namespace")
        if not isinstance(pod, str) or not pod or not isinstance(namespace, str) or not namespace:
            raise SessionGoneError("the kubernetes ref names no pod")
        options["pod"] = pod
        options["namespace"] = namespace
        container = ref.sandbox.get("container")
        if isinstance(container, str) and container:
            options["container"] = container
        if isinstance(options.get("protocols"), list):
            options["protocols"] = tuple(options["protocols"])
        # A ref without it was made before the runner: its session was per-exec.
        options.setdefault("runner", False)
        return options

    def lease_store(self) -> PodLease:
        """The lease (`PodLease`)."""
        return PodLease(self.session, durable_session_id(self.session))

    def check_created(self, ref: SessionRef, name: str) -> None:
        """The ref says the session created the pod `name`: the pod found must carry our
        `sandbox.session` label with the ref's session id."""
        check_mark(
            ref,
            self.session._pod_labels,
            backend="kubernetes",
            what=f"the pod {name!r}",
            keep_hint=False,
        )

    async def resume(self, ref: SessionRef) -> None:
        """Attach to the pod (missing, replaced, being deleted or ended: `SessionGoneError`),
        take on its deletion if the first session created it (checked: `check_created`),
        kill the trees a dead client left."""
        session = self.session
        name = session.pod_name
        uid = ref.sandbox.get("uid")
        # Checked by `_start_backend` as soon as it found the pod (`check_pod_uid`,
        # before its probe).
        session._expected_uid = uid if isinstance(uid, str) and uid else None
        server = ref.sandbox.get("server")
        if isinstance(server, str) and server:
            kubeconfig, context = ref.options.get("kubeconfig"), ref.options.get("context")
            session._expected_server = (
                server,
                kubeconfig if isinstance(kubeconfig, str) else None,
                context if isinstance(context, str) else None,
            )
        try:
            await session._start_backend()
        except ServerRefused:
            raise
        except (InvalidArgumentError, PodStartError) as exc:
            # `existing_pod`: no such pod (404) or container, or a pod not running.
            raise SessionGoneError(
                f"the kubernetes pod {name!r} of this ref is gone: {exc}"
            ) from None
        created = ref.sandbox.get("created")
        if isinstance(created, str) and created == name:
            self.check_created(ref, created)
            session._created = created
        else:
            session._created = None
        session._keep_pod = session._keep_pod or bool(ref.sandbox.get("keep"))
        tags = running_tags(ref.processes)
        if tags:
            client, target = session._require()
            await run_control(
                client,
                target,
                kill_script(tags, ticks=grace_ticks(0)),
                "kill the earlier processes",
            )

    def kill_grace_s(self) -> float:
        """The session's `terminate_grace_s`."""
        return float(self.session.terminate_grace_s)

    def runner_client(self) -> RunnerClient | None:
        """The link to the runner in the pod, while the session has one."""
        runner = self.session._runner
        return None if runner is None else runner.client

    async def detach(self) -> None:
        """Close the link to the runner (its processes live on in it) and the client's
        connections; the pod stays."""
        session = self.session
        try:
            if session._runner is not None:
                runner, session._runner = session._runner, None
                await runner.aclose()
        finally:
            client, session._client = session._client, None
            if client is not None:
                await client.close()
