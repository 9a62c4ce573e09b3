"""The Agents SDK adapter behaves as the SDK's own sandboxes do (issue 35).

Each test is one item of the issue, through the SDK's own session object (what its tools
call) on our `SandboxClient`: path grants honoured by read/write (and `host_path` refused
on unix_local, bind-mounted on docker), the SDK's persist skip set, absolute links into
the workspace restorable, the SDK's error types for archives and file calls, the
manifest's environment on commands, manifest users refused on unix_local, docker writes
in place and ports published on loopback, a workspace root replaced by a symlink not
followed. The SDK's own suite (`make test-agents-sdk`) checks the same against their
tests; these stay when a new SDK release changes theirs.
"""

from __future__ import annotations

import io
import os
import tarfile
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("agents.sandbox", reason="the openai-agents extra is not installed")

from agents.sandbox.entries.artifacts import File
from agents.sandbox.entries.mounts.base import DockerVolumeMountStrategy, Mount, MountStrategy
from agents.sandbox.errors import (
    InvalidManifestPathError,
    WorkspaceArchiveReadError,
    WorkspaceArchiveWriteError,
)
from agents.sandbox.manifest import Environment, Manifest
from agents.sandbox.session.sandbox_session import SandboxSession
from agents.sandbox.snapshot import LocalSnapshot
from agents.sandbox.types import User
from agents.sandbox.workspace_paths import SandboxPathGrant

import sandbox
from sandbox.integrations.openai_agents import SandboxClient, SandboxClientOptions


async def _open(
    workspace: Path, manifest: Manifest | None = None, **options: Any
) -> tuple[SandboxClient, SandboxSession]:
    client = SandboxClient()
    manifest = manifest or Manifest()
    session = await client.create(
        manifest=manifest.model_copy(update={"root": str(workspace)}),
        options=SandboxClientOptions(
            backend="unix_local", backend_options={"workdir": str(workspace), **options}
        ),
    )
    await session.start()
    return client, session


@pytest.fixture
async def opened(tmp_path: Path) -> AsyncIterator[Any]:
    """`opened(manifest)`: an SDK session on a unix_local workspace `tmp_path/ws`."""
    sessions: list[SandboxSession] = []
    workspace = tmp_path / "ws"
    workspace.mkdir()

    async def make(manifest: Manifest | None = None) -> SandboxSession:
        _, session = await _open(workspace, manifest)
        sessions.append(session)
        return session

    yield make
    for session in sessions:
        await session.shutdown()


async def _read(session: SandboxSession, path: str) -> bytes:
    handle = await session.read(Path(path))
    data = handle.read()
    return data if isinstance(data, bytes) else str(data).encode()


def _members(archive: io.IOBase) -> dict[str, tarfile.TarInfo]:
    with tarfile.open(fileobj=archive, mode="r|") as reading:  # type: ignore[call-overload]
        return {member.name.removeprefix("./"): member for member in reading}


# ---- 1: path grants ----


async def test_a_path_grant_is_read_and_written_and_a_read_only_one_refuses_writes(
    tmp_path: Path, opened: Any
) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "in.txt").write_bytes(b"granted")
    frozen = tmp_path / "frozen"
    frozen.mkdir()
    (frozen / "keep.txt").write_bytes(b"kept")
    manifest = Manifest(
        extra_path_grants=(
            SandboxPathGrant(path=str(shared)),
            SandboxPathGrant(path=str(frozen), read_only=True),
        )
    )
    session = await opened(manifest)

    assert await _read(session, str(shared / "in.txt")) == b"granted"
    await session.write(shared / "out.txt", io.BytesIO(b"written"))
    assert (shared / "out.txt").read_bytes() == b"written"
    assert await _read(session, str(frozen / "keep.txt")) == b"kept"
    with pytest.raises(WorkspaceArchiveWriteError):
        await session.write(frozen / "keep.txt", io.BytesIO(b"changed"))
    assert (frozen / "keep.txt").read_bytes() == b"kept"


async def test_a_link_inside_a_grant_leading_out_of_it_is_not_followed(
    tmp_path: Path, opened: Any
) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    secret = tmp_path / "secret.txt"
    secret.write_bytes(b"not granted")
    (shared / "out").symlink_to(secret)
    session = await opened(Manifest(extra_path_grants=(SandboxPathGrant(path=str(shared)),)))

    with pytest.raises(WorkspaceArchiveReadError):
        await session.read(shared / "out")
    with pytest.raises(WorkspaceArchiveWriteError):
        await session.write(shared / "out", io.BytesIO(b"overwritten"))
    assert secret.read_bytes() == b"not granted"


async def test_a_host_path_grant_is_refused_on_unix_local_before_anything_is_made(
    tmp_path: Path,
) -> None:
    client = SandboxClient()
    manifest = Manifest(
        extra_path_grants=(SandboxPathGrant(path="/data", host_path=str(tmp_path)),)
    )
    with pytest.raises(sandbox.InvalidArgumentError, match="host_path"):
        await client.create(manifest=manifest, options=SandboxClientOptions(backend="unix_local"))


# ---- 2, 3: what persist_workspace writes ----


async def test_persist_leaves_out_ephemeral_entries_and_registered_paths(opened: Any) -> None:
    manifest = Manifest(
        entries={
            "kept.txt": File(content=b"kept"),
            "scratch.txt": File(content=b"ephemeral", ephemeral=True),
        }
    )
    session = await opened(manifest)
    await session.write(Path("logs/run.jsonl"), io.BytesIO(b"{}"))
    await session.write(Path("logs_other.txt"), io.BytesIO(b"kept too"))
    session._inner.register_persist_workspace_skip_path("logs")

    archive = await session.persist_workspace()
    with archive:
        names = set(_members(archive))

    assert "kept.txt" in names and "logs_other.txt" in names
    assert not {"scratch.txt", "logs", "logs/run.jsonl"} & names


async def test_an_absolute_link_into_the_workspace_survives_persist_and_hydrate(
    tmp_path: Path, opened: Any
) -> None:
    session = await opened()
    workspace = tmp_path / "ws"
    (workspace / "data").mkdir()
    (workspace / "data" / "a.txt").write_bytes(b"target")
    (workspace / "link").symlink_to(workspace / "data" / "a.txt")

    archive = await session.persist_workspace()
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    _, other = await _open(fresh)
    with archive:
        assert _members(archive)["link"].linkname == "data/a.txt"
        archive.seek(0)
        try:
            await other.hydrate_workspace(archive)
        finally:
            await other.shutdown()
    assert os.readlink(fresh / "link") == "data/a.txt"
    assert (fresh / "link").read_bytes() == b"target"


def _tar_with(member: tarfile.TarInfo, data: bytes = b"") -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as writing:
        writing.addfile(member, io.BytesIO(data) if data else None)
    return buffer.getvalue()


async def test_a_snapshot_hydrate_would_refuse_leaves_the_workspace_on_resume(
    tmp_path: Path, opened: Any
) -> None:
    session = await opened()
    (tmp_path / "ws" / "keep.txt").write_bytes(b"kept")
    leak = tarfile.TarInfo("leak")
    leak.type = tarfile.SYMTYPE
    leak.linkname = "/etc/passwd"
    for stored in (_tar_with(leak), b"not a tar archive"):
        (tmp_path / "snap.tar").write_bytes(stored)
        session._inner.state.snapshot = LocalSnapshot(id="snap", base_path=tmp_path)

        # The SDK's restore step of resume (clear, then hydrate the snapshot).
        with pytest.raises(WorkspaceArchiveWriteError):
            await session._inner._restore_snapshot_into_workspace_on_resume()

        assert (tmp_path / "ws" / "keep.txt").read_bytes() == b"kept"


# ---- 4: the SDK's error types ----


async def test_hydrate_refuses_a_stream_that_is_not_a_tar_with_the_sdks_error(
    opened: Any,
) -> None:
    session = await opened()
    for data in (b"certainly not a tar archive", b"", b"x" * 600):
        with pytest.raises(WorkspaceArchiveWriteError):
            await session.hydrate_workspace(io.BytesIO(data))


async def test_hydrate_refuses_a_member_with_the_sdks_error(opened: Any) -> None:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as writing:
        member = tarfile.TarInfo("../escaped.txt")
        member.size = 3
        writing.addfile(member, io.BytesIO(b"bad"))
    buffer.seek(0)
    session = await opened()
    with pytest.raises(WorkspaceArchiveWriteError) as raised:
        await session.hydrate_workspace(buffer)
    assert isinstance(raised.value.__cause__, sandbox.SandboxError)


async def test_reads_and_writes_fail_with_the_sdks_archive_errors(
    tmp_path: Path, opened: Any
) -> None:
    session = await opened()
    workspace = tmp_path / "ws"
    (workspace / "folder").mkdir()
    (workspace / "out").symlink_to(tmp_path)
    with pytest.raises(WorkspaceArchiveReadError):
        await session.read(Path("folder"))
    with pytest.raises(WorkspaceArchiveReadError):
        await session.read(Path("out/anything"))
    with pytest.raises(WorkspaceArchiveWriteError):
        await session.write(Path("out/planted.txt"), io.BytesIO(b"x"))
    assert not (tmp_path / "planted.txt").exists()


# ---- 5: the manifest's environment ----


async def test_the_manifests_environment_reaches_commands(opened: Any) -> None:
    session = await opened(
        Manifest(environment=Environment(value={"GREETING": "from-the-manifest"}))
    )

    result = await session.exec('printf %s "$GREETING"')
    assert result.stdout == b"from-the-manifest"
    started = await session.pty_exec_start('printf %s "$GREETING"', yield_time_s=5, shell=True)
    assert b"from-the-manifest" in started.output


# ---- 6: manifest users on unix_local ----


async def test_manifest_users_are_refused_on_unix_local(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    # A fresh name: the check below cannot see an account an earlier run left.
    name = f"sbx{uuid.uuid4().hex[:12]}"
    client = SandboxClient()
    session = await client.create(
        manifest=Manifest(root=str(workspace), users=[User(name=name)]),
        options=SandboxClientOptions(
            backend="unix_local", backend_options={"workdir": str(workspace)}
        ),
    )
    try:
        with pytest.raises(Exception) as raised:
            await session.start()
        assert not await session.running()  # a failed start leaves nothing running
    finally:
        await session.shutdown()
    chain = [raised.value, raised.value.__cause__, raised.value.__context__]
    assert any(isinstance(error, sandbox.InvalidArgumentError) for error in chain)
    with open("/etc/passwd") as accounts:
        assert f"\n{name}:" not in f"\n{accounts.read()}"


# ---- 7: delete unmounts first ----

_UNMOUNTED: list[str] = []


class _RecordedMount(Mount):
    """A mount whose teardown is recorded (and fails for a name in `fail`): the order
    and outcome `delete` sees, without a real mount on this machine."""

    type: str = "sandbox_test_recorded_mount"
    mount_strategy: MountStrategy = DockerVolumeMountStrategy(driver="local")
    fail: bool = False

    def supported_docker_volume_drivers(self) -> frozenset[str]:
        return frozenset({"local"})

    async def unmount(self, session: Any, dest: Path, base_dir: Path) -> None:
        _UNMOUNTED.append(dest.as_posix())
        if self.fail:
            raise RuntimeError("the mount is busy")


async def _owned_session_with_mounts(*, fail: bool) -> tuple[SandboxClient, SandboxSession, Path]:
    client = SandboxClient()
    session = await client.create(options=SandboxClientOptions(backend="unix_local"))
    await session.start()
    root = Path(session._inner.state.manifest.root)
    entries = {
        "data": _RecordedMount(),
        "data/deeper": _RecordedMount(fail=fail),
    }
    # Mounts the SDK applied at start; here set after it (no real mount is made).
    session._inner.state.manifest = session._inner.state.manifest.model_copy(
        update={"entries": entries}
    )
    return client, session, root


async def test_delete_unmounts_ephemeral_mounts_deepest_first_then_removes() -> None:
    _UNMOUNTED.clear()
    client, session, root = await _owned_session_with_mounts(fail=False)
    await session.shutdown()
    await client.delete(session)

    assert _UNMOUNTED == [f"{root}/data/deeper", f"{root}/data"]
    assert not root.exists()


async def test_delete_keeps_the_workspace_when_an_unmount_failed() -> None:
    _UNMOUNTED.clear()
    client, session, root = await _owned_session_with_mounts(fail=True)
    try:
        await session.shutdown()
        await client.delete(session)

        assert len(_UNMOUNTED) == 2  # one failure hides no other unmount
        assert root.is_dir()  # a live mount's files are never removed
    finally:
        if root.exists():
            import shutil

            shutil.rmtree(root)


# ---- 9: the workspace root replaced by a symlink ----


async def test_a_workspace_root_replaced_by_a_symlink_is_not_written_through(
    tmp_path: Path, opened: Any
) -> None:
    session = await opened()
    workspace = tmp_path / "ws"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    workspace.rename(tmp_path / "ws-moved")
    workspace.symlink_to(elsewhere)

    with pytest.raises(InvalidManifestPathError):
        await session.write(Path("planted.txt"), io.BytesIO(b"x"))
    with pytest.raises(InvalidManifestPathError):
        await session.read(Path("planted.txt"))
    with pytest.raises(InvalidManifestPathError):
        await session.mkdir(Path("planted"))
    assert os.listdir(elsewhere) == []


# ---- 8: docker ----


def _docker_options() -> dict[str, Any]:
    from tests.backend_fixtures.docker import skip_reason

    reason = skip_reason()
    if reason:
        if os.environ.get("SANDBOX_REQUIRE_ALL") == "1":
            pytest.fail(reason)
        pytest.skip(reason)
    from sandbox.testing.docker_image import ensure_busybox_image

    return {"image": ensure_busybox_image()}


@pytest.fixture
async def docker_session() -> AsyncIterator[SandboxSession]:
    client = SandboxClient()
    session = await client.create(
        options=SandboxClientOptions(
            backend="docker", backend_options=_docker_options(), exposed_ports=(8123,)
        )
    )
    await session.start()
    try:
        yield session
    finally:
        await session.shutdown()
        await client.delete(session)


async def test_docker_writes_an_existing_file_in_place(docker_session: SandboxSession) -> None:
    session = docker_session
    await session.write(Path("tool.sh"), io.BytesIO(b"#!/bin/sh\necho old\n"))
    setup = await session.exec("chmod 755 tool.sh && ln tool.sh alias.sh && ls -i tool.sh")
    inode = setup.stdout.split()[0]

    await session.write(Path("tool.sh"), io.BytesIO(b"#!/bin/sh\necho new\n"))

    after = await session.exec("ls -i tool.sh; ./tool.sh; cat alias.sh; stat -c %a tool.sh")
    lines = after.stdout.decode().split("\n")
    assert lines[0].split()[0] == inode.decode()
    assert lines[1] == "new"  # still executable
    assert "echo new" in lines[3]  # the hard link sees the new bytes
    assert lines[-2] == "755"
    listing = await session.exec("ls -a")
    assert b"sandbox-write" not in listing.stdout


async def test_docker_exposed_ports_are_published_on_loopback(
    docker_session: SandboxSession,
) -> None:
    endpoint = await docker_session.resolve_exposed_port(8123)
    assert endpoint.host == "127.0.0.1"  # not the container's bridge address


async def test_unix_local_ports_resolve_before_start_and_are_kept_once() -> None:
    client = SandboxClient()
    session = await client.create(
        options=SandboxClientOptions(backend="unix_local", exposed_ports=(8765, 8765))
    )
    try:
        endpoint = await session.resolve_exposed_port(8765)
    finally:
        await session.aclose()
        await client.delete(session)
    assert session.state.exposed_ports == (8765,)
    assert (endpoint.host, endpoint.port) == ("127.0.0.1", 8765)
