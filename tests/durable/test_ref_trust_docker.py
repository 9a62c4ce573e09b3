"""What an authentic docker ref says is still checked at resume (the real engine): the
engine it names is not used unless the caller names it, and a container it says the
session created is removed only if the engine shows our label on it.

Each hostile ref is rebuilt in code from a real session's ref and serialized again
(which seals it): an authentic ref whose content the library must still not trust."""

from __future__ import annotations

import asyncio
import dataclasses
import secrets
from collections.abc import Iterator

import pytest

import sandbox
from sandbox.errors import InvalidArgumentError, RefNotTrustedError
from tests.backend_fixtures import docker as docker_fixture

pytestmark = pytest.mark.skipif(
    docker_fixture.skip_reason() is not None, reason=str(docker_fixture.skip_reason())
)


def _api():  # type: ignore[no-untyped-def]
    import docker

    return docker.APIClient(version="auto")


def _exists(container: str) -> bool:
    import docker

    try:
        _api().inspect_container(container)
    except docker.errors.NotFound:
        return False
    return True


@pytest.fixture
def foreign_container() -> Iterator[str]:
    """A running container the library did not make (no label), removed afterwards."""
    api = _api()
    name = f"not-ours-{secrets.token_hex(4)}"
    api.create_container(docker_fixture.image(), command=["sleep", "600"], name=name)
    api.start(name)
    try:
        yield name
    finally:
        api.remove_container(name, force=True)


async def test_a_created_claim_on_a_container_the_library_did_not_make_removes_nothing(
    foreign_container,
):
    attached = sandbox.open_session("docker", container=foreign_container)
    await attached.start()
    ref = await attached.detach()
    assert ref.sandbox["created_name"] is None
    # The same authentic ref, now claiming the session created that container.
    hostile = dataclasses.replace(ref, sandbox={**ref.sandbox, "created_name": foreign_container})
    with pytest.raises(RefNotTrustedError, match="did not make it") as caught:
        async with sandbox.resume_session(hostile.to_json()):
            pass
    assert "sandbox.session" in str(caught.value)
    assert _exists(foreign_container)


async def test_a_created_container_is_still_removed_by_the_resumed_close():
    session = sandbox.open_session("docker", image=docker_fixture.image())
    await session.start()
    container = session.container_id
    assert container is not None
    labels = _api().inspect_container(container)["Config"]["Labels"]
    ref = await session.detach()
    assert labels["sandbox.session"] == ref.session_id
    async with sandbox.resume_session(ref.to_json()) as resumed:
        assert (await resumed.exec("echo", "ok")).stdout == b"ok\n"
    assert not _exists(container)


class Listener:
    """A loopback TCP server that counts the connections it gets (the "attacker")."""

    def __init__(self) -> None:
        self.connections = 0
        self.received = bytearray()
        self.server: asyncio.Server | None = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            self.received.extend(await reader.read(65536))
        finally:
            writer.close()

    async def __aenter__(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        return f"tcp://127.0.0.1:{port}"

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()
        await self.server.wait_closed()


async def test_a_ref_made_against_another_engine_is_refused_and_that_engine_gets_nothing(
    monkeypatch,
):
    monkeypatch.delenv("DOCKER_HOST", raising=False)
    session = sandbox.open_session("docker", image=docker_fixture.image())
    await session.start()
    container = session.container_id
    assert container is not None
    ref = await session.detach()
    assert ref.sandbox["engine"] == "unix:///var/run/docker.sock"
    listener = Listener()
    try:
        async with listener as attacker:
            hostile = dataclasses.replace(
                ref,
                sandbox={**ref.sandbox, "engine": attacker},
                options={**ref.options, "api_url": attacker},
            )
            with pytest.raises(InvalidArgumentError) as caught:
                async with sandbox.resume_session(hostile.to_json()):
                    pass
            message = str(caught.value)
            assert attacker in message and "unix:///var/run/docker.sock" in message
            assert f"api_url={attacker!r}" in message
            assert listener.connections == 0 and not listener.received
    finally:
        # The real engine, named by the caller: the resume works and removes it.
        async with sandbox.resume_session(
            ref.to_json(), api_url="unix:///var/run/docker.sock"
        ) as resumed:
            assert (await resumed.exec("echo", "ok")).stdout == b"ok\n"
    assert not _exists(container)
