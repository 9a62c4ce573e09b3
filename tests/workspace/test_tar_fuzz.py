"""A deterministic fuzz of the tar reader and the extractor (issue 33, item 3): a few
thousand generated archives (valid ustar, GNU and pax headers with random fields,
negative and huge sizes, base-256 fields, bad checksums, truncated streams, pax records
with bad lengths, NULs and huge counts, chains of extended headers), fed in random
chunk sizes. Each one either reads to its end or raises a `SandboxError`, never another
exception, within a bound on work (every piece handed out and every member costs bytes
of the archive, so the count of them cannot pass the archive's length: a reader that
loops fails the bound instead of hanging), and memory stays bounded over the run.
"""

from __future__ import annotations

import random
import tarfile
from collections.abc import AsyncIterator
from typing import Literal

import pytest

from sandbox.errors import SandboxError
from sandbox.testing import procfs
from sandbox.workspace.extract import extract
from sandbox.workspace.tar_reader import TarStream

SEED = 33_3
CASES = 2000
EXTRACT_EVERY = 3  # every third case also goes through the extractor
BLOCK = 512
TYPES = [b"0", b"\0", b"1", b"2", b"3", b"4", b"5", b"6", b"7", b"g", b"x", b"L", b"K", b"S", b"Z"]
FORMATS: list[Literal[0, 1, 2]] = [tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT]
COMMON = [b"0", b"5", b"2"]
NAMES = ["a", "a/b", "./c", "../up", "/abs", "d/", "l1", "x/../y", "é", "n" * 150, "a\\b"]
LINKS = [".", "..", "l1/../../..", "a", "/etc", "../../x", "", "l1/l1/l1", "b" * 120]
# Field offsets and lengths in a header block.
FIELDS = {"mode": (100, 8), "uid": (108, 8), "size": (124, 12), "mtime": (136, 12)}


def rechecksum(block: bytes) -> bytes:
    head = block[:148] + b" " * 8 + block[156:]
    checksum: bytes = b"%06o\x00 " % sum(head)
    return head[:148] + checksum + head[156:]


def base256(value: int, length: int) -> bytes:
    body: bytes = (value % 256 ** (length - 1)).to_bytes(length - 1, "big")
    return (b"\xff" if value < 0 else b"\x80") + body


def header(rng: random.Random) -> tuple[bytes, int]:
    """One header block made by `tarfile` with random fields, then perhaps mutated; and
    the size it was made with."""
    info = tarfile.TarInfo(rng.choice(NAMES))
    info.type = rng.choice(TYPES) if rng.random() < 0.2 else rng.choice(COMMON)
    info.size = rng.choice([0, 1, 511, 512, 513, rng.randrange(4096)])
    info.mode = rng.randrange(0o10000)
    info.mtime = rng.choice([0, 1_700_000_000, rng.randrange(8**11)])
    info.linkname = rng.choice(LINKS)
    fmt = rng.choice(FORMATS)
    try:
        block = info.tobuf(format=fmt, encoding="utf-8", errors="surrogateescape")
    except ValueError:  # a name too long for ustar
        block = info.tobuf(format=tarfile.PAX_FORMAT, encoding="utf-8", errors="surrogateescape")
    head, rest = block[-BLOCK:], block[:-BLOCK]  # the member's own header is the last
    mutation = rng.randrange(6)
    if mutation == 1:
        offset, length = FIELDS[rng.choice(list(FIELDS))]
        value = rng.choice([-1, -(2**40), 2**60, 2**90, rng.randrange(-(2**20), 2**20)])
        head = head[:offset] + base256(value, length) + head[offset + length :]
    elif mutation == 2:
        for _ in range(rng.randrange(1, 6)):
            k = rng.randrange(BLOCK)
            head = head[:k] + bytes([rng.randrange(256)]) + head[k + 1 :]
    elif mutation == 3:
        offset, length = FIELDS[rng.choice(list(FIELDS))]
        junk = bytes(rng.choice(b"0123456789 x\0-\xff") for _ in range(length))
        head = head[:offset] + junk + head[offset + length :]
    if rng.random() < 0.85:
        head = rechecksum(head)
    return rest + head, info.size


def pax_header(rng: random.Random) -> bytes:
    """A pax extended header whose records are random, often malformed."""
    records = bytearray()
    for _ in range(rng.randrange(0, 6)):
        key = rng.choice([b"path", b"linkpath", b"size", b"mtime", b"uid", b"atime"])
        value = rng.choice(
            [
                b"-1",
                b"12",
                b"99999999999999999999999",
                b"nan",
                b"1e999",
                b"1.5",
                b"a\0b",
                b"l1/../../..",
                b"x" * rng.randrange(300),
                b"-86400.5",
                b" 7",
            ]
        )
        body = b" " + key + b"=" + value + b"\n"
        length = len(body) + len(str(len(body) + 2))
        if rng.random() < 0.05:
            length = rng.choice([length + rng.randrange(-5, 6), 0, -3, 10**9])
        records += str(length).encode() + body
    if rng.random() < 0.02:
        records += b"19 GNU.sparse.size=1\n"
    if rng.random() < 0.1:
        records += b"6 a=b\n" * rng.randrange(5000)  # a huge count of tiny records
    if rng.random() < 0.1:
        records += bytes(rng.randrange(256) for _ in range(rng.randrange(64)))
    info = tarfile.TarInfo("././@PaxHeader")
    info.type = tarfile.XGLTYPE if rng.random() < 0.05 else tarfile.XHDTYPE
    info.size = len(records)
    block = info.tobuf(format=tarfile.USTAR_FORMAT)
    if rng.random() < 0.1:
        block = rechecksum(block[:124] + base256(rng.choice([-1, 2**40]), 12) + block[136:])
    return block + bytes(records) + b"\0" * (-len(records) % BLOCK)


def archive(rng: random.Random) -> bytes:
    out = bytearray()
    for _ in range(rng.randrange(1, 5)):
        for _ in range(rng.choice([0, 0, 1, 2, rng.randrange(12)])):
            out += pax_header(rng)
        block, size = header(rng)
        out += block
        data = size if rng.random() < 0.9 else rng.randrange(0, 1500)
        out += bytes(rng.randrange(256) for _ in range(min(data, 64))) + b"\1" * max(0, data - 64)
        out += b"\0" * (-data % BLOCK)
    if rng.random() < 0.7:
        out += b"\0" * 1024
    if rng.random() < 0.3:
        del out[rng.randrange(len(out) + 1) :]  # truncated anywhere
    return bytes(out)


async def chunked(data: bytes, rng: random.Random) -> AsyncIterator[bytes]:
    position = 0
    while position < len(data):
        size = rng.choice([1, 7, 512, 1000, 4096, len(data)])
        yield data[position : position + size]
        position += size


class Work:
    """The work a case did, bounded by its archive's length."""

    def __init__(self, bound: int) -> None:
        self.count = 0
        self.bound = bound

    def step(self) -> None:
        self.count += 1
        assert self.count <= self.bound, "the reader loops: more work than archive bytes"


async def read_all(data: bytes, rng: random.Random, work: Work) -> None:
    stream = TarStream(chunked(data, rng))
    while await stream.next_member() is not None:
        work.step()
        async for _ in stream.data():
            work.step()


class MemorySink:
    """An `extract.Sink` that drains what it is given, counting the work."""

    def __init__(self, work: Work) -> None:
        self.work = work

    async def make_dir(self, path: str, mode: int) -> None:
        self.work.step()

    async def write_file(
        self, path: str, chunks: AsyncIterator[bytes], size: int, mode: int
    ) -> None:
        self.work.step()
        async for _ in chunks:
            self.work.step()

    async def make_symlink(self, path: str, target: str) -> None:
        self.work.step()


@pytest.mark.timeout(60)  # a case that spins without yielding to us ends here
async def test_generated_archives_read_or_raise_a_sandbox_error() -> None:
    rng = random.Random(SEED)
    outcomes = {"read": 0, "refused": 0}
    before = procfs.rss_bytes()
    for case in range(CASES):
        data = archive(rng)
        # Each member costs a 512-byte header; each piece of data or folder made, a byte.
        work = Work(len(data) + 8)
        try:
            await read_all(data, rng, work)
            if case % EXTRACT_EVERY == 0:
                await extract(chunked(data, rng), MemorySink(Work(len(data) + 8)))
        except SandboxError:
            outcomes["refused"] += 1
        except AssertionError:
            raise
        except Exception as exc:  # what the test is for: name the case
            raise AssertionError(f"case {case} (seed {SEED}) raised {exc!r}") from exc
        else:
            outcomes["read"] += 1
    # Both outcomes are exercised: the generator makes good archives and bad ones.
    assert outcomes["read"] > CASES // 20 and outcomes["refused"] > CASES // 20, outcomes
    assert procfs.rss_bytes() - before < 64 * 1024 * 1024
