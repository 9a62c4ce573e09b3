"""The session's container: how a fresh one is made or an existing one found, the first
exec that probes it, and how the session lets go of it.

A created container runs a keepalive command (`sleep` for ever by default) under a tiny
init, labelled with the backend and the session's id (`durable_session_id`: what a
resume checks before it takes on the container's removal); the session removes it by
its name on close, so one whose creation was cut short goes too. The probe is one exec as
the session's user, before any command: it proves the event subscription is live (its
`exec_create` event must arrive), that the image has a shell, learns the uid/gid that
files and folders written through the archive endpoint get, and makes the working
directory (through that endpoint when the image has no `mkdir`): `ready_container`.
`disconnect` ends the session's link to the engine (a close, which may remove the
container, or a detach, which leaves it).
"""

from __future__ import annotations

import asyncio
import logging
import posixpath
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ...backend import settle
from ...errors import ProviderError
from .engine import Engine
from .errors import is_not_found
from .execs import DockerExec, ExecOptions, KillBatcher
from .files import ContainerFiles
from .options import ContainerSpec, DockerOptions
from .runner_link import ContainerRunner

logger = logging.getLogger("sandbox.docker")

LABEL_BACKEND = "sandbox.backend"
LABEL_SESSION = "sandbox.session"
EVENT_SYNC_TIMEOUT_S = 5.0

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


def exec_options(info: Mapping[str, Any], options: DockerOptions) -> ExecOptions:
    """Where and as whom the session's execs run in the container `info` (its inspect
    answer): in `workdir`, else the image's working directory, else /."""
    config = info.get("Config") or {}
    return ExecOptions(
        container_id=str(info["Id"]),
        user=options.user,
        env=options.env,
        workdir=posixpath.normpath(options.spec.workdir or config.get("WorkingDir") or "/"),
        detach_keys=options.detach_keys,
        memory_limited=options.spec.memory_limit_bytes is not None,
    )


async def ready_container(
    engine: Engine, options: ExecOptions, owner: tuple[int, int], timeout: float
) -> tuple[int, int]:
    """Follow the container's events, probe it (`probe`) and make the working directory
    through the archive endpoint where the probe could not; the uid/gid that files get
    (the probe's, else `owner`)."""
    await engine.watch(options.container_id)
    probed = await probe(engine, options, options.workdir, timeout)
    if probed.owner is not None:
        owner = probed.owner
    if not probed.workdir_made:
        # No `mkdir` in the image (or it failed): through the archive endpoint.
        files = ContainerFiles(engine, options.container_id, options.workdir, owner)
        await files.make_folder(options.workdir)
    return owner


async def disconnect(
    engine: Engine,
    runner: ContainerRunner | None,
    killer: KillBatcher | None,
    *,
    remove: str | None,
) -> None:
    """Close the link to the runner, wait for the kills and engine calls in flight, stop
    following the container's events, remove the container named `remove` (None: it
    stays), and close the engine connection, even when a step before failed."""
    try:
        if runner is not None:
            await runner.aclose()
        if killer is not None:
            await killer.settle()
        await engine.settle_calls()
        engine.stop_events()
        if remove is not None:
            await remove_container(engine, remove)
    finally:
        await engine.close()
