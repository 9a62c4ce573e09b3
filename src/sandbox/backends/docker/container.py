"""The session's container: how a fresh one is made, and the first exec that probes it.

A created container runs a keepalive command (`sleep` for ever by default) under a tiny
init, labelled with the backend and the session's id (`durable_session_id`: what a
resume checks before it takes on the container's removal); the session removes it by
its name on close, so one whose creation was cut short goes too. The probe is one exec as
the session's user, before any command: it proves the event subscription is live (its
`exec_create` event must arrive), that the image has a shell, learns the uid/gid that
files and folders written through the archive endpoint get, and makes the working
directory (through that endpoint when the image has no `mkdir`).
"""

from __future__ import annotations

import asyncio
import logging
import math
import secrets
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ...backend import check_env, check_str, settle
from ...errors import InvalidArgumentError, ProviderError
from .engine import Engine
from .errors import is_not_found
from .execs import DockerExec, ExecOptions

logger = logging.getLogger("sandbox.docker")

DEFAULT_KEEPALIVE = ("sleep", "2147483647")
LABEL_BACKEND = "sandbox.backend"
LABEL_SESSION = "sandbox.session"
EVENT_SYNC_TIMEOUT_S = 5.0
# The engine's smallest CPU quota is 0.01 of a core (NanoCpus 10^7).
MIN_CPU_LIMIT = 0.01

# Run once at start as the session's user: learn the uid/gid that files and folders
# written through the archive endpoint should belong to, and make the working directory
# with `mkdir -p` where the image has one ("no" otherwise: the session then makes it
# through the archive endpoint). Shell builtins apart from `mkdir` (the effective ids
# from /proc, which the kill script needs anyway; `id` only if that fails): the image
# may hold nothing but `sh`.
PROBE_SCRIPT = (
    'd=ok; { [ -d "$1" ] || mkdir -p -- "$1"; } 2>/dev/null || d=no; '
    "u=-; g=-; { while read -r k r e x; do case $k in Uid:) u=$e ;; Gid:) g=$e ;; esac; "
    "done </proc/self/status; } 2>/dev/null; "
    '[ "$u" = - ] && { u=$(id -u 2>/dev/null) || u=-; }; '
    '[ "$g" = - ] && { g=$(id -g 2>/dev/null) || g=-; }; '
    'echo "sandbox-probe:$u:$g:$d"'
)


@dataclass(frozen=True, slots=True)
class Probed:
    """What the probe learned: the session user's uid/gid (None when it could not
    tell) and whether the working directory exists now."""

    owner: tuple[int, int] | None
    workdir_made: bool


@dataclass(frozen=True, slots=True)
class ContainerSpec:
    """How a fresh container is made (see `DockerSession` for each option)."""

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
    """The checked options (`InvalidArgumentError` naming the bad one)."""
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


async def create_container(
    engine: Engine,
    image: str,
    spec: ContainerSpec,
    claim: Callable[[str], None],
    session_id: str,
) -> dict[str, Any]:
    """Create and start a container from `image`, labelled with `session_id`; its
    inspect answer. `claim(name)` is called before the create: from then on the
    container may exist even if this call is cancelled or fails, and the caller removes
    it by that name."""
    api = engine.api
    name = f"{spec.name_prefix}-{secrets.token_hex(6)}"
    labels = {**spec.labels, LABEL_BACKEND: "docker", LABEL_SESSION: session_id}
    host_config = api.create_host_config(
        init=spec.init or None,
        network_mode=spec.network_mode,
        # Swap as large as the memory: the limit is on memory plus swap, so it is real.
        mem_limit=spec.memory_limit_bytes,
        memswap_limit=spec.memory_limit_bytes,
        nano_cpus=round(spec.cpu_limit * 1e9) if spec.cpu_limit else None,
        pids_limit=spec.process_limit,
        privileged=spec.privileged,
        binds=spec.volumes,
        # Published on the host's loopback only, each on a port the engine picks.
        port_bindings={port: ("127.0.0.1", None) for port in spec.ports} or None,
    )

    def create() -> Any:
        return api.create_container(
            image,
            command=list(spec.keepalive[1:]),
            entrypoint=list(spec.keepalive[:1]),
            name=name,
            labels=labels,
            host_config=host_config,
            working_dir=spec.workdir,
            user=spec.user or None,
            detach=True,
            stdin_open=False,
            tty=False,
            ports=list(spec.ports) or None,
        )

    claim(name)
    try:
        await engine.call(f"create a container from {image!r}", create)
    except ProviderError as exc:
        if not (spec.pull and is_not_found(exc)):
            raise
        logger.info("pulling %s", image)
        await engine.call(f"pull {image!r}", api.pull, image)
        await engine.call(f"create a container from {image!r}", create)
    await engine.call("start the container", api.start, name)
    info: dict[str, Any] = await engine.call("inspect the container", api.inspect_container, name)
    return info


async def running_container(
    engine: Engine,
    image: str | None,
    container: str | None,
    spec: ContainerSpec,
    claim: Callable[[str], None],
    session_id: str,
) -> dict[str, Any]:
    """The inspect answer of the session's container: a fresh one from `image` (see
    `create_container`), else the existing `container`; it must be running."""
    if image is not None:
        info = await create_container(engine, image, spec, claim, session_id)
    else:
        assert container is not None
        info = await engine.call(
            f"find the container {container!r}", engine.api.inspect_container, container
        )
    state = info.get("State") or {}
    if not state.get("Running"):
        raise ProviderError(
            f"the container {info.get('Name', '').lstrip('/') or container!r} "
            f"is not running (status {state.get('Status', 'unknown')})",
            retryable=False,
        )
    return info


async def remove_container(engine: Engine, name: str) -> None:
    """Remove the container `name` (and its anonymous volumes); one already gone is
    fine."""
    try:
        await engine.call(
            "remove the container", engine.api.remove_container, name, force=True, v=True
        )
    except ProviderError as exc:
        if not is_not_found(exc):
            raise


async def probe(engine: Engine, options: ExecOptions, workdir: str, timeout: float) -> Probed:
    """Run the probe (see the module docstring and `PROBE_SCRIPT`)."""
    output = bytearray()
    first = DockerExec(
        engine,
        options,
        ["sh", "-c", PROBE_SCRIPT, "sandbox-probe", workdir],
        tty=False,
        wrap=False,
        cwd="/",
        on_output=lambda stream, data: output.extend(data),
    )
    try:
        async with asyncio.timeout(timeout):
            await first.start()
            assert first.exec_id is not None
            if not await engine.sync_events(
                options.container_id, first.exec_id, EVENT_SYNC_TIMEOUT_S
            ):
                logger.warning("the Docker event stream is silent; exits are detected late")
            await first.wait_eof()
            await first.wait_ended()
    except TimeoutError:
        raise ProviderError(
            "the Docker engine did not run the session's first command in time",
            retryable=True,
        ) from None
    finally:
        await settle(first.terminate(0))
    text = output.decode("utf-8", "replace")
    if first.lost_reason is not None:
        raise ProviderError(
            f"the session's first command was lost: {first.lost_reason}",
            retryable=engine.gone_reason is None,
        )
    if first.exit_code != 0 or "sandbox-probe:" not in text:
        raise ProviderError(
            f"the container cannot run commands for this session (exit "
            f"{first.exit_code}): {text.strip()[-300:] or 'no output'}; the docker "
            "backend needs a POSIX sh in the image",
            retryable=False,
        )
    uid, gid, made = [*text.rsplit("sandbox-probe:", 1)[1].strip().split(":"), "", ""][:3]
    owner = (int(uid), int(gid)) if uid.isdigit() and gid.isdigit() else None
    return Probed(owner, made == "ok")
