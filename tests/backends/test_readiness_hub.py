"""`ReadinessHub` (sandbox.local.readiness): many fds behind one loop registration.

Real pipes on the running loop: a write makes the read end readable, the hub's epoll
set becomes readable in turn, and the loop calls the hub, which calls the fd's reader.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sandbox.backends.unix_local import UnixLocalSession
from sandbox.local.readiness import ReadinessHub
from tests.helpers import open_fds


@pytest.fixture
def pipes() -> Iterator[list[tuple[int, int]]]:
    made: list[tuple[int, int]] = []
    for _ in range(3):
        r, w = os.pipe()
        os.set_blocking(r, False)
        made.append((r, w))
    yield made
    for r, w in made:
        os.close(r)
        os.close(w)


async def test_a_reader_is_called_while_its_fd_is_readable(
    pipes: list[tuple[int, int]],
) -> None:
    hub = ReadinessHub(asyncio.get_running_loop())
    (r, w), (quiet, _) = pipes[0], pipes[1]
    calls: list[tuple[str, bytes]] = []
    called = asyncio.Event()

    def read_one(name: str) -> None:
        calls.append((name, os.read(r, 1)))  # one byte a call: the rest stays readable
        called.set()

    hub.add_reader(r, read_one, "first")
    hub.add_reader(quiet, lambda: calls.append(("quiet", b"")))
    os.write(w, b"ab")
    while len(calls) < 2:
        called.clear()
        await called.wait()
    # Level-triggered: the byte left unread made the fd readable again.
    assert calls == [("first", b"a"), ("first", b"b")]
    assert hub.remove_reader(r) and not hub.remove_reader(r)
    os.write(w, b"c")
    # A sentinel written after it: once its reader ran, the hub had polled both fds.
    sentinel_r, sentinel_w = pipes[2]
    sentinel = asyncio.Event()
    hub.add_reader(sentinel_r, sentinel.set)
    os.write(sentinel_w, b"s")
    await sentinel.wait()
    assert calls == [("first", b"a"), ("first", b"b")]
    assert os.read(r, 10) == b"c", "unread: nobody read it after the removal"
    hub.close()


async def test_a_failing_reader_is_reported_and_the_others_still_run(
    pipes: list[tuple[int, int]],
) -> None:
    loop = asyncio.get_running_loop()
    reported: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _loop, context: reported.append(context))
    hub = ReadinessHub(loop)
    seen: list[int] = []
    done = asyncio.Event()

    def fail() -> None:
        hub.remove_reader(pipes[0][0])
        raise ValueError("reader broke")

    def ok(fd: int) -> None:
        seen.append(len(os.read(fd, 100)))
        done.set()

    hub.add_reader(pipes[0][0], fail)
    hub.add_reader(pipes[1][0], ok, pipes[1][0])
    os.write(pipes[0][1], b"x")
    os.write(pipes[1][1], b"yy")
    await done.wait()
    assert seen == [2]
    assert [type(c["exception"]) for c in reported] == [ValueError]
    hub.close()


async def test_a_reader_removed_by_an_earlier_one_is_not_called(
    pipes: list[tuple[int, int]],
) -> None:
    hub = ReadinessHub(asyncio.get_running_loop())
    (a, wa), (b, wb) = pipes[0], pipes[1]
    order: list[str] = []
    woke = asyncio.Event()

    def first(mine: int, other: int, name: str) -> None:
        os.read(mine, 10)
        order.append(name)
        hub.remove_reader(other)  # whichever runs first removes the other
        hub.remove_reader(mine)
        woke.set()

    hub.add_reader(a, first, a, b, "a")
    hub.add_reader(b, first, b, a, "b")
    os.write(wa, b"1")
    os.write(wb, b"1")
    await woke.wait()
    await asyncio.sleep(0)
    assert len(order) == 1
    hub.close()


async def test_close_releases_the_epoll_fd_and_refuses_more() -> None:
    fds = open_fds()
    hub = ReadinessHub(asyncio.get_running_loop())
    assert open_fds() == fds + 1
    hub.close()
    hub.close()
    assert open_fds() == fds
    r, w = os.pipe()
    try:
        with pytest.raises(RuntimeError, match="closed"):
            hub.add_reader(r, lambda: None)
    finally:
        os.close(r)
        os.close(w)


async def test_a_session_s_hub_lives_from_its_start_to_its_close(tmp_path: Path) -> None:
    fds = open_fds()
    async with UnixLocalSession(workdir=tmp_path / "ws") as s:
        for tty in (False, True):
            update = await s.pty_exec_start("echo through the hub", tty=tty)
            assert update.output.replace("\r\n", "\n") == "through the hub\n"
        running = await s.pty_exec_start("echo up; exec cat", tty=True, until="up")
        assert running.process_id is not None
        echoed = await s.pty_write_stdin(running.process_id, "ping\n", until="ping\r\nping")
        assert "ping\r\nping" in echoed.output
        assert (await s.exec("echo one-shot")).stdout == b"one-shot\n"
    assert open_fds() == fds
