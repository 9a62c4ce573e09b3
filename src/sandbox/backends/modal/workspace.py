"""Modal's half of the workspace calls that are not file operations (those run through
`sandbox.workspace.shell_ops`): filesystem snapshots and tunnels.

`Sandbox.snapshot_filesystem(timeout=55, *, ttl=30 days)` (modal `sandbox/_sandbox.py`,
pinned SDK) answers an `Image` of the sandbox's filesystem; `Image.from_id(image_id,
client=None)` (`_image.py`) names it again in a later process, and a sandbox created
with that image starts from it. The `SnapshotRef` holds the image id and the workdir.
"""

from __future__ import annotations

from typing import Any

from ...backend import ExposedPort, Ports, SnapshotRef, Snapshots, http_url
from ...errors import InvalidArgumentError, UnsupportedOperationError
from .errors import ModalErrors


async def take_snapshot(
    sandbox: Any, errors: ModalErrors, workdir: str, seconds: float
) -> SnapshotRef:
    """`snapshot_filesystem` within `seconds`; its `SnapshotRef`."""
    image = await errors.timed_call(
        "snapshot the sandbox's filesystem", seconds, sandbox.snapshot_filesystem.aio
    )
    return SnapshotRef(
        backend="modal", snapshot_id=str(image.object_id), details={"workdir": workdir}
    )


def snapshot_options(snapshot: SnapshotRef, options: dict[str, Any]) -> dict[str, Any]:
    """Options that create a sandbox from `snapshot`'s image (in its workdir)."""
    if "image" in options or "sandbox_id" in options:
        raise InvalidArgumentError("snapshot= replaces image= and sandbox_id=")
    merged = {**options, "image": snapshot}
    workdir = snapshot.details.get("workdir")
    if isinstance(workdir, str) and "workdir" not in options:
        merged["workdir"] = workdir
    return merged


def image_of(sdk: Any, image: Any, client: Any) -> Any:
    """The SDK image for the `image` option: a registry tag, a snapshot, or as given."""
    if isinstance(image, str):
        return sdk.Image.from_registry(image)
    if isinstance(image, SnapshotRef):
        return sdk.Image.from_id(image.snapshot_id, client=client)
    return image


async def exposed_tunnel(sandbox: Any, errors: ModalErrors, port: int) -> ExposedPort:
    """The tunnel Modal made for `port` (`Sandbox.tunnels()`, `modal/_tunnel.py`
    `Tunnel`: `host`/`port` for TLS, `unencrypted_host`/`unencrypted_port` for a port
    declared in `unencrypted_ports`). Ports are declared at create only."""
    tunnels = await errors.call("look up the sandbox's tunnels", sandbox.tunnels.aio)
    tunnel = tunnels.get(port)
    if tunnel is None:
        raise UnsupportedOperationError(
            f"port {port} cannot be exposed: Modal opens tunnels only for ports declared "
            f'at create (create_options={{"encrypted_ports": [{port}]}})'
        )
    if tunnel.unencrypted_host:
        host, number = str(tunnel.unencrypted_host), int(tunnel.unencrypted_port)
        return ExposedPort(url=http_url(host, number), host=host, port=number)
    host, number = str(tunnel.host), int(tunnel.port)
    url = f"https://{host}/" if number == 443 else f"https://{host}:{number}/"
    return ExposedPort(url=url, host=host, port=number, tls=True)


class ModalPorts(Ports):
    """The tunnel of a port declared at create (`exposed_tunnel`)."""

    async def expose(self, port: int) -> ExposedPort:
        """See `exposed_tunnel`."""
        return await exposed_tunnel(self.session._sandbox, self.session._errors, port)


class ModalSnapshots(Snapshots):
    """`snapshot_filesystem`: an image of the sandbox's filesystem, which a fresh sandbox
    is created from."""

    async def take(self) -> SnapshotRef:
        """See `take_snapshot`."""
        session = self.session
        return await take_snapshot(
            session._sandbox, session._errors, session.workdir, session.create_timeout_s
        )

    @classmethod
    def open_options(cls, snapshot: SnapshotRef, options: dict[str, Any]) -> dict[str, Any]:
        """See `snapshot_options`."""
        return snapshot_options(snapshot, options)
