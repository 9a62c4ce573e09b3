"""Docker's exposed ports and snapshots.

`expose_port`: a port published at create (`ports=[...]`, bound to 127.0.0.1 on a port
the engine picks) is read back from the container's inspect answer
(`NetworkSettings.Ports["<port>/tcp"]`); any other port is reached at the container's
own address on its network (routable from the host on Linux bridges), or on the
host's loopback with `network_mode="host"`. A container with no network
(`network_mode="none"`) cannot be reached: `UnsupportedOperationError`.

`snapshot`: `docker commit` of the container to a local image named
`sandbox-snapshot:<random>`; the `SnapshotRef` holds the image id and the working
directory. `open_session("docker", snapshot=ref)` starts a fresh container from it.
"""

from __future__ import annotations

import secrets
from typing import Any

from ...backend import ExposedPort, Ports, SnapshotRef, Snapshots, http_url
from ...errors import InvalidArgumentError, UnsupportedOperationError
from .engine import Engine

SNAPSHOT_REPOSITORY = "sandbox-snapshot"


async def exposed_port(engine: Engine, container_id: str, port: int) -> ExposedPort:
    """Where the host reaches `port` of the container (see the module docstring)."""
    info: dict[str, Any] = await engine.call(
        "inspect the container", engine.api.inspect_container, container_id
    )
    settings = info.get("NetworkSettings") or {}
    for binding in (settings.get("Ports") or {}).get(f"{port}/tcp") or []:
        host_port = str(binding.get("HostPort") or "")
        if host_port.isdigit():
            host = str(binding.get("HostIp") or "127.0.0.1")
            host = "127.0.0.1" if host in ("", "0.0.0.0") else host
            if host == "::":
                host = "::1"
            return ExposedPort(url=http_url(host, int(host_port)), host=host, port=int(host_port))
    mode = str((info.get("HostConfig") or {}).get("NetworkMode") or "")
    if mode == "host":
        return ExposedPort(url=http_url("127.0.0.1", port), host="127.0.0.1", port=port)
    addresses = [str(settings.get("IPAddress") or "")] + [
        str(net.get("IPAddress") or "") for net in (settings.get("Networks") or {}).values()
    ]
    for address in addresses:
        if address:
            return ExposedPort(url=http_url(address, port), host=address, port=port)
    raise UnsupportedOperationError(
        f"port {port} cannot be exposed: the container has no network address "
        f"(network_mode={mode or 'default'!r}); publish it with ports=[{port}] on a "
        "container the session creates"
    )


async def commit_snapshot(engine: Engine, container_id: str, workdir: str) -> SnapshotRef:
    """Commit the container to a local image; its `SnapshotRef`."""
    tag = secrets.token_hex(8)
    answer: dict[str, Any] = await engine.call(
        "commit the container",
        engine.api.commit,
        container_id,
        repository=SNAPSHOT_REPOSITORY,
        tag=tag,
    )
    image_id = str(answer.get("Id") or "")
    if not image_id:
        raise UnsupportedOperationError("the Docker engine answered the commit without an id")
    return SnapshotRef(
        backend="docker",
        snapshot_id=image_id,
        details={"image": f"{SNAPSHOT_REPOSITORY}:{tag}", "workdir": workdir},
    )


def snapshot_options(snapshot: SnapshotRef, options: dict[str, Any]) -> dict[str, Any]:
    """The session options that start a fresh container from `snapshot`."""
    workdir = snapshot.details.get("workdir")
    if workdir is not None and not isinstance(workdir, str):
        raise InvalidArgumentError("the snapshot's workdir must be a str")
    merged = {**options, "image": snapshot.snapshot_id}
    if workdir and "workdir" not in options:
        merged["workdir"] = workdir
    return merged


class DockerPorts(Ports):
    """A port published at create (`ports=[...]`: the host's loopback), else the
    container's own address (routable from the host on a Linux bridge)."""

    async def expose(self, port: int) -> ExposedPort:
        """See `exposed_port`."""
        engine, options = self.session._require_engine()
        return await exposed_port(engine, options.container_id, port)


class DockerSnapshots(Snapshots):
    """`docker commit` to a local image (the container keeps running); a snapshot opens
    as a fresh container from it, in the snapshot's workdir."""

    async def take(self) -> SnapshotRef:
        """See `commit_snapshot`."""
        engine, options = self.session._require_engine()
        return await commit_snapshot(engine, options.container_id, self.session._workdir)

    @classmethod
    def open_options(cls, snapshot: SnapshotRef, options: dict[str, Any]) -> dict[str, Any]:
        """See `snapshot_options`; `image=` and `container=` are refused beside it."""
        if "container" in options or "image" in options:
            raise InvalidArgumentError("snapshot= replaces image= and container=")
        return snapshot_options(snapshot, options)
