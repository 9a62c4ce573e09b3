"""Archives travel between backends byte for byte: a tree persisted on docker (the
engine's own archive) is hydrated into every fixture's session, persisted there (its
walk) and hydrated back into docker; every file's bytes, every mode, link and empty
folder arrive as they left."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

from sandbox.testing import conformance
from tests.backend_fixtures import docker as docker_fixture
from tests.conftest import skip_or_fail
from tests.test_conformance_workspace import archive, sh, tree


def _members(data: bytes) -> dict[str, tuple[object, ...]]:
    found: dict[str, tuple[object, ...]] = {}
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        for member in tar:
            if member.isfile():
                handle = tar.extractfile(member)
                assert handle is not None
                found[member.name] = ("file", handle.read(), member.mode)
            elif member.isdir():
                found[member.name] = ("dir", member.mode)
            else:
                found[member.name] = ("symlink", member.linkname)
    return found


async def test_docker_archive_round_trips_through_every_backend(
    backend: conformance.Backend, tmp_path: Path
) -> None:
    reason = docker_fixture.skip_reason()
    if reason:
        skip_or_fail(f"docker: {reason}")
    blob = bytes(range(256)) * 4096 + b"\x00tail"
    (tmp_path / "docker").mkdir()
    (tmp_path / "target").mkdir()
    async with docker_fixture.BACKEND.session(tmp_path / "docker") as origin:
        await origin.write_file("proj/bin/blob", blob)
        await origin.write_file("proj/run.sh", b"#!/bin/sh\necho run\n")
        await origin.write_file("proj/name with spaces \xc3\xa9.txt", b"utf-8 name")
        await sh(
            origin,
            "cd proj && chmod 750 run.sh && chmod 600 bin/blob && mkdir -p hollow/deeper "
            "&& ln -s bin/blob alias && : > empty.txt",
        )
        sent = await archive(origin, "proj")
        async with backend.session(tmp_path / "target") as target:
            assert await target.hydrate_workspace([sent], "landed") == len(_members(sent))
            assert await tree(target, "landed") == await tree(origin, "proj")
            returned = await archive(target, "landed")
        assert _members(returned) == _members(sent)
        assert await origin.hydrate_workspace([returned], "back") == len(_members(sent))
        assert await tree(origin, "back") == await tree(origin, "proj")
        assert await origin.read_file("back/bin/blob") == blob
