"""`sandbox.backends.toolkit.runner_place`: what a sandbox reports about the runner is
checked before it is used, and a link whose runner does not answer ends cleanly."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from sandbox.backends.toolkit import (
    checked_digest,
    checked_folder,
    hello_through,
    runner_name,
    sandbox_environment,
)
from sandbox.errors import ProviderError
from sandbox.runner import LinkWriter, RunnerBinary


class SinkExec(LinkWriter):
    """A provider's exec that takes what is sent and never answers."""

    def __init__(self) -> None:
        super().__init__()
        self.sent = bytearray()
        self.ended = False

    async def _send(self, data: bytes) -> None:
        self.sent += data

    def _ended(self) -> bool:
        return self.ended

    async def _end(self) -> None:
        self.ended = True


def test_a_digest_is_64_lowercase_hex_or_none() -> None:
    good = "ab" * 32
    assert checked_digest(good.encode()) == good
    for bad in (b"-", b"AB" * 32, good.encode() + b"0", b"zz" * 32, b"\xff" * 64):
        assert checked_digest(bad) is None


def test_a_folder_is_absolute_one_line_and_bounded() -> None:
    assert checked_folder(b"/tmp/x", "runner folder", "the pod") == "/tmp/x"
    for bad in (b"tmp", b"/a\nb", b"/" + b"a" * 5000, b""):
        with pytest.raises(ProviderError, match="the pod gave no usable runner folder"):
            checked_folder(bad, "runner folder", "the pod")


def test_the_environment_is_bounded_and_drops_the_shells_own() -> None:
    items = [b"A=1", b"PWD=/x", b"_=/bin/sh", b"noequals", b"=v", b"B=x=y"]
    assert sandbox_environment(items) == {"A": "1", "B": "x=y"}
    many = [f"V{i}=1".encode() for i in range(10_000)]
    assert len(sandbox_environment(many)) == 4096


def test_the_runner_is_named_by_its_content() -> None:
    binary = RunnerBinary(path=Path("/x"), sha256="c" * 64, size=1)
    assert runner_name(binary) == ".sandbox-runner-" + "c" * 16


async def test_a_runner_that_answers_garbage_is_a_provider_error_and_the_link_ends() -> None:
    reader = asyncio.StreamReader()
    reader.feed_data(b"\xff" * 64)  # not a frame
    reader.feed_eof()
    writer = SinkExec()
    with pytest.raises(ProviderError, match=r"the runner in the pod did not answer.*: no exec"):
        await hello_through(
            reader, writer, stderr=lambda: "no exec\n", close=writer.wait_closed, where="the pod"
        )
    assert writer.sent  # our HELLO went out first


async def test_a_cancelled_hello_closes_the_link() -> None:
    reader = asyncio.StreamReader()  # never answers
    writer = SinkExec()
    closed = asyncio.Event()

    async def close() -> None:
        closed.set()

    hello = asyncio.ensure_future(
        hello_through(reader, writer, stderr=lambda: "", close=close, where="the sandbox")
    )
    while not writer.sent:  # HELLO written: the hello waits for the answer now
        await asyncio.sleep(0)
    hello.cancel()
    with pytest.raises(asyncio.CancelledError):
        await hello
    assert closed.is_set()
