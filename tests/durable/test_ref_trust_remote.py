"""An authentic ref of a remote backend whose endpoint was changed is refused at resume,
and the credential from the environment never reaches the ref's endpoint (cloudflare and
blaxel against their loopback stand-ins, with a second loopback server as the
"attacker"; daytona against its SDK fake, whose client the test sees made).

Each hostile ref is rebuilt in code from a real session's ref and serialized again
(which seals it): an authentic ref whose content the library must still not trust."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

import sandbox
from sandbox.errors import InvalidArgumentError
from sandbox.testing.blaxel_server import BlaxelServer
from sandbox.testing.cloudflare_server import CloudflareWorkerServer
from sandbox.testing.daytona_fake import FakeDaytona
from tests.backend_fixtures.daytona import API_KEY as DAYTONA_KEY

CF_KEY = "cf-trust-key-SECRET-31c0"
BL_KEY = "bl-trust-key-SECRET-7d2a"
BL_WORKSPACE = "trust-workspace"


class Listener:
    """A loopback HTTP-ish server that records every byte that reaches it."""

    def __init__(self) -> None:
        self.received = bytearray()
        self.connections = 0
        self.server: asyncio.Server | None = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            self.received.extend(await reader.read(65536))
            writer.write(b"HTTP/1.1 500 Nope\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
            await writer.drain()
        finally:
            writer.close()

    async def __aenter__(self) -> Listener:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()
        await self.server.wait_closed()


@pytest.fixture
async def attacker() -> AsyncIterator[Listener]:
    async with Listener() as listener:
        yield listener


# ---- cloudflare -------------------------------------------------------------------------


async def test_cloudflare_a_ref_naming_another_worker_is_refused_and_gets_no_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, attacker: Listener
):
    async with CloudflareWorkerServer(api_key=CF_KEY, root=tmp_path / "worker") as server:
        monkeypatch.setenv("CLOUDFLARE_SANDBOX_WORKER_URL", server.url)
        monkeypatch.setenv("CLOUDFLARE_SANDBOX_API_KEY", CF_KEY)
        session = sandbox.open_session("cloudflare")
        await session.start()
        ref = await session.detach()
        hostile = dataclasses.replace(ref, options={**ref.options, "worker_url": attacker.url})
        with pytest.raises(InvalidArgumentError) as caught:
            async with sandbox.resume_session(hostile.to_json()):
                pass
        message = str(caught.value)
        assert attacker.url in message and server.url in message
        assert f"worker_url={attacker.url!r}" in message and CF_KEY not in message
        assert attacker.connections == 0 and CF_KEY.encode() not in attacker.received
        # The genuine ref resumes against this client's Worker, and the close deletes.
        async with sandbox.resume_session(ref.to_json()) as resumed:
            assert (await resumed.exec("echo", "ok")).stdout == b"ok\n"


# ---- blaxel -----------------------------------------------------------------------------


async def test_blaxel_a_ref_naming_another_api_is_refused_and_gets_no_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, attacker: Listener
):
    async with BlaxelServer(api_key=BL_KEY, workspace=BL_WORKSPACE, root=str(tmp_path)) as server:
        options = server.backend_options(workdir=str(tmp_path / "ws"), terminate_grace_s=0.3)
        session = sandbox.open_session("blaxel", **options)
        await session.start()
        ref = await session.detach()
        assert ref.options["api_url"] == server.api_url
        hostile = dataclasses.replace(ref, options={**ref.options, "api_url": attacker.url})
        monkeypatch.setenv("BL_API_KEY", BL_KEY)
        monkeypatch.setenv("BL_WORKSPACE", BL_WORKSPACE)
        with pytest.raises(InvalidArgumentError) as caught:
            async with sandbox.resume_session(hostile.to_json()):
                pass
        message = str(caught.value)
        assert attacker.url in message and f"api_url={attacker.url!r}" in message
        assert BL_KEY not in message
        assert attacker.connections == 0 and BL_KEY.encode() not in attacker.received
        # Named by the caller, the API is used.
        async with sandbox.resume_session(ref.to_json(), api_url=server.api_url) as resumed:
            assert (await resumed.exec("echo", "ok")).stdout == b"ok\n"
    assert server.live_processes() == 0


# ---- daytona ----------------------------------------------------------------------------


async def test_daytona_a_ref_naming_another_api_is_refused_before_any_client_is_made(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, attacker: Listener
):
    monkeypatch.setenv("DAYTONA_API_URL", "http://127.0.0.1:9/our-api")
    monkeypatch.setenv("DAYTONA_API_KEY", DAYTONA_KEY)
    async with FakeDaytona(api_key=DAYTONA_KEY, root=tmp_path) as fake:
        configs: list[Any] = []

        def client(config: Any) -> Any:
            # The SDK's client class, as the session makes it: seen, then the fake's.
            configs.append(config)
            return fake.AsyncDaytona(config)

        session = sandbox.open_session("daytona", daytona_class=client, terminate_grace_s=0.3)
        await session.start()
        ref = await session.detach()
        assert ref.options["api_url"] == "http://127.0.0.1:9/our-api"
        made = len(configs)
        hostile = dataclasses.replace(ref, options={**ref.options, "api_url": attacker.url})
        with pytest.raises(InvalidArgumentError) as caught:
            async with sandbox.resume_session(hostile.to_json(), daytona_class=client):
                pass
        message = str(caught.value)
        assert attacker.url in message and "http://127.0.0.1:9/our-api" in message
        assert f"api_url={attacker.url!r}" in message and DAYTONA_KEY not in message
        assert len(configs) == made  # no client was made for the ref's API
        assert all(getattr(c, "api_url", None) != attacker.url for c in configs)
        async with sandbox.resume_session(ref.to_json(), daytona_class=client) as resumed:
            assert (await resumed.exec("echo", "ok")).stdout == b"ok\n"
        assert attacker.connections == 0
