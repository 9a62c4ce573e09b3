"""blaxel resource limits: `memory_limit_bytes` reaches Blaxel's create as `memory` in
MiB; what Blaxel does not offer is refused, naming the option, before any call."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("blaxel", reason="the blaxel extra is not installed")
pytest.importorskip("aiohttp", reason="the blaxel extra is not installed")

import sandbox
from sandbox.testing.blaxel_server import BlaxelServer
from tests.backends.test_blaxel import make_session, server

__all__ = ["server"]

GIB = 1024**3


async def test_memory_limit_reaches_the_create_in_mib(server: BlaxelServer, tmp_path: Path) -> None:
    async with make_session(server, tmp_path, memory_limit_bytes=3 * GIB) as s:
        record = server.sandboxes[s.sandbox_name].record
        assert record["spec"]["runtime"]["memory"] == 3 * 1024
        assert (await s.exec("echo", "up", shell=False)).stdout == b"up\n"


@pytest.mark.parametrize(
    ("options", "error", "named"),
    [
        ({"cpu_limit": 1.5}, sandbox.UnsupportedOperationError, "cpu_limit"),
        ({"process_limit": 64}, sandbox.UnsupportedOperationError, "process_limit"),
        ({"memory_limit_bytes": GIB + 1}, sandbox.InvalidArgumentError, "whole number of MiB"),
        ({"memory_limit_bytes": 0}, sandbox.InvalidArgumentError, "memory_limit_bytes"),
        ({"memory_limit_bytes": "1G"}, sandbox.InvalidArgumentError, "memory_limit_bytes"),
        ({"memory": 512}, sandbox.InvalidArgumentError, "memory= is now memory_limit_bytes="),
    ],
)
def test_limits_blaxel_cannot_take_are_refused_before_any_call(
    server: BlaxelServer,
    tmp_path: Path,
    options: dict[str, object],
    error: type[Exception],
    named: str,
) -> None:
    with pytest.raises(error, match=named):
        make_session(server, tmp_path, **options)
    assert server.requests == []
    with pytest.raises(error, match=named):
        sandbox.open_session("blaxel", **server.backend_options(workdir=str(tmp_path), **options))
