"""The `kubernetes` backend: commands and PTYs in a pod, through pods/exec WebSockets.

A session either creates a pod from an `image` (deleted on close: graceful, then
forced) or attaches to a running `pod` (left running). Every process is an exec under
the toolkit's wrapper; its socket is read by the event loop (no thread); its exit
comes from the stream's final Status; its tree is killed by a second exec. Files go
through exec too. The parts live beside this module (see the package docstring).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, cast

from ...backend import (
    BaseSandboxSession,
    CommandSpec,
    ExecCapture,
    OneShotProcess,
    OutputSink,
    ShellFileOps,
    ShellWorkspace,
    durable_session_id,
)
from ..toolkit import RunnerChoice, RunnerProcess, RunnerReport, refuse_renamed
from . import bounds, durable, execs, pods, scripts
from .client import PROTOCOLS, KubeClient
from .config import load_cluster_in_time
from .execs import KubeProcess, Target
from .files import KubernetesFiles, PodFiles
from .options import check_options
from .runner_link import PodRunner, choose_runner

# An entry's handle: an exec of its own, or a process the runner keeps.
Handle = KubeProcess | RunnerProcess


class KubernetesSession(RunnerReport, BaseSandboxSession[Handle]):
    """Runs commands in a Kubernetes pod it creates from an `image` or attaches to
    (`pod`), through the runner by default where it can be used, else with an exec per
    process (`runner`: None auto, True required, False never). The options
    are documented, and checked, in `options` (`KubernetesOptions`, `check_options`).
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
        runner: bool | None = None,
        runner_dir: str | None = None,
        **options: Any,
    ) -> None:
        refuse_renamed(type(self), options)
        super().__init__(**options)
        self._settings = settings = check_options(
            kubeconfig=kubeconfig,
            context=context,
            namespace=namespace,
            image=image,
            pod=pod,
            container=container,
            workdir=workdir,
            env=env,
            resources=resources,
            runtime_class=runtime_class,
            node_selector=node_selector,
            service_account=service_account,
            security_context=security_context,
            pod_security_context=pod_security_context,
            labels=labels,
            image_pull_policy=image_pull_policy,
            name_prefix=name_prefix,
            keepalive_command=keepalive_command,
            keep=keep,
            create_timeout_s=create_timeout_s,
            call_timeout_s=call_timeout_s,
            terminate_grace_s=terminate_grace_s,
            delete_grace_s=delete_grace_s,
            protocols=protocols,
            memory_limit_bytes=memory_limit_bytes,
            process_limit=process_limit,
            cpu_limit=cpu_limit,
            runner=runner,
            runner_dir=runner_dir,
        )
        self.image = settings.image
        self.pod_name = settings.pod
        self.namespace = settings.namespace
        self.terminate_grace_s = settings.terminate_grace_s
        # A resume keeps the pod when its ref says so too (`durable`).
        self._keep_pod = settings.keep
        self._client: KubeClient | None = None
        self._created: str | None = None
        self._target: Target | None = None
        # What a durable ref keeps (`durable`): the pod's uid, the kubeconfig path(s)
        # and the context loaded at start; and the kubeconfig the caller named.
        self._pod_uid: str | None = None
        self._kubeconfig = settings.kubeconfig
        self._kubeconfig_loaded: str | None = settings.kubeconfig
        self._context_loaded: str | None = settings.context
        # A resume attaches only to the pod with this uid (the ref's), and only on the
        # API server the ref was made against unless the caller named a kubeconfig or
        # context (`durable.check_server`); it reads the labels of the pod it found.
        self._expected_uid: str | None = None
        self._expected_server: tuple[str, str | None, str | None] | None = None
        self._pod_labels: dict[str, Any] = {}
        self._server: str | None = None
        self._runner: PodRunner | None = None
        # Whether processes go through the runner: what the options would pick until the
        # start decides (auto falls back where the pod cannot take it); not cleared by a
        # close or a detach (a ref made then says what the session used).
        self._runner_choice = RunnerChoice(settings.runner)

    @property
    def workdir(self) -> str:
        """Where commands start and relative paths point."""
        return self._settings.workdir

    @property
    def session_label(self) -> str:
        """The value of the `sandbox.session` label on a created pod: the session's id
        (`durable_session_id`), which a resume checks before it takes on the pod's
        deletion."""
        return durable_session_id(self)

    # ---- lifecycle -----------------------------------------------------------------

    async def _start_backend(self) -> None:
        """Load the credentials, create (or find) the pod, wait for it, probe an exec,
        start the runner as the `runner` option asks (`runner_link.choose_runner`)."""
        self._created = None
        self._target = None
        settings = self._settings
        cluster = await load_cluster_in_time(settings.kubeconfig, settings.context, self.namespace)
        durable.check_server(self, cluster.server)
        namespace = self.namespace = cluster.namespace
        self._server = cluster.server
        self._kubeconfig_loaded, self._context_loaded = cluster.kubeconfig, cluster.context
        self._client = client = KubeClient(
            cluster, api_timeout=settings.call_timeout_s, protocols=settings.protocols
        )
        if self.image is not None:
            name = pods.new_pod_name(settings.pod_options.name_prefix)
            self._created = name  # from now on `_stop_backend` deletes it, by name
            self.pod_name = name
            self._pod_uid = await pods.start_pod(
                client,
                namespace,
                name,
                self.session_label,
                self.image,
                settings.pod_options,
                settings.create_timeout_s,
            )
            self._target = Target(namespace, name, pods.CONTAINER_NAME, None)
        else:
            assert self.pod_name is not None
            found = await pods.attach_pod(
                client, namespace, self.pod_name, settings.container, settings.workdir
            )
            self._pod_uid, self._pod_labels = found.uid, found.labels
            durable.check_pod_uid(self)
            self._target = Target(namespace, self.pod_name, found.container, found.cwd)
        await execs.check_workdir(client, self._target, settings.workdir)
        self._runner, reason = await choose_runner(
            client, self._target, settings.runner_dir, settings.env, settings.runner
        )
        self._runner_choice.record(self._runner, reason)

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
                grace = self._settings.pod_options.grace_period_s
                await pods.delete_pod(client, self.namespace, self._created, grace)
                self._created = None
        finally:
            await client.close()

    def _require(self) -> tuple[KubeClient, Target]:
        assert self._client is not None and self._target is not None
        return self._client, self._target

    # ---- commands ------------------------------------------------------------------

    async def _start_exec(self, spec: CommandSpec, capture: ExecCapture) -> OneShotProcess:
        """One exec on pipes, stdout and stderr apart, straight into the capture
        (`execs.start_command`), or a command of the runner; the base session waits,
        times out and kills the tagged tree."""
        if self._runner is not None:
            return await self._runner.start_command(spec, capture, self._settings.workdir)
        client, target = self._require()
        return await execs.start_command(
            client,
            target,
            spec,
            capture,
            env=self._settings.env,
            grace_s=self.terminate_grace_s,
        )

    async def _spawn_process(self, entry: OutputSink[Handle]) -> None:
        """An exec whose socket feeds the entry (`execs.spawn`: open stdin needs v5), or
        a process of the runner; either handle is a `Process`, which the base session's
        hooks write to, resize, interrupt and end the input of."""
        if self._runner is not None:
            await self._runner.spawn(
                cast(OutputSink[RunnerProcess], entry),
                self._settings.workdir,
                grace_s=self.terminate_grace_s,
            )
            return
        client, target = self._require()
        await execs.spawn(
            client,
            target,
            cast(OutputSink[KubeProcess], entry),
            env=self._settings.env,
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
        return PodFiles(client, target, self._settings.workdir)

    async def _shell_ops(self) -> ShellFileOps:
        """The shell file operations in this sandbox's workspace."""
        # Commands start in the workdir (the prelude enters it): the script finds it as
        # "." (the stand-in plays it with a folder of its own).
        return ShellFileOps(self.exec, self._settings.workdir, shell_root=".")
