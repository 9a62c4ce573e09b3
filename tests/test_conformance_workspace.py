"""Conformance for the workspace calls (issue 22): file operations, archives; on every
fixture of tests/backend_fixtures/ (the `session` fixture of tests/conftest.py).

What is in the sandbox is set up with the sandbox's own shell (`ln -s`, `mkfifo`,
`chmod`), so each backend is checked against what its own kernel made.
"""

from __future__ import annotations

import asyncio
import io
import tarfile
from collections.abc import AsyncIterator

import pytest

import sandbox
from sandbox import BaseSandboxSession


async def sh(session: BaseSandboxSession, script: str) -> bytes:
    result = await session.exec(script)
    assert result.exit_code == 0, result
    return result.stdout


async def tree(session: BaseSandboxSession, path: str = ".") -> dict[str, object]:
    """Every name below `path` -> ("file", bytes, mode) / ("dir", mode) / ("symlink", target)."""
    found: dict[str, object] = {}

    async def walk(folder: str, prefix: str) -> None:
        for info in await session.list_dir(folder):
            name = prefix + info.name
            if info.kind == "dir":
                found[name] = ("dir", info.mode)
                await walk(info.path, name + "/")
            elif info.kind == "symlink":
                found[name] = ("symlink", info.link_target)
            elif info.kind == "file":
                found[name] = ("file", await session.read_file(info.path), info.mode)
            else:
                found[name] = (info.kind,)

    await walk(path, "")
    return found


async def archive(session: BaseSandboxSession, path: str = ".") -> bytes:
    return b"".join([chunk async for chunk in session.persist_workspace(path)])


def tar_of(*members: tuple[tarfile.TarInfo, bytes]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in members:
            info.size = len(data) if info.type in (tarfile.REGTYPE,) else 0
            tar.addfile(info, io.BytesIO(data) if data else None)
    return out.getvalue()


def member(name: str, kind: bytes = tarfile.REGTYPE, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = link
    info.mode = 0o644
    return info


# ---- file operations ----------------------------------------------------------------


async def test_stat_and_list_dir(session: BaseSandboxSession) -> None:
    await session.make_dir("top/inner/deep")
    await session.write_file("top/data.bin", b"\x00\x01xyz")
    await sh(session, "ln -s data.bin top/link && chmod 750 top/inner")
    entries = await session.list_dir("top")
    assert [(e.name, e.kind) for e in entries] == [
        ("data.bin", "file"),
        ("inner", "dir"),
        ("link", "symlink"),
    ]
    assert [e.path for e in entries] == ["top/data.bin", "top/inner", "top/link"]
    data = await session.stat("top/data.bin")
    assert (data.name, data.kind, data.size) == ("data.bin", "file", 5)
    assert data.mtime > 1_000_000_000
    inner = await session.stat("top/inner")
    assert (inner.kind, inner.mode) == ("dir", 0o750)
    link = await session.stat("top/link")
    assert (link.kind, link.link_target) == ("symlink", "data.bin")
    assert (await session.stat(".")).kind == "dir"
    assert await session.list_dir("top/inner/deep") == []


async def test_missing_names_and_non_folders(session: BaseSandboxSession) -> None:
    with pytest.raises(sandbox.SandboxFileNotFoundError):
        await session.stat("nothing-here")
    with pytest.raises(sandbox.SandboxFileNotFoundError):
        await session.list_dir("nothing-here")
    with pytest.raises(sandbox.SandboxFileNotFoundError):
        await session.remove("nothing-here")
    await session.write_file("plain.txt", b"x")
    with pytest.raises(sandbox.InvalidArgumentError, match="not a directory"):
        await session.list_dir("plain.txt")


async def test_make_dir_rules(session: BaseSandboxSession) -> None:
    await session.make_dir("a/b/c")
    await session.make_dir("a/b/c")  # parents=True: an existing folder is fine
    assert (await session.stat("a/b/c")).kind == "dir"
    with pytest.raises(sandbox.InvalidArgumentError, match="exists"):
        await session.make_dir("a/b/c", parents=False)
    with pytest.raises(sandbox.SandboxFileNotFoundError):
        await session.make_dir("x/y/z", parents=False)
    await session.make_dir("a/single", parents=False)
    assert (await session.stat("a/single")).kind == "dir"
    await session.write_file("a/file", b"1")
    with pytest.raises(sandbox.NotAFileError):
        await session.make_dir("a/file/below")
    with pytest.raises(sandbox.InvalidArgumentError, match="parents must be a bool"):
        await session.make_dir("a/b", parents="no")  # type: ignore[arg-type]


async def test_remove_rules(session: BaseSandboxSession) -> None:
    await session.write_file("r/keep/target.txt", b"kept")
    await sh(session, "cd r && ln -s keep/target.txt link && mkdir -p full/sub empty")
    await session.write_file("r/full/sub/f", b"f")
    await session.remove("r/link")
    assert await session.read_file("r/keep/target.txt") == b"kept"  # not followed
    with pytest.raises(sandbox.InvalidArgumentError, match="not empty"):
        await session.remove("r/full")
    assert (await session.stat("r/full/sub/f")).kind == "file"  # nothing removed
    await session.remove("r/empty")
    await session.remove("r/full", recursive=True)
    await session.remove("r/keep/target.txt")
    assert [e.name for e in await session.list_dir("r")] == ["keep"]
    with pytest.raises(sandbox.InvalidArgumentError):
        await session.remove(".", recursive=True)
    with pytest.raises(sandbox.InvalidArgumentError, match="recursive must be a bool"):
        await session.remove("r/keep", recursive="yes")  # type: ignore[arg-type]


async def test_paths_outside_the_workspace(session: BaseSandboxSession) -> None:
    for call in (
        session.stat("../outside"),
        session.list_dir("/"),
        session.remove("../x"),
        session.make_dir("../new-folder"),
    ):
        with pytest.raises(sandbox.WorkspacePathError):
            await call
    # A symlink in the workspace that leads out: nothing is reached through it.
    await sh(session, "ln -s / out")
    assert (await session.stat("out")).kind == "symlink"
    with pytest.raises(sandbox.WorkspacePathError):
        await session.list_dir("out")
    with pytest.raises(sandbox.WorkspacePathError):
        await session.stat("out/etc")
    with pytest.raises(sandbox.WorkspacePathError):
        await session.make_dir("out/planted-by-test")
    with pytest.raises(sandbox.WorkspacePathError):
        await session.remove("out/tmp", recursive=True)
    assert (await sh(session, "ls -d /planted-by-test 2>/dev/null || echo none")) == b"none\n"
    await session.remove("out")  # the link itself goes, not what it points at
    assert (await sh(session, "ls -d /tmp >/dev/null && echo ok")) == b"ok\n"


# ---- archives -----------------------------------------------------------------------


async def test_persist_names_modes_links_and_empty_folders(session: BaseSandboxSession) -> None:
    await session.write_file("proj/run.sh", b"#!/bin/sh\necho hi\n")
    await session.write_file("proj/data/blob", bytes(range(256)) * 300)
    await sh(
        session,
        "chmod 755 proj/run.sh && mkdir -p proj/empty/also && ln -s data/blob proj/alias "
        "&& mkfifo proj/pipe",
    )
    async with asyncio.timeout(120):  # the FIFO must not be opened
        data = await archive(session, "proj")
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        members = {m.name: m for m in tar.getmembers()}
        assert sorted(members) == [
            "alias",
            "data",
            "data/blob",
            "empty",
            "empty/also",
            "run.sh",
        ]
        assert members["run.sh"].mode == 0o755
        assert members["alias"].issym() and members["alias"].linkname == "data/blob"
        assert members["empty/also"].isdir()
        blob = tar.extractfile(members["data/blob"])
        assert blob is not None and blob.read() == bytes(range(256)) * 300
    assert tar.pax_headers is not None


async def test_persist_hydrate_round_trip(session: BaseSandboxSession) -> None:
    await session.write_file("src/a.txt", b"alpha\n")
    await session.write_file("src/deep/b.bin", bytes(range(256)) * 64)
    await session.write_file("src/empty-file", b"")
    await sh(
        session,
        "chmod 700 src/a.txt && mkdir -p src/hollow && ln -s deep/b.bin src/b-link "
        "&& ln -s ../src src/deep/up",
    )
    data = await archive(session, "src")
    assert await session.hydrate_workspace([data], "copy") == 7
    assert await tree(session, "copy") == await tree(session, "src")
    # A second hydration over the first one replaces files, keeps links.
    assert await session.hydrate_workspace([data[:1000], data[1000:]], "copy") == 7
    assert await tree(session, "copy") == await tree(session, "src")


async def test_persist_a_single_file(session: BaseSandboxSession) -> None:
    await session.write_file("one/file.txt", b"just me")
    with tarfile.open(fileobj=io.BytesIO(await archive(session, "one/file.txt"))) as tar:
        (only,) = tar.getmembers()
        assert only.name == "file.txt"
        extracted = tar.extractfile(only)
        assert extracted is not None and extracted.read() == b"just me"


@pytest.mark.parametrize(
    ("members", "culprit", "why"),
    [
        ([(member("/etc/evil"), b"x")], "/etc/evil", "absolute"),
        ([(member("a/../../evil"), b"x")], "a/../../evil", r"'\.\.'"),
        ([(member("up", tarfile.SYMTYPE, "../../.."), b"")], "up", "pointing out"),
        ([(member("abs", tarfile.SYMTYPE, "/etc"), b"")], "abs", "absolute path"),
        ([(member("hard", tarfile.LNKTYPE, "/etc/passwd"), b"")], "hard", "hard links"),
        ([(member("dev", tarfile.CHRTYPE), b"")], "dev", "device"),
        ([(member("fifo", tarfile.FIFOTYPE), b"")], "fifo", "FIFO"),
        (
            [(member("here", tarfile.SYMTYPE, "."), b""), (member("here/through"), b"x")],
            "here/through",
            "symlink 'here'",
        ),
    ],
    ids=[
        "absolute",
        "dotdot",
        "link-out",
        "link-absolute",
        "hardlink",
        "device",
        "fifo",
        "through",
    ],
)
async def test_hydrate_refuses_hostile_members(
    session: BaseSandboxSession,
    members: list[tuple[tarfile.TarInfo, bytes]],
    culprit: str,
    why: str,
) -> None:
    data = tar_of((member("before.txt"), b"first"), *members, (member("after.txt"), b"late"))
    with pytest.raises(sandbox.InvalidArgumentError, match=why) as info:
        await session.hydrate_workspace([data], "dest")
    assert repr(culprit) in str(info.value)
    landed = {e.name for e in await session.list_dir("dest")}
    assert "after.txt" not in landed and "through" not in landed
    assert "before.txt" in landed
    outside = await sh(session, "ls -d ../evil /etc/evil ../../evil 2>/dev/null; echo end")
    assert outside == b"end\n"


async def test_hydrate_limits(session: BaseSandboxSession) -> None:
    data = tar_of(*((member(f"f{k}"), b"x" * 10) for k in range(3)))
    with pytest.raises(sandbox.InvalidArgumentError, match="more than 2 members") as info:
        await session.hydrate_workspace([data], "few", max_members=2)
    assert "'f2'" in str(info.value)
    with pytest.raises(sandbox.InvalidArgumentError, match="more than 25 bytes"):
        await session.hydrate_workspace([data], "small", max_bytes=25)
    assert sorted(e.name for e in await session.list_dir("small")) == ["f0", "f1"]
    with pytest.raises(sandbox.InvalidArgumentError, match="iterable of chunks"):
        await session.hydrate_workspace(data, "x")  # type: ignore[arg-type]
    with pytest.raises(sandbox.InvalidArgumentError, match="ends inside"):
        await session.hydrate_workspace([data[:700]], "cut")


async def test_hydrate_from_an_async_stream(session: BaseSandboxSession) -> None:
    data = tar_of((member("streamed/x.txt"), b"streamed"))

    async def chunks() -> AsyncIterator[bytes]:
        for start in range(0, len(data), 100):
            yield data[start : start + 100]

    assert await session.hydrate_workspace(chunks()) == 1
    assert await session.read_file("streamed/x.txt") == b"streamed"


async def test_hydrate_onto_a_fifo_is_refused_without_hanging(session: BaseSandboxSession) -> None:
    await sh(session, "mkdir -p spot && mkfifo spot/pipe")
    async with asyncio.timeout(60):  # a safety net: the refusal must not wait
        with pytest.raises(sandbox.NotAFileError, match="pipe"):
            await session.hydrate_workspace([tar_of((member("pipe"), b"data"))], "spot")
    assert (await session.stat("spot/pipe")).kind == "other"
