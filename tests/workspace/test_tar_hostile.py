"""Hostile archives and `stat` answers (issue 33, item 3): a negative size (pax and
base-256) is refused at once, where it used to spin the event loop for ever; a chain of
extended headers is bounded; a link resolving out through an earlier link is refused on
hydrate and on `sandbox cp` out; modes land masked on the host; malformed pax fields
are `SandboxError`s. Archives are made by `tarfile` and patched by hand where a field
must say what `tarfile` will not write."""

from __future__ import annotations

import asyncio
import io
import os
import stat
import tarfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

import sandbox
from sandbox.cli.copy import _HostSink
from sandbox.errors import InvalidArgumentError, SandboxError
from sandbox.testing import procfs
from sandbox.workspace import tar_reader
from sandbox.workspace.extract import extract
from sandbox.workspace.info import FileInfo
from sandbox.workspace.persist import walk_tar
from sandbox.workspace.shell_ops import ShellFileOps
from sandbox.workspace.tar_writer import file_header
from tests.test_cli import run_cli

Entry = tuple[tarfile.TarInfo, bytes]


def info(
    name: str, kind: bytes = tarfile.REGTYPE, *, link: str = "", mode: int = 0o644
) -> tarfile.TarInfo:
    made = tarfile.TarInfo(name)
    made.type, made.linkname, made.mode = kind, link, mode
    return made


def tar_of(*entries: Entry) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for member, data in entries:
            member.size = len(data)
            tar.addfile(member, io.BytesIO(data) if data else None)
    return out.getvalue()


def rechecksum(block: bytes) -> bytes:
    """`block` with its checksum field recomputed (as a writer would)."""
    head = block[:148] + b" " * 8 + block[156:]
    return head[:148] + b"%06o\x00 " % sum(head) + head[156:]


def base256_size(value: int) -> bytes:
    """A header of a 1 KiB-data file whose size field says `value` in base 256, then
    the data and the end: what a sandbox's tar could send."""
    block = tarfile.TarInfo("x.bin").tobuf(format=tarfile.USTAR_FORMAT)
    field = (value % 256**11).to_bytes(11, "big")
    raw = (b"\xff" if value < 0 else b"\x80") + field
    return rechecksum(block[:124] + raw + block[136:]) + b"\x01" * 1024 + b"\0" * 1024


async def members(data: bytes) -> list[tar_reader.Member]:
    """Every member of `data`, each one's data drained (one chunk: the buffer is never
    empty while a negative size is 'read')."""

    async def one() -> AsyncIterator[bytes]:
        yield data

    stream = tar_reader.TarStream(one())
    found = []
    while (member := await stream.next_member()) is not None:
        async for _ in stream.data():
            pass
        found.append(member)
    return found


# ---- negative sizes ---------------------------------------------------------------------


@pytest.mark.timeout(20)  # the old reader spun here for ever: the timeout is the failure
@pytest.mark.parametrize("how", ["pax", "base256"])
async def test_a_negative_size_is_refused_promptly(how: str, tmp_path: Path) -> None:
    if how == "pax":
        member = info("x.bin")
        member.pax_headers = {"size": "-1"}
        data = tar_of((member, b"\x01" * 1024))
    else:
        data = base256_size(-1)
    with pytest.raises(InvalidArgumentError, match="negative"):
        await members(data)
    async with sandbox.open_session("unix_local", workdir=tmp_path / "ws") as session:
        with pytest.raises(InvalidArgumentError, match="negative"):
            await asyncio.wait_for(session.hydrate_workspace([data]), 3)
        assert not (tmp_path / "ws" / "x.bin").exists()


async def test_a_huge_base256_size_is_refused() -> None:
    with pytest.raises(InvalidArgumentError, match=f"above {tar_reader.MAX_MEMBER_SIZE}"):
        await members(base256_size(2**80))


def test_the_writer_refuses_a_size_no_file_has() -> None:
    """A `stat` answer of -1 used to become a pax `size=-1` header (what hung `cp`)."""
    for size in (-1, tar_reader.MAX_MEMBER_SIZE + 1):
        with pytest.raises(InvalidArgumentError, match="its size"):
            file_header("x", size=size, mode=0o644, mtime=0)
    for mtime in (float("nan"), float("inf")):
        with pytest.raises(InvalidArgumentError, match="its mtime"):
            file_header("x", size=0, mode=0o644, mtime=mtime)


@pytest.mark.timeout(30)
async def test_cp_out_of_a_sandbox_whose_stat_says_minus_one(tmp_path: Path) -> None:
    """The sandbox's own `stat` lies (a shell-file backend runs the sandbox's `stat`):
    the listing is a `SandboxError`, and the walk `sandbox cp :dir` reads ends in one
    instead of an archive that never finishes on the host."""
    workspace = tmp_path / "ws"
    (workspace / "bin").mkdir(parents=True)
    (workspace / "d").mkdir()
    (workspace / "d" / "f.txt").write_bytes(b"content")
    liar = workspace / "bin" / "stat"
    liar.write_text("#!/bin/sh\necho '81a4 -1 0'\n")
    liar.chmod(0o755)
    host = tmp_path / "host"
    host.mkdir()
    async with sandbox.open_session("unix_local", workdir=workspace) as session:

        async def run(command: str, **kwargs: object) -> sandbox.ExecResult:
            return await session.exec(f"PATH={workspace / 'bin'}:$PATH {command}", **kwargs)  # type: ignore[arg-type]

        ops = ShellFileOps(run, str(workspace))
        with pytest.raises(SandboxError, match="stat answered"):
            await ops.list_dir("d")

        class Source:
            async def stat(self, path: str) -> FileInfo:
                return await ops.stat(path)

            async def list_dir(self, path: str) -> list[FileInfo]:
                return await ops.list_dir(path)

            def read_chunks(self, path: str) -> AsyncIterator[bytes]:
                return session.read_file_chunks(path)

        with pytest.raises(SandboxError):
            await extract(walk_tar(Source(), "d"), _HostSink(str(host)))
    assert list(host.iterdir()) == []


# ---- extended header chains -----------------------------------------------------------


def pax_chain(headers: int, payload_bytes: int) -> Iterator[bytes]:
    """`headers` pax headers back to back, each of distinct records, then one file."""
    for k in range(headers):
        records = bytearray()
        n = 0
        while len(records) < payload_bytes - 64:
            body = b" k%d.%d=%s\n" % (k, n, b"v" * 2000)
            length = len(body) + len(str(len(body) + 3))
            records += str(length).encode() + body
            n += 1
        header = tarfile.TarInfo("././@PaxHeader")
        header.type, header.size = tarfile.XHDTYPE, len(records)
        yield header.tobuf(format=tarfile.USTAR_FORMAT) + bytes(records)
        yield b"\0" * (-len(records) % 512)
    yield tar_of((info("after.txt"), b"x"))


async def test_a_chain_of_pax_headers_is_bounded() -> None:
    """32 MiB of back-to-back pax headers (each under the one-header bound) used to be
    kept, record by record (+207 MiB); now the chain is refused at its bound."""
    before = procfs.rss_bytes()
    with pytest.raises(InvalidArgumentError, match="extended header"):
        await members(b"".join(pax_chain(64, 512 * 1024)))
    assert procfs.rss_bytes() - before < 96 * 1024 * 1024
    # The bounds are each a constant: within both, a member reads.
    within = b"".join(pax_chain(tar_reader.MAX_EXTENDED_CHAIN, 4096))
    assert [m.name for m in await members(within)] == ["after.txt"]
    with pytest.raises(InvalidArgumentError, match=f"more than {tar_reader.MAX_EXTENDED_CHAIN}"):
        await members(b"".join(pax_chain(tar_reader.MAX_EXTENDED_CHAIN + 1, 4096)))
    big = tar_reader.MAX_EXTENDED // 2 + 4096
    with pytest.raises(InvalidArgumentError, match=f"more than {tar_reader.MAX_EXTENDED} bytes"):
        await members(b"".join(pax_chain(3, big)))


# ---- malformed pax records --------------------------------------------------------------


@pytest.mark.parametrize("mtime", ["abc", "nan", "inf", "1e999", "--5", "1 2"])
async def test_a_malformed_pax_mtime_is_a_sandbox_error(mtime: str, tmp_path: Path) -> None:
    member = info("t.txt")
    member.pax_headers = {"mtime": mtime}
    data = tar_of((member, b"x"))
    with pytest.raises(InvalidArgumentError, match="pax mtime"):
        await members(data)
    member.pax_headers = {"mtime": "-86400.5"}  # before the epoch: a number, read
    assert [m.mtime for m in await members(tar_of((member, b"x")))] == [-86400.5]
    async with sandbox.open_session("unix_local", workdir=tmp_path / "ws") as session:
        with pytest.raises(InvalidArgumentError, match="pax mtime"):
            await session.hydrate_workspace([data])


async def test_a_nul_in_a_pax_path_is_a_sandbox_error(tmp_path: Path) -> None:
    member = info("plain.txt")
    member.pax_headers = {"path": "a\x00b.txt"}
    data = tar_of((member, b"x"))
    async with sandbox.open_session("unix_local", workdir=tmp_path / "ws") as session:
        with pytest.raises(InvalidArgumentError, match="NUL"):
            await session.hydrate_workspace([data])
    assert sorted(os.listdir(tmp_path / "ws")) == []


# ---- links resolved against the tree ---------------------------------------------------


def chained_links() -> bytes:
    return tar_of(
        (info("a/b", tarfile.DIRTYPE, mode=0o755), b""),
        (info("a/b/l1", tarfile.SYMTYPE, link="."), b""),
        (info("a/b/l2", tarfile.SYMTYPE, link="l1/../../.."), b""),
    )


async def test_a_link_resolving_out_through_an_earlier_link_is_refused_on_hydrate(
    tmp_path: Path,
) -> None:
    """`l2`'s own text stays inside (three `..` from two folders deep, after `l1`), but
    `l1` is `.`: resolved through it, `l2` is the parent of the workspace."""
    workspace = tmp_path / "ws"
    async with sandbox.open_session("unix_local", workdir=workspace) as session:
        with pytest.raises(InvalidArgumentError, match=r"l2.*pointing out"):
            await session.hydrate_workspace([chained_links()])
        assert os.readlink(workspace / "a" / "b" / "l1") == "."
        assert not os.path.lexists(workspace / "a" / "b" / "l2")
        # At the top, as the issue wrote it.
        top = tar_of(
            (info("l1", tarfile.SYMTYPE, link="."), b""),
            (info("l2", tarfile.SYMTYPE, link="l1/../../.."), b""),
        )
        with pytest.raises(InvalidArgumentError, match="pointing out"):
            await session.hydrate_workspace([top], "top")
        assert not os.path.lexists(workspace / "top" / "l2")
        # Links that stay inside, through links and back, still land.
        inside = tar_of(
            (info("alias", tarfile.SYMTYPE, link="deep/er/data.bin"), b""),
            (info("deep/er/data.bin"), b"data"),
            (info("deep/er/up", tarfile.SYMTYPE, link="../.."), b""),
            (info("deep/here", tarfile.SYMTYPE, link="er/up/deep/er/../../deep"), b""),
        )
        assert await session.hydrate_workspace([inside], "ok") == 4
    assert (workspace / "ok" / "alias").read_bytes() == b"data"
    here = os.path.realpath(workspace / "ok" / "deep" / "here")
    assert here == str((workspace / "ok" / "deep").resolve())


async def test_a_later_link_cannot_change_what_an_earlier_one_resolved(tmp_path: Path) -> None:
    """`x -> a/b/c/../../..` is the folder itself while `c` is a file; a symlink
    `c -> .` landed after it would make `x` the workspace's parent."""
    workspace = tmp_path / "ws"
    data = tar_of(
        (info("a/b/c"), b"file"),
        (info("x", tarfile.SYMTYPE, link="a/b/c/../../.."), b""),
        (info("a/b/c", tarfile.SYMTYPE, link="."), b""),
    )
    async with sandbox.open_session("unix_local", workdir=workspace) as session:
        with pytest.raises(InvalidArgumentError, match="a/b/c"):
            await session.hydrate_workspace([data])
    assert (workspace / "a" / "b" / "c").read_bytes() == b"file"
    # The same with a name the archive never made as a file: stepped out of, pinned.
    data = tar_of(
        (info("y", tarfile.SYMTYPE, link="p/q/../../z"), b""),
        (info("p", tarfile.SYMTYPE, link="a/b"), b""),
    )
    async with sandbox.open_session("unix_local", workdir=tmp_path / "ws2") as session:
        with pytest.raises(InvalidArgumentError, match="'p' refused"):
            await session.hydrate_workspace([data])


def test_cp_out_refuses_a_link_resolving_out_through_an_earlier_one(tmp_path: Path) -> None:
    """The sandbox made the links itself; `sandbox cp :src host` must not land, in the
    host folder, a link that resolves to the host folder's parent."""
    workspace = tmp_path / "ws"
    (workspace / "src" / "a" / "b").mkdir(parents=True)
    (workspace / "src" / "a" / "b" / "l1").symlink_to(".")
    (workspace / "src" / "a" / "b" / "l2").symlink_to("l1/../../..")
    back = tmp_path / "back"
    out = run_cli("cp", "--workdir", str(workspace), ":src", str(back))
    assert out.returncode != 0 and "pointing out" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr
    assert os.readlink(back / "a" / "b" / "l1") == "."
    assert not os.path.lexists(back / "a" / "b" / "l2")


# ---- modes on the host ------------------------------------------------------------------


def _perm(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


async def test_hydrate_masks_modes(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    data = tar_of(
        (info("shared", tarfile.DIRTYPE, mode=0o3777), b""),
        (info("shared/tool", mode=0o6777), b"#!/bin/sh\n"),
        (info("shared/notes", mode=0o666), b"n"),
        (info("locked", tarfile.DIRTYPE, mode=0o500), b""),
        (info("locked/inside", mode=0o400), b"i"),
    )
    async with sandbox.open_session("unix_local", workdir=workspace) as session:
        assert await session.hydrate_workspace([data]) == 5
    assert _perm(workspace / "shared") == 0o755
    assert _perm(workspace / "shared" / "tool") == 0o755
    assert _perm(workspace / "shared" / "notes") == 0o644
    assert _perm(workspace / "locked") == 0o700  # its owner can still fill it
    assert _perm(workspace / "locked" / "inside") == 0o400


def test_cp_out_masks_modes_on_the_host(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    (workspace / "src" / "shared").mkdir(parents=True)
    (workspace / "src" / "shared" / "tool").write_bytes(b"#!/bin/sh\n")
    (workspace / "src" / "shared" / "tool").chmod(0o4777)
    (workspace / "src" / "shared").chmod(0o3777)  # setgid, sticky, world-writable
    assert _perm(workspace / "src" / "shared") == 0o3777
    back = tmp_path / "back"
    out = run_cli("cp", "--workdir", str(workspace), ":src", str(back))
    assert out.returncode == 0, out.stderr
    assert _perm(back / "shared") == 0o755
    assert _perm(back / "shared" / "tool") == 0o755
