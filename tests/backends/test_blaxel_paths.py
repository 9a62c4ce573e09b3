"""blaxel file paths: the workspace is enforced by the backend before any call (the
sandbox API confines nothing), and the stand-in resolves paths as the API does."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from urllib.parse import quote

import pytest

pytest.importorskip("blaxel", reason="the blaxel extra is not installed")
pytest.importorskip("aiohttp", reason="the blaxel extra is not installed")

import aiohttp
import yarl

import sandbox
from sandbox.backends.blaxel import BlaxelSession
from sandbox.testing.blaxel_server import BlaxelServer
from tests.backends.test_blaxel import make_session, server, session

__all__ = ["server", "session"]

ESCAPES = ["../../../../etc/passwd", "../outside.txt", "sub/../../outside.txt", "/etc/passwd"]


@pytest.mark.parametrize("path", ESCAPES)
async def test_paths_outside_the_workspace_are_refused_before_any_call(
    server: BlaxelServer, session: BlaxelSession, tmp_path: Path, path: str
) -> None:
    (tmp_path / "outside.txt").write_bytes(b"secret")
    sent = len(server.requests)
    with pytest.raises(sandbox.WorkspacePathError, match="outside the workspace"):
        await session.read_file(path)
    with pytest.raises(sandbox.WorkspacePathError):
        await session.write_file(path, b"x")
    with pytest.raises(sandbox.WorkspacePathError):
        async with contextlib.aclosing(session.read_file_chunks(path)) as chunks:
            await anext(chunks)
    with pytest.raises(sandbox.WorkspacePathError):
        await session.write_file_chunks(path, [b"x"])
    # Not even the listing (the stat) was asked for.
    assert server.requests[sent:] == []
    assert (tmp_path / "outside.txt").read_bytes() == b"secret"


async def test_paths_that_stay_inside_the_workspace_work(
    session: BlaxelSession, tmp_path: Path
) -> None:
    await session.write_file("sub/../f", b"one")
    assert await session.read_file("f") == b"one"
    inside = str(tmp_path / "ws" / "sub" / ".." / "g")
    await session.write_file(inside, b"two")
    assert await session.read_file("g") == b"two"
    assert (tmp_path / "ws" / "g").read_bytes() == b"two"


async def test_the_stand_in_cleans_paths_lexically_as_the_sandbox_api(tmp_path: Path) -> None:
    """`GetAbsolutePath` (handler/filesystem/filesystem.go) is `filepath.Clean`: `..`
    undoes the previous name even when that name is a symlink, and climbs out of the
    working directory; a raw "%2F" makes the path absolute."""
    root = tmp_path / "ws"
    (root / "elsewhere" / "deep").mkdir(parents=True)
    (root / "elsewhere" / "f").write_bytes(b"through the link")
    (root / "f").write_bytes(b"lexical")
    os.symlink(root / "elsewhere" / "deep", root / "link")
    (tmp_path / "up.txt").write_bytes(b"above the root")
    async with BlaxelServer(root=str(root)) as srv, aiohttp.ClientSession() as http:
        auth = {"X-Blaxel-Authorization": f"Bearer {srv.api_key}"}
        control = {**auth, "X-Blaxel-Workspace": srv.workspace}
        made = await http.post(
            srv.api_url + "/sandboxes", json={"metadata": {"name": "b"}}, headers=control
        )
        assert made.status == 200
        base = srv.sandbox_url("b") + "/filesystem/"

        async def get(path: str) -> bytes:
            url = yarl.URL(base + path, encoded=True)
            async with http.get(url, headers={**auth, "Accept": "application/octet-stream"}) as r:
                assert r.status == 200, await r.text()
                return await r.read()

        assert await get("link/%2E%2E/f") == b"lexical"
        assert await get("%2E%2E/up.txt") == b"above the root"
        assert await get(quote(f"{root}/link/../f", safe="")) == b"lexical"
        await srv.close()


async def test_a_workspace_at_the_root_holds_every_path(
    server: BlaxelServer, tmp_path: Path
) -> None:
    (tmp_path / "anywhere.txt").write_bytes(b"here")
    async with make_session(server, tmp_path, workdir="/") as s:
        assert await s.read_file(str(tmp_path / "ws" / ".." / "anywhere.txt")) == b"here"
