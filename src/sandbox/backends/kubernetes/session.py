"""The `kubernetes` backend: commands and PTYs in a pod, through pods/exec WebSockets.

A session either creates a pod from an `image` (deleted on close: graceful, then
forced) or attaches to a running `pod` (left running). Every process is an exec under
the toolkit's wrapper; its socket is read by the event loop (no thread); its exit
comes from the stream's final Status; its tree is killed by a second exec. Files go
through exec too. The parts live beside this module (see the package docstring).
"""

from __future__ import annotations

import asyncio
import logging
import posixpath
from collections.abc import Mapping, Sequence
from typing import Any, cast

from ...backend import (
    BaseSandboxSession,
    CommandCheck,
    CommandSpec,
    ExecCapture,
    OneShotProcess,
    OutputSink,
    ShellFileOps,
    ShellWorkspace,
    check_env,
    check_seconds,
    check_str,
    durable_session_id,
)
from ...errors import (
    CredentialsMissingError,
    InvalidArgumentError,
    SessionGoneError,
    WorkdirError,
)
from ..toolkit import (
    RunnerProcess,
    check_limits,
    refuse_renamed,
    spawn_through_runner,
    start_one_shot,
)
from . import bounds, durable, execs, pods, scripts
from .client import PROTOCOLS, KubeClient
from .config import Cluster, load_cluster
from .execs import KubeProcess, Target, run_control
from .files import KubernetesFiles, PodFiles
from .limits import container_resources
from .runner_link import PodRunner

logger = logging.getLogger("sandbox.kubernetes")

DEFAULT_TERM = "xterm-256color"


# An entry's handle: an exec of its own, or a process the runner keeps.
Handle = KubeProcess | RunnerProcess


class KubernetesSession(BaseSandboxSession[Handle]):
    """Runs commands in a Kubernetes pod.

    Exactly one of:
    - `image`: create a pod of this image (label `sandbox.session`, `restartPolicy:
      Never`, kept alive by a shell), wait for it by watch within `create_timeout_s`,
      delete it on close (unless `keep=True`);
    - `pod`: attach to this running pod (its `container`, default the first), left
      running on close.

    Credentials as every Kubernetes tool finds them (`kubeconfig=`, `KUBECONFIG`,
    ~/.kube/config, exec plugins, client certificates, or the in-cluster service
    account), with `context` and `namespace` (default: the context's, else
    "default"). `workdir` (default /workspace) is the created container's working
    directory and where relative paths point; file paths must stay inside it.
    Created pods take `resources` (the container's `resources` object),
    `runtime_class`, `node_selector`, `service_account`, `security_context`,
    `pod_security_context`, `labels`, `image_pull_policy`, `name_prefix`,
    `keepalive_command`, `delete_grace_s`, and the common limits `memory_limit_bytes`
    and `cpu_limit` (the container's `resources.limits`; `process_limit` is refused:
    no per-pod field). Also `env` (added to every command),
    `terminate_grace_s` (SIGTERM to SIGKILL), `call_timeout_s` (bound on each API call
    that is not a stream), `protocols` (the channel
    protocols offered, best first: default v5 then v4).
    `runner=True`: processes and commands go through the runner (docs/runner.md), put
    into the pod at start by an exec with stdin (checked by sha256) in `runner_dir`
    (default: `$SANDBOX_RUNNER_DIR`, else the container's `$TMPDIR`, else /tmp) and
    reached by one exec of `connect --start`: a frame per start instead of an exec,
    stdin open or closed, whole-tree kills without a script, and processes that outlive
    their client (durable sessions reattach them). Plus the base session's.
    """

    backend_name = "kubernetes"

    def __init__(
        self,
        *,
        kubeconfig: str | None = None,
        context: str | None = None,
        namespace: str | None = None,
        image: str | None = None,
        pod: str | None = None,
        container: str | None = None,
        workdir: str = "/workspace",
        env: Mapping[str, str] | None = None,
        resources: Mapping[str, Any] | None = None,
        runtime_class: str | None = None,
        node_selector: Mapping[str, str] | None = None,
        service_account: str | None = None,
        security_context: Mapping[str, Any] | None = None,
        pod_security_context: Mapping[str, Any] | None = None,
        labels: Mapping[str, str] | None = None,
        image_pull_policy: str | None = None,
        name_prefix: str = "sandbox",
        keepalive_command: Sequence[str] = tuple(scripts.KEEPALIVE),
        keep: bool = False,
        create_timeout_s: float = bounds.DEFAULT_START_TIMEOUT_S,
        call_timeout_s: float = bounds.DEFAULT_API_TIMEOUT_S,
        terminate_grace_s: float = 1.0,
        delete_grace_s: int = 2,
        protocols: Sequence[str] = PROTOCOLS,
        memory_limit_bytes: int | None = None,
        process_limit: int | None = None,
        cpu_limit: float | None = None,
        runner: bool = False,
        runner_dir: str | None = None,
        **options: Any,
    ) -> None:
        refuse_renamed(type(self), options)
        super().__init__(**options)
        if (image is None) == (pod is None):
            raise InvalidArgumentError(
                "the kubernetes backend needs exactly one of image= (create a pod) "
                "or pod= (attach to a running one)"
            )
        for name, value in (
            ("kubeconfig", kubeconfig),
            ("context", context),
            ("namespace", namespace),
            ("image", image),
            ("pod", pod),
            ("container", container),
            ("runtime_class", runtime_class),
            ("service_account", service_account),
            ("image_pull_policy", image_pull_policy),
            ("runner_dir", runner_dir),
        ):
            check_str(name, value)
        check_str("workdir", workdir, allow_none=False)
        check_str("name_prefix", name_prefix, allow_none=False)
        if not workdir.startswith("/"):
            raise InvalidArgumentError(f"workdir must be an absolute path, not {workdir!r}")
        if runner_dir is not None and not runner_dir.startswith("/"):
            raise InvalidArgumentError(f"runner_dir must be an absolute path, not {runner_dir!r}")
        if image is not None and container is not None:
            raise InvalidArgumentError("container= names a container of an attached pod=")
        keepalive = list(keepalive_command)
        if not keepalive or not all(isinstance(a, str) and a for a in keepalive):
            raise InvalidArgumentError("keepalive_command must be a non-empty list of str")
        offered = tuple(protocols)
        if not offered or not set(offered) <= set(PROTOCOLS):
            raise InvalidArgumentError(f"protocols must be among {', '.join(PROTOCOLS)}")
        if isinstance(delete_grace_s, bool) or not isinstance(delete_grace_s, int):
            raise InvalidArgumentError("delete_grace_s must be an int of seconds")
        start_timeout = check_seconds("create_timeout_s", create_timeout_s)
        timeout = check_seconds("call_timeout_s", call_timeout_s)
        grace = check_seconds("terminate_grace_s", terminate_grace_s, allow_zero=True)
        assert start_timeout is not None and timeout is not None and grace is not None
        self.image = image
        self.pod_name = pod
        self.namespace = namespace
        self.terminate_grace_s = grace
        self._kubeconfig = kubeconfig
        self._context = context
        self._container = container
        self._workdir = posixpath.normpath(workdir)
        self._env = dict(check_env(env) or {})
        limits = check_limits(
            memory_limit_bytes=memory_limit_bytes,
            process_limit=process_limit,
            cpu_limit=cpu_limit,
        )
        self._pod_options = pods.PodOptions(
            workdir=self._workdir,
            name_prefix=name_prefix,
            resources=container_resources(limits, resources, attach=pod is not None),
            runtime_class=runtime_class,
            node_selector=node_selector,
            service_account=service_account,
            security_context=security_context,
            pod_security_context=pod_security_context,
            labels=dict(labels or {}),
            image_pull_policy=image_pull_policy,
            grace_period_s=max(0, delete_grace_s),
            keepalive=keepalive,
        )
        self._keep_pod = bool(keep)
        self._start_timeout = start_timeout
        self._api_timeout = timeout
        self._protocols = offered
        self._client: KubeClient | None = None
        self._created: str | None = None
        self._target: Target | None = None
        # What a durable ref keeps (`durable`): the pod's uid, the kubeconfig path(s)
        # and the context loaded at start.
        self._pod_uid: str | None = None
        self._kubeconfig_loaded: str | None = kubeconfig
        self._context_loaded: str | None = context
        # A resume attaches only to the pod with this uid (the ref's), and only on the
        # API server the ref was made against unless the caller named a kubeconfig or
        # context (`durable.check_server`); it reads the labels of the pod it found.
        self._expected_uid: str | None = None
        self._expected_server: tuple[str, str | None, str | None] | None = None
        self._pod_labels: dict[str, Any] = {}
        self._server: str | None = None
        self._use_runner = bool(runner)
        self._runner_dir = runner_dir
        self._runner: PodRunner | None = None

    @property
    def workdir(self) -> str:
        """Where commands start and relative paths point."""
        return self._workdir

    @property
    def session_label(self) -> str:
        """The value of the `sandbox.session` label on a created pod: the session's id
        (`durable_session_id`), which a resume checks before it takes on the pod's
        deletion."""
        return durable_session_id(self)

    # ---- lifecycle -----------------------------------------------------------------

    async def _start_backend(self) -> None:
        """Load the credentials, create (or find) the pod, wait for it, probe an exec."""
        self._created = None
        self._target = None
        try:
            # An exec credential plugin may hang (a login that never completes).
            async with asyncio.timeout(bounds.CONFIG_TIMEOUT_S):
                cluster: Cluster = await load_cluster(
                    self._kubeconfig, self._context, self.namespace
                )
        except TimeoutError:
            raise CredentialsMissingError(
                f"the Kubernetes credentials were not ready within {bounds.CONFIG_TIMEOUT_S:g} s "
                "(an exec credential plugin did not finish)"
            ) from None
        durable.check_server(self, cluster.server)
        self.namespace = cluster.namespace
        self._server = cluster.server
        self._kubeconfig_loaded, self._context_loaded = cluster.kubeconfig, cluster.context
        self._client = client = KubeClient(
            cluster, api_timeout=self._api_timeout, protocols=self._protocols
        )
        if self.image is not None:
            name = pods.new_pod_name(self._pod_options.name_prefix)
            manifest = pods.pod_manifest(name, self.session_label, self.image, self._pod_options)
            self._created = name  # from now on `_stop_backend` deletes it, by name
            self.pod_name = name
            await pods.create_pod(client, cluster.namespace, manifest)
            running = await pods.wait_running(
                client, cluster.namespace, name, pods.CONTAINER_NAME, self._start_timeout
            )
            self._pod_uid = pods.pod_uid(running)
            self._target = Target(cluster.namespace, name, pods.CONTAINER_NAME, None)
        else:
            assert self.pod_name is not None
            found, container = await pods.existing_pod(
                client, cluster.namespace, self.pod_name, self._container
            )
            self._pod_uid = pods.pod_uid(found)
            labels = (
                (found.get("metadata") or {}).get("labels") if isinstance(found, dict) else None
            )
            self._pod_labels = dict(labels) if isinstance(labels, dict) else {}
            if self._expected_uid is not None and self._pod_uid != self._expected_uid:
                raise SessionGoneError(
                    f"the pod {self.pod_name!r} was deleted and made again (another uid): "
                    "the files and processes of the session are gone"
                )
            own = pods.container_workdir(found, container)
            cwd = None if own and posixpath.normpath(own) == self._workdir else self._workdir
            self._target = Target(cluster.namespace, self.pod_name, container, cwd)
        code, output = await run_control(
            client,
            self._target,
            scripts.prelude_argv(["sh", "-c", ":"], cwd=self._target.cwd),
            "reach the pod",
        )
        if code != 0:
            raise WorkdirError(
                f"the workdir {self._workdir!r} is not usable in the pod (exit {code}): "
                + output.decode("utf-8", "replace").strip()[:200],
                cwd=self._workdir,
            )
        if self._use_runner:
            self._runner = await PodRunner.start(
                self._client, self._target, self._runner_dir, self._env
            )

    async def _stop_backend(self) -> None:
        """Delete a created pod (graceful, then forced; by name, so one whose create was
        cut short goes too), close the connections."""
        client = self._client
        if client is None:
            return
        try:
            if self._runner is not None:
                runner, self._runner = self._runner, None
                await runner.aclose()
            if self._created is not None and not self._keep_pod:
                assert self.namespace is not None
                await pods.delete_pod(
                    client, self.namespace, self._created, self._pod_options.grace_period_s
                )
                self._created = None
        finally:
            await client.close()

    # ---- helpers -------------------------------------------------------------------

    def _require(self) -> tuple[KubeClient, Target]:
        assert self._client is not None and self._target is not None
        return self._client, self._target

    def _cwd(self, cwd: str | None) -> str | None:
        # Relative stays relative: every exec starts in the workspace.
        return None if cwd is None else posixpath.normpath(cwd)

    def _checked(
        self, spec: CommandSpec, *, announce: bool
    ) -> tuple[Sequence[str], CommandCheck | None]:
        check = CommandCheck.needed(spec, cwd=self._cwd(spec.cwd))
        if check is None:
            return spec.argv, None
        return check.argv(spec.argv, announce=announce), check

    def _environment(self, spec: CommandSpec, *, tty: bool) -> dict[str, str]:
        env = {**self._env, **(spec.env or {})}
        if tty:
            env.setdefault("TERM", DEFAULT_TERM)
        return env

    # ---- commands ------------------------------------------------------------------

    async def _start_exec(self, spec: CommandSpec, capture: ExecCapture) -> OneShotProcess:
        """One exec on pipes, stdout and stderr apart, straight into the capture; the
        base session waits, times out and kills the tagged tree."""
        if self._runner is not None:
            return await start_one_shot(
                self._runner.client,
                spec,
                capture,
                env=self._runner.environment(spec.env, tty=False, term=DEFAULT_TERM),
                cwd=self._runner.cwd(spec.cwd, self._workdir),
            )
        client, target = self._require()
        argv, capture.check = self._checked(spec, announce=False)
        return await execs.start_command(
            client,
            target,
            argv,
            capture,
            env=self._environment(spec, tty=False),
            grace_s=self.terminate_grace_s,
        )

    async def _spawn_process(self, entry: OutputSink[Handle]) -> None:
        """An exec whose socket feeds the entry (`execs.spawn`: open stdin needs v5), or
        a process of the runner; either handle is a `Process`, which the base session's
        hooks write to, resize, interrupt and end the input of."""
        spec = entry.spec
        if self._runner is not None:
            await spawn_through_runner(
                self._runner.client,
                cast(OutputSink[RunnerProcess], entry),
                env=self._runner.environment(spec.command.env, tty=spec.tty, term=DEFAULT_TERM),
                cwd=self._runner.cwd(spec.command.cwd, self._workdir),
                grace_s=self.terminate_grace_s,
            )
            return
        client, target = self._require()
        argv, check = self._checked(spec.command, announce=True)
        await execs.spawn(
            client,
            target,
            cast(OutputSink[KubeProcess], entry),
            argv,
            check,
            env=self._environment(spec.command, tty=spec.tty),
            grace_s=self.terminate_grace_s,
        )

    # Both handles keep a process's stdin open and end it (an exec's under v5 only:
    # `execs.spawn` refuses `stdin=True` under v4 before anything runs).
    _stdin_stays_open = True

    async def _terminate_pty_entry(self, entry: OutputSink[Handle]) -> None:
        """Kill the tree (grace, then SIGKILL) by a second exec, close the socket; when
        the session's own pod is deleted next, only the socket is closed. Through the
        runner: its tree kill, or, when the pod goes next, only stop following it."""
        handle = entry.handle
        if handle is None:
            return
        if entry.sandbox_stopping and self._created is not None and not self._keep_pod:
            # The pod's deletion ends every exec's process, and the runner with every
            # tree it keeps.
            await handle.release()
        else:
            await handle.kill()

    # ---- capabilities (`sandbox.backend.Capability`: each made with the session) ----

    _file_access = KubernetesFiles
    _workspace_access = ShellWorkspace
    _durability = durable.KubernetesDurability

    # ---- what the capabilities use ---------------------------------------------------

    def _files(self) -> PodFiles:
        client, target = self._require()
        return PodFiles(client, target, self._workdir)

    async def _shell_ops(self) -> ShellFileOps:
        """The shell file operations in this sandbox's workspace."""
        # Commands start in the workdir (the prelude enters it): the script finds it as
        # "." (the stand-in plays it with a folder of its own).
        return ShellFileOps(self.exec, self._workdir, shell_root=".")
