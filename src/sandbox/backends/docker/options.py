"""The docker session's options: their defaults and checks (`docker_options`, which
`DockerSession.__init__` calls), and what they say once checked (`DockerOptions`; the
part that makes a fresh container is its `ContainerSpec`). Every bad option raises before
anything is started, `InvalidArgumentError` naming it, or `UnsupportedOperationError`
for a limit on an attached container.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ...backend import check_env, check_seconds, check_str
from ...errors import InvalidArgumentError, UnsupportedOperationError

DEFAULT_KEEPALIVE = ("sleep", "2147483647")
# Docker always has detach keys on a tty exec (a lone first key is held back until the
# next keystroke): use a sequence nobody types by accident.
DEFAULT_DETACH_KEYS = "ctrl-^,ctrl-@,ctrl-^,ctrl-@"
# Kills that happen together are merged into one exec (see `execs.KillBatcher`), so a
# terminate-all tears every process down at once instead of 8 at a time.
TEARDOWN_CONCURRENCY = 64
# The engine's smallest CPU quota is 0.01 of a core (NanoCpus 10^7).
MIN_CPU_LIMIT = 0.01


@dataclass(frozen=True, slots=True)
class ContainerSpec:
    """How a fresh container is made (see `DockerOptions` for each option)."""

    workdir: str | None
    user: str
    memory_limit_bytes: int | None
    cpu_limit: float | None
    process_limit: int | None
    network_mode: str | None
    volumes: Mapping[str, Any] | Sequence[str] | None
    privileged: bool
    init: bool
    pull: bool
    keepalive: tuple[str, ...]
    labels: Mapping[str, str]
    name_prefix: str
    ports: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class DockerOptions:
    """A docker session's checked options.

    Exactly one of:
    - `image`: create and start a fresh container from this local image (removed on
      close unless `keep=True`); `pull=True` pulls it when missing;
    - `container`: attach to this running container (name or id), left running.

    Options: `workdir` (default: the image's working directory, created if missing),
    `user`, `env` (added to every command), `terminate_grace_s` (SIGTERM to SIGKILL,
    default 1 s). For created containers only (with `container=` they raise
    `UnsupportedOperationError`: a container we do not own keeps its own limits):
    `memory_limit_bytes` (memory and swap together; a process the limit kills exits
    137 with a note on its output), `process_limit` (the container's pids limit, which
    counts its init, keepalive and our wrapper shells too), `cpu_limit` (cores, a
    float). Also `network_mode` (default: the engine's default; "none" cuts the
    network) or `network` (bool), `volumes` (the SDK's `binds` format: host paths
    are mounted only when asked), `privileged` (default False), `init` (a tiny init
    reaps orphans, default True), `keepalive_command`, `labels`, `name_prefix`,
    `ports` (container ports published on the host's loopback at create, for
    `expose_port`), `detach_keys` (default `DEFAULT_DETACH_KEYS`). `snapshot=`
    (through `open_session`): a fresh container from a `snapshot()`'s committed image.
    Engine: `api_url` (the engine's address, Docker's `base_url`; default: DOCKER_HOST /
    the local socket), `api_version`, `call_timeout_s` (bound on each engine call), or a
    ready `client` (a `docker.APIClient`, not closed here).
    `runner` (default None: auto): processes and commands go through the runner
    (docs/runner.md), put into the container at start: one frame per start instead of
    an exec, stdin open or closed, whole-tree kills without a script, output kept in a
    ring by the runner, processes that outlive their client (`keeps_processes`). None
    uses it where this install has the runner and the container takes it, else (not
    built, a read-only or noexec /tmp, another architecture, a TLS engine connection)
    the per-exec path, the reason in `DockerSession.runner_fallback_reason` (and a
    logged warning when the delivery or start failed); None with `memory_limit_bytes`
    keeps the per-exec path too (only it notes a process the limit killed). True
    requires the runner (the start fails with the reason; a process the memory limit
    kills then exits 137 without the note); False never uses it (an exec per process).
    Plus the base session's options (`teardown_concurrency` defaults to
    `TEARDOWN_CONCURRENCY` here).

    `user` is "" for the image's user; `env` is a dict (empty when not given).
    """

    image: str | None
    container: str | None
    spec: ContainerSpec
    user: str
    env: dict[str, str]
    keep: bool
    api_url: str | None
    api_version: str | None
    call_timeout_s: float
    client: Any
    terminate_grace_s: float
    detach_keys: str
    # None: auto (the runner where it can be used); True: required; False: never.
    runner: bool | None


def docker_options(
    *,
    image: str | None,
    container: str | None,
    workdir: str | None,
    user: str | None,
    env: Mapping[str, str] | None,
    memory_limit_bytes: int | None,
    process_limit: int | None,
    cpu_limit: float | None,
    network_mode: str | None,
    network: bool | None,
    volumes: Mapping[str, Any] | Sequence[str] | None,
    privileged: bool,
    init: bool,
    pull: bool,
    keepalive_command: Sequence[str],
    labels: Mapping[str, str] | None,
    name_prefix: str,
    ports: Sequence[int],
    keep: bool,
    api_url: str | None,
    api_version: str | None,
    call_timeout_s: float,
    client: Any,
    terminate_grace_s: float,
    detach_keys: str,
    runner: bool | None,
) -> DockerOptions:
    """The checked options of `DockerSession(...)` (see `DockerOptions`), in the order
    the session always checked them: which container, how a fresh one is made, the
    limits an attached one refuses, then the times, names and variables."""
    if (image is None) == (container is None):
        raise InvalidArgumentError(
            "the docker backend needs exactly one of image= (start a fresh container) "
            "or container= (attach to a running one)"
        )
    for label, value in (("image", image), ("container", container)):
        if value is not None and (not isinstance(value, str) or not value.strip()):
            raise InvalidArgumentError(f"{label} must be a non-empty str")
    spec = container_spec(
        workdir=workdir,
        user=user or "",
        memory_limit_bytes=memory_limit_bytes,
        cpu_limit=cpu_limit,
        process_limit=process_limit,
        network_mode=network_mode,
        network=network,
        volumes=volumes,
        privileged=privileged,
        init=init,
        pull=pull,
        keepalive_command=keepalive_command,
        labels=labels,
        name_prefix=name_prefix,
        ports=ports,
    )
    limits = {
        "memory_limit_bytes": memory_limit_bytes,
        "process_limit": process_limit,
        "cpu_limit": cpu_limit,
    }
    if container is not None and (given := [k for k, v in limits.items() if v is not None]):
        raise UnsupportedOperationError(
            f"{', '.join(given)}: limits apply only to a container the session creates "
            "(image=), not to an attached one (container=)"
        )
    grace = check_seconds("terminate_grace_s", terminate_grace_s, allow_zero=True)
    timeout = check_seconds("call_timeout_s", call_timeout_s)
    for name, text in (
        ("user", user or None),  # "" is the image's user, as None
        ("api_url", api_url),
        ("api_version", api_version),
        ("detach_keys", detach_keys),
    ):
        check_str(name, text)
    env = check_env(env)
    check_runner(runner)
    assert grace is not None and timeout is not None
    return DockerOptions(
        image=image,
        container=container,
        spec=spec,
        user=user or "",
        env=dict(env or {}),
        keep=bool(keep),
        api_url=api_url,
        api_version=api_version,
        call_timeout_s=timeout,
        client=client,
        terminate_grace_s=grace,
        detach_keys=detach_keys,
        runner=runner,
    )


def check_runner(runner: object) -> None:
    """`runner` is True, False or None (auto): `InvalidArgumentError` otherwise."""
    if runner is not None and not isinstance(runner, bool):
        raise InvalidArgumentError(
            f"runner must be True, False or None (auto: the runner where it can be used), "
            f"not {runner!r}"
        )


def container_spec(
    *,
    workdir: str | None,
    user: str,
    memory_limit_bytes: int | None,
    cpu_limit: float | None,
    process_limit: int | None,
    network_mode: str | None,
    network: bool | None,
    volumes: Mapping[str, Any] | Sequence[str] | None,
    privileged: bool,
    init: bool,
    pull: bool,
    keepalive_command: Sequence[str],
    labels: Mapping[str, str] | None,
    name_prefix: str,
    ports: Sequence[int] = (),
) -> ContainerSpec:
    """The checked options of a fresh container (`InvalidArgumentError` naming the bad
    one)."""
    if isinstance(ports, str | bytes) or not all(
        isinstance(p, int) and not isinstance(p, bool) and 1 <= p <= 65535 for p in ports
    ):
        raise InvalidArgumentError("ports must be a list of TCP port numbers (1..65535)")
    if workdir is not None and (not isinstance(workdir, str) or not workdir.startswith("/")):
        raise InvalidArgumentError("workdir must be an absolute path in the container")
    for name, count in (
        ("memory_limit_bytes", memory_limit_bytes),
        ("process_limit", process_limit),
    ):
        if count is not None and (
            isinstance(count, bool) or not isinstance(count, int) or count < 1
        ):
            raise InvalidArgumentError(f"{name} must be a positive int, got {count!r}")
    if cpu_limit is not None and (
        isinstance(cpu_limit, bool)
        or not isinstance(cpu_limit, int | float)
        or not MIN_CPU_LIMIT <= cpu_limit < math.inf
    ):
        raise InvalidArgumentError(
            f"cpu_limit must be a number of cores >= {MIN_CPU_LIMIT}, got {cpu_limit!r}"
        )
    if not keepalive_command or not all(isinstance(a, str) for a in keepalive_command):
        raise InvalidArgumentError("keepalive_command must be a non-empty list of str")
    check_str("network_mode", network_mode)
    check_str("name_prefix", name_prefix)
    labels = check_env(labels, name="labels", variables=False)
    if network_mode is None and network is not None:
        network_mode = None if network else "none"
    return ContainerSpec(
        workdir=workdir,
        user=user,
        memory_limit_bytes=memory_limit_bytes,
        cpu_limit=cpu_limit,
        process_limit=process_limit,
        network_mode=network_mode,
        volumes=volumes,
        privileged=bool(privileged),
        init=bool(init),
        pull=bool(pull),
        keepalive=tuple(keepalive_command),
        labels=dict(labels or {}),
        name_prefix=name_prefix,
        ports=tuple(ports),
    )
