"""docker's file API on an image holding only `sh`, `cat` and `sleep` (no `mkdir`, `id`,
`stat`, not even /tmp), against this machine's real engine: every file call goes
through the archive endpoint and runs nothing in the container, paths stay in the
workspace, and what the container plants (symlinks out, FIFOs, folders) is refused.

What the container "plants" is put there by the test through the engine's archive
endpoint (the image has no `ln` or `mkfifo`), which is what a process in it could do.
"""

from __future__ import annotations

import asyncio
import io
import secrets
import tarfile
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from typing import Any

import pytest

import sandbox
from sandbox.backends.docker import DockerSession
from tests.backend_fixtures import docker as fx
from tests.conftest import skip_or_fail

TEST_LABEL = "sandbox.test.case"
WORKSPACE = "/work"  # the minimal image's WORKDIR


@pytest.fixture(autouse=True)
def _engine() -> None:
    reason = fx.skip_reason()
    if reason:
        skip_or_fail(f"docker: {reason}")


@pytest.fixture(scope="module")
def minimal_image() -> str:
    from sandbox.testing.docker_image import ensure_minimal_image

    return ensure_minimal_image()


@asynccontextmanager
async def minimal_session(image: str, **options: Any) -> AsyncIterator[DockerSession]:
    case = secrets.token_hex(6)
    session = sandbox.open_session(
        "docker",
        image=image,
        network_mode="none",
        labels={TEST_LABEL: case},
        terminate_grace_s=0.3,
        **options,
    )
    assert isinstance(session, DockerSession)
    try:
        async with session:
            yield session
    finally:
        api = fx._client()
        for info in api.containers(all=True, filters={"label": f"{TEST_LABEL}={case}"}):
            with suppress(Exception):
                api.remove_container(info["Id"], force=True, v=True)


def plant(container: str, directory: str, *members: tarfile.TarInfo) -> None:
    """Put tar members (symlinks, FIFOs, folders) into the container, as a process
    there could."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for member in members:
            tar.addfile(member, io.BytesIO(b"x" * member.size) if member.isreg() else None)
    assert fx._client().put_archive(container, directory, buffer.getvalue())


def member(name: str, kind: bytes, *, target: str = "", size: int = 0) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = target
    info.size = size
    info.mode = 0o755 if kind == tarfile.DIRTYPE else 0o644
    return info


def archive_members(container: str, path: str) -> dict[str, tarfile.TarInfo]:
    """What the engine's archive of `path` holds (names relative to its parent)."""
    chunks, _ = fx._client().get_archive(container, path)
    with tarfile.open(fileobj=io.BytesIO(b"".join(chunks))) as tar:
        return {info.name: info for info in tar.getmembers()}


def exists(container: str, path: str) -> bool:
    api = fx._client()
    response = api.head(api._url("/containers/{0}/archive", container), params={"path": path})
    return bool(response.status_code == 200)


def execs_since(container: str, since_ns: int) -> list[str]:
    """The execs the engine created in `container` since `since_ns` (its event stream,
    which counts in whole seconds: later events are picked by their `timeNano`)."""
    api = fx._client()
    events = api.events(
        since=since_ns // 10**9,
        until=time.time() + 1,
        filters={"container": container, "event": "exec_create"},
        decode=True,
    )
    return [str(e.get("Action")) for e in events if int(e.get("timeNano", 0)) > since_ns]


async def test_every_file_call_works_and_runs_nothing(minimal_image: str) -> None:
    async with minimal_session(minimal_image, user="1000:1000") as s:
        container = s.container_id
        assert container is not None and s.workdir == WORKSPACE
        with pytest.raises(sandbox.CommandNotFoundError):
            await s.exec("mkdir", "x", shell=False)
        assert (await s.exec("echo hi | cat")).stdout == b"hi\n"
        plant(container, WORKSPACE, member("fifo", tarfile.FIFOTYPE))
        since = time.time_ns()
        payload = secrets.token_bytes(300_000)
        await s.write_file("a/b/c.bin", payload)
        assert await s.read_file("a/b/c.bin") == payload
        assert await s.read_file(f"{WORKSPACE}/a/b/c.bin") == payload
        await s.write_file_chunks("d/e/f.bin", [payload[:1000], payload[1000:]])
        chunks = [c async for c in s.read_file_chunks("d/e/f.bin", chunk_size=65536)]
        assert b"".join(chunks) == payload and max(map(len, chunks)) <= 65536
        await s.write_file("a/b/c.bin", b"shorter")
        assert await s.read_file("a/b/c.bin") == b"shorter"
        with pytest.raises(sandbox.FileTooLargeError):
            await s.read_file("d/e/f.bin", max_bytes=10)
        with pytest.raises(sandbox.SandboxFileNotFoundError):
            await s.read_file("a/none.bin")
        with pytest.raises(sandbox.NotAFileError):
            await s.read_file("a/b")
        with pytest.raises(sandbox.NotAFileError):
            await s.write_file("a/b", b"x")
        with pytest.raises(sandbox.NotAFileError):
            await s.write_file("a/b/c.bin/under", b"x")
        async with asyncio.timeout(30):  # a FIFO opened by the engine would never end
            with pytest.raises(sandbox.NotAFileError):
                await s.read_file("fifo")
            with pytest.raises(sandbox.NotAFileError):
                await anext(s.read_file_chunks("fifo"))
            with pytest.raises(sandbox.NotAFileError):
                await s.write_file("fifo", b"x")
        assert archive_members(container, f"{WORKSPACE}/fifo")["fifo"].isfifo()
        assert execs_since(container, since) == []
        # The new folders belong to the session's user, with mkdir -p's modes.
        made = archive_members(container, f"{WORKSPACE}/a")
        for name in ("a", "a/b", "a/b/c.bin"):
            assert (made[name].uid, made[name].gid) == (1000, 1000), name
        assert made["a"].isdir() and made["a"].mode & 0o777 == 0o755
        assert made["a/b/c.bin"].mode & 0o777 == 0o644
        assert archive_members(container, WORKSPACE)["work"].uid == 0  # untouched


async def test_paths_outside_the_workspace_are_refused(minimal_image: str) -> None:
    async with minimal_session(minimal_image) as s:
        for path in ("../escape.txt", "/escape.txt", "/bin/sh", "a/../../work2/x", "/workx"):
            with pytest.raises(sandbox.WorkspacePathError, match="outside the workspace"):
                await s.write_file(path, b"x")
            with pytest.raises(sandbox.WorkspacePathError):
                await s.read_file(path)
            with pytest.raises(sandbox.WorkspacePathError):
                await anext(s.read_file_chunks(path))
            with pytest.raises(sandbox.WorkspacePathError):
                await s.write_file_chunks(path, [b"x"])
        assert s.container_id is not None
        assert not exists(s.container_id, "/escape.txt")
        await s.write_file("a/../inside.txt", b"ok")
        assert await s.read_file("/work/inside.txt") == b"ok"


async def test_planted_symlinks_cannot_lead_out(minimal_image: str) -> None:
    """A parent in a tar member's path that is a symlink is followed by the engine (in
    the container's root): a write through a link out must be refused before the put,
    and links inside the workspace still work."""
    async with minimal_session(minimal_image) as s:
        container = s.container_id
        assert container is not None
        plant(container, "/", member("outside", tarfile.DIRTYPE))
        plant(container, "/outside", member("secret", tarfile.REGTYPE, size=6))
        # From "/": the engine refuses a relative link that climbs above the folder the
        # archive is put into.
        plant(container, "/", member("work/rel-out", tarfile.SYMTYPE, target="../outside/secret"))
        plant(
            container,
            WORKSPACE,
            member("inner", tarfile.DIRTYPE),
            member("out", tarfile.SYMTYPE, target="/outside"),
            member("chain", tarfile.SYMTYPE, target="out/secret"),
            member("in", tarfile.SYMTYPE, target="inner"),
            member("abs-in", tarfile.SYMTYPE, target=f"{WORKSPACE}/inner/file"),
            member("dangling-out", tarfile.SYMTYPE, target="/outside/new/file"),
        )
        for path in ("out/new.txt", "out/deep/new.txt", "rel-out", "chain", "dangling-out"):
            with pytest.raises(sandbox.WorkspacePathError, match="symbolic link"):
                await s.write_file(path, b"leaked")
        for path in ("out/secret", "rel-out", "chain"):
            with pytest.raises(sandbox.WorkspacePathError):
                await s.read_file(path)
            with pytest.raises(sandbox.WorkspacePathError):
                await anext(s.read_file_chunks(path))
        outside = archive_members(container, "/outside")
        assert sorted(outside) == ["outside", "outside/secret"]
        assert outside["outside/secret"].size == 6
        # Links that stay inside are followed.
        await s.write_file("in/sub/file.txt", b"via link")
        assert await s.read_file("inner/sub/file.txt") == b"via link"
        await s.write_file("abs-in", b"through an absolute link")
        assert await s.read_file("inner/file") == b"through an absolute link"
        with pytest.raises(sandbox.NotAFileError):
            await s.write_file("in", b"x")  # a link to a folder names a folder


@pytest.mark.parametrize("planted", ["symlink", "file", "folder"])
async def test_what_is_planted_between_the_walk_and_the_put_is_not_overwritten(
    minimal_image: str, planted: str
) -> None:
    """The upload is held at the SDK boundary after the walk while the test plants
    something on the way: the engine must not follow or replace it."""
    from tests.backends.test_docker import GatedClient

    client = GatedClient("_put", armed=False)
    try:
        async with minimal_session(minimal_image, client=client) as s:
            container = s.container_id
            assert container is not None
            plant(container, "/", member("outside", tarfile.DIRTYPE))
            client.arm()
            path = "new/deep/file.txt" if planted != "folder" else "target.txt"
            task = asyncio.ensure_future(s.write_file(path, b"written"))
            await client.blocked.wait()
            if planted == "symlink":
                plant(container, WORKSPACE, member("new", tarfile.SYMTYPE, target="/outside"))
            elif planted == "file":
                plant(container, WORKSPACE, member("new", tarfile.REGTYPE, size=4))
            else:
                plant(
                    container,
                    WORKSPACE,
                    member("target.txt", tarfile.DIRTYPE),
                    member("target.txt/kept", tarfile.REGTYPE, size=4),
                )
            client.release.set()
            expected = sandbox.WorkspacePathError if planted == "symlink" else sandbox.NotAFileError
            with pytest.raises(expected):
                await task
            assert sorted(archive_members(container, "/outside")) == ["outside"]
            if planted == "file":
                assert archive_members(container, f"{WORKSPACE}/new")["new"].size == 4
            if planted == "folder":
                kept = archive_members(container, f"{WORKSPACE}/target.txt")
                assert kept["target.txt/kept"].size == 4
    finally:
        client.release.set()
        client.close()


async def test_working_directory_is_made_through_the_archive_when_mkdir_cannot(
    minimal_image: str,
) -> None:
    """User 1000 cannot `mkdir` under the root-owned /work of an attached container (a
    created one gets its working directory from the engine): the session makes it
    through the archive endpoint, owned by that user."""
    api = fx._client()
    container = api.create_container(
        minimal_image,
        command=["sleep", "2147483647"],
        labels={TEST_LABEL: secrets.token_hex(6)},
        host_config=api.create_host_config(init=True, network_mode="none"),
    )["Id"]
    try:
        api.start(container)
        session = sandbox.open_session(
            "docker", container=container, user="1000:1000", workdir="/work/a/ws"
        )
        async with session as s:
            made = archive_members(container, "/work/a")
            assert (made["a"].uid, made["a/ws"].uid, made["a/ws"].gid) == (1000, 1000, 1000)
            assert made["a/ws"].isdir() and made["a/ws"].mode & 0o777 == 0o755
            assert (await s.exec("echo $PWD")).stdout == b"/work/a/ws\n"
            await s.write_file("here.txt", b"in the new workspace")
            assert await s.read_file("/work/a/ws/here.txt") == b"in the new workspace"
    finally:
        api.remove_container(container, force=True, v=True)
