"""The session's container: how a fresh one is made, and the first exec that probes it.

A created container runs a keepalive command (`sleep` for ever by default) under a tiny
init, labelled with the backend and a session name; the session removes it by that
name on close, so one whose creation was cut short goes too. The probe is one exec as
the session's user, before any command: it proves the event subscription is live (its
`exec_create` event must arrive), that the image has a shell, creates the working
directory and learns the uid/gid files written through the archive endpoint get.
"""

from __future__ import annotations

import asyncio
import logging
import math
import secrets
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ... import arguments
from ...errors import InvalidArgumentError, ProviderError
from ...settle import settle
from .engine import Engine
from .errors import is_not_found
from .execs import DockerExec, ExecOptions

logger = logging.getLogger("sandbox.docker")

DEFAULT_KEEPALIVE = ("sleep", "2147483647")
LABEL_BACKEND = "sandbox.backend"
LABEL_SESSION = "sandbox.session"
EVENT_SYNC_TIMEOUT_S = 5.0

# Run once at start as the session's user: make the working directory, and learn the
# uid/gid that files written through the archive endpoint should belong to.
PROBE_SCRIPT = (
    'if [ -n "$1" ]; then mkdir -p -- "$1" || exit 3; fi; '
    "u=$(id -u 2>/dev/null) || u=-; g=$(id -g 2>/dev/null) || g=-; "
    'echo "sandbox-probe:$u:$g"'
)


@dataclass(frozen=True, slots=True)
class ContainerSpec:
    """How a fresh container is made (see `DockerSession` for each option)."""

    workdir: str | None
    user: str
    memory: int | str | None
    cpus: float | None
    pids_limit: int | None
    network_mode: str | None
    volumes: Mapping[str, Any] | Sequence[str] | None
    privileged: bool
    init: bool
    pull: bool
    keepalive: tuple[str, ...]
    labels: Mapping[str, str]
    name_prefix: str


def container_spec(
    *,
    workdir: str | None,
    user: str,
    memory: int | str | None,
    cpus: float | None,
    pids_limit: int | None,
    network_mode: str | None,
    network: bool | None,
    volumes: Mapping[str, Any] | Sequence[str] | None,
    privileged: bool,
    init: bool,
    pull: bool,
    keepalive_command: Sequence[str],
    labels: Mapping[str, str] | None,
    name_prefix: str,
) -> ContainerSpec:
    """The checked options (`InvalidArgumentError` naming the bad one)."""
    if workdir is not None and (not isinstance(workdir, str) or not workdir.startswith("/")):
        raise InvalidArgumentError("workdir must be an absolute path in the container")
    if cpus is not None and (
        isinstance(cpus, bool) or not isinstance(cpus, int | float) or not 0 < cpus < math.inf
    ):
        raise InvalidArgumentError(f"cpus must be a positive number, got {cpus!r}")
    if pids_limit is not None and (
        isinstance(pids_limit, bool) or not isinstance(pids_limit, int) or pids_limit < 1
    ):
        raise InvalidArgumentError(f"pids_limit must be a positive int, got {pids_limit!r}")
    if not keepalive_command or not all(isinstance(a, str) for a in keepalive_command):
        raise InvalidArgumentError("keepalive_command must be a non-empty list of str")
    arguments.check_str("network_mode", network_mode)
    arguments.check_str("name_prefix", name_prefix)
    labels = arguments.check_env(labels, name="labels", variables=False)
    if memory is not None and (
        isinstance(memory, bool) or not isinstance(memory, int | str) or not memory
    ):
        raise InvalidArgumentError(
            f"memory must be bytes (int) or a str like '512m', got {memory!r}"
        )
    if network_mode is None and network is not None:
        network_mode = None if network else "none"
    return ContainerSpec(
        workdir=workdir,
        user=user,
        memory=memory,
        cpus=cpus,
        pids_limit=pids_limit,
        network_mode=network_mode,
        volumes=volumes,
        privileged=bool(privileged),
        init=bool(init),
        pull=bool(pull),
        keepalive=tuple(keepalive_command),
        labels=dict(labels or {}),
        name_prefix=name_prefix,
    )


async def create_container(
    engine: Engine, image: str, spec: ContainerSpec, claim: Callable[[str], None]
) -> dict[str, Any]:
    """Create and start a container from `image`; its inspect answer. `claim(name)` is
    called before the create: from then on the container may exist even if this call is
    cancelled or fails, and the caller removes it by that name."""
    api = engine.api
    name = f"{spec.name_prefix}-{secrets.token_hex(6)}"
    labels = {**spec.labels, LABEL_BACKEND: "docker", LABEL_SESSION: name}
    host_config = api.create_host_config(
        init=spec.init or None,
        network_mode=spec.network_mode,
        mem_limit=spec.memory,
        nano_cpus=int(spec.cpus * 1e9) if spec.cpus else None,
        pids_limit=spec.pids_limit,
        privileged=spec.privileged,
        binds=spec.volumes,
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
) -> dict[str, Any]:
    """The inspect answer of the session's container: a fresh one from `image` (see
    `create_container`), else the existing `container`; it must be running."""
    if image is not None:
        info = await create_container(engine, image, spec, claim)
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


async def probe(
    engine: Engine, options: ExecOptions, workdir: str, timeout: float
) -> tuple[int, int] | None:
    """Run the probe (see the module docstring); the uid/gid of the session's user
    (None when `id` could not tell)."""
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
            "backend needs a POSIX sh in the image, and a working directory it can "
            "create",
            retryable=False,
        )
    uid, _, gid = text.rsplit("sandbox-probe:", 1)[1].strip().partition(":")
    return (int(uid), int(gid)) if uid.isdigit() and gid.isdigit() else None
