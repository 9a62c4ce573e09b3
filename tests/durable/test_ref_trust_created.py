"""A resumed close deletes (or terminates) a blaxel, e2b, daytona or modal sandbox only if
the provider shows our `sandbox.session` mark with the ref's session id on it: a label
(blaxel, daytona), metadata (e2b) or a tag (modal), set when the library created it.

Each hostile ref is rebuilt in code from a real session's ref (attached to a sandbox
the library did not make, kept) and serialized again, which seals it: an authentic ref
whose claim the library must still check with the provider. The sandboxes are made
directly through each fake or stand-in, without our mark or with another session's."""

from __future__ import annotations

import dataclasses
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest

import sandbox
from sandbox.errors import RefNotTrustedError

MARK = "sandbox.session"
OTHER_SESSION = "0123456789abcdef"


@dataclasses.dataclass
class Provider:
    """One backend behind its fake: how to open and resume sessions there, make a
    sandbox without the library, and tell whether a sandbox still exists."""

    backend: str
    options: dict[str, Any]
    resume_options: dict[str, Any]
    make_foreign: Callable[[dict[str, str]], Awaitable[str]]
    exists: Callable[[str], Awaitable[bool]]
    attach_option: str


@asynccontextmanager
async def e2b_provider(tmp_path: Path) -> AsyncIterator[Provider]:
    pytest.importorskip("e2b")
    from sandbox.testing.e2b_fake import FakeE2B

    key = "e2b_ref_trust_key_0123456789abcdef"
    async with FakeE2B(api_key=key, root=tmp_path) as fake:

        async def make(metadata: dict[str, str]) -> str:
            made = await fake.AsyncSandbox.create(metadata=metadata, api_key=key)
            return str(made.sandbox_id)

        async def exists(sandbox_id: str) -> bool:
            try:
                await fake.AsyncSandbox.get_info(sandbox_id, api_key=key)
            except Exception:
                return False
            return True

        options = {"api_key": key, "sandbox_class": fake.AsyncSandbox, "teardown_timeout_s": 5.0}
        yield Provider("e2b", options, options, make, exists, "sandbox_id")


@asynccontextmanager
async def daytona_provider(tmp_path: Path) -> AsyncIterator[Provider]:
    pytest.importorskip("daytona")
    from daytona import CreateSandboxFromSnapshotParams, DaytonaConfig

    from sandbox.testing.daytona_fake import FakeDaytona
    from tests.backend_fixtures.daytona import API_KEY

    async with FakeDaytona(api_key=API_KEY, root=tmp_path) as fake:
        client = fake.AsyncDaytona(DaytonaConfig(api_key=API_KEY))

        async def make(labels: dict[str, str]) -> str:
            made = await client.create(CreateSandboxFromSnapshotParams(labels=labels))
            return str(made.id)

        async def exists(sandbox_id: str) -> bool:
            return sandbox_id in fake.sandboxes

        options = {"api_key": API_KEY, "daytona_class": fake.AsyncDaytona}
        try:
            yield Provider("daytona", options, options, make, exists, "sandbox_id")
        finally:
            await client.close()


@asynccontextmanager
async def modal_provider(tmp_path: Path) -> AsyncIterator[Provider]:
    pytest.importorskip("modal")
    from sandbox.testing.modal_fake import FakeModal

    fake = FakeModal()
    client = await fake.Client.from_credentials.aio("fake-token-id", "fake-token-secret")

    async def make(tags: dict[str, str]) -> str:
        app = await fake.App.lookup.aio("not-ours", create_if_missing=True, client=client)
        made = await fake.Sandbox.create.aio(
            app=app, tags=tags, workdir=str(tmp_path / "ws"), client=client
        )
        return str(made.object_id)

    async def exists(sandbox_id: str) -> bool:
        found = await fake.Sandbox.from_id.aio(sandbox_id, client=client)
        return await found.poll.aio() is None

    options = {
        "sdk": fake,
        "token_id": "fake-token-id",
        "token_secret": "fake-token-secret",
        "workdir": str(tmp_path / "ws"),
        "state_dir": str(tmp_path / "state"),
        "terminate_grace_s": 0.3,
    }
    try:
        resume = {k: options[k] for k in ("sdk", "token_id", "token_secret", "state_dir")}
        yield Provider("modal", options, resume, make, exists, "sandbox_id")
    finally:
        await client.close.aio()
        await fake.aclose()


@asynccontextmanager
async def blaxel_provider(tmp_path: Path) -> AsyncIterator[Provider]:
    pytest.importorskip("blaxel")
    from sandbox.testing.blaxel_server import BlaxelServer

    key, workspace = "bl-ref-trust-key-0123456789abcdef", "ref-trust-workspace"
    async with BlaxelServer(api_key=key, workspace=workspace, root=str(tmp_path)) as server:

        async def make(labels: dict[str, str]) -> str:
            # Straight to the control plane (`POST /sandboxes`), as another client would.
            name = f"not-ours-{secrets.token_hex(4)}"
            headers = {
                "X-Blaxel-Authorization": f"Bearer {key}",
                "X-Blaxel-Workspace": workspace,
            }
            body = {"metadata": {"name": name, "labels": labels}, "spec": {}}
            async with (
                aiohttp.ClientSession() as http,
                http.post(f"{server.api_url}/sandboxes", json=body, headers=headers) as answer,
            ):
                assert answer.status == 200, await answer.text()
            return name

        async def exists(name: str) -> bool:
            return name in server.sandboxes

        options = server.backend_options(workdir=str(tmp_path / "ws"), terminate_grace_s=0.3)
        resume = {k: options[k] for k in ("api_url", "api_key", "workspace")}
        yield Provider("blaxel", options, resume, make, exists, "sandbox_id")


PROVIDERS = {
    "blaxel": blaxel_provider,
    "e2b": e2b_provider,
    "daytona": daytona_provider,
    "modal": modal_provider,
}


def _sandbox_of(ref: sandbox.SessionRef) -> str:
    value = ref.sandbox.get("name", ref.sandbox.get("sandbox_id"))
    assert isinstance(value, str)
    return value


@pytest.mark.parametrize("backend", sorted(PROVIDERS))
async def test_a_created_sandbox_is_still_deleted_by_the_resumed_close(
    backend: str, tmp_path: Path
) -> None:
    async with PROVIDERS[backend](tmp_path) as provider:
        session = sandbox.open_session(provider.backend, **provider.options)
        await session.start()
        ref = await session.detach()
        made = _sandbox_of(ref)
        assert ref.sandbox["created"] is True and ref.sandbox["keep"] is False
        assert await provider.exists(made)
        async with sandbox.resume_session(ref.to_json(), **provider.resume_options) as resumed:
            assert (await resumed.exec("echo", "ok")).stdout == b"ok\n"
            # A second generation still knows it created the sandbox.
            again = resumed.ref()
            assert again.sandbox["created"] is True
        assert not await provider.exists(made)


@pytest.mark.parametrize("mark", ["none", "another session"])
@pytest.mark.parametrize("claim", ["created", "attached"])
@pytest.mark.parametrize("backend", sorted(PROVIDERS))
async def test_a_ref_deleting_a_sandbox_the_library_did_not_make_is_refused(
    backend: str, claim: str, mark: str, tmp_path: Path
) -> None:
    async with PROVIDERS[backend](tmp_path) as provider:
        foreign = await provider.make_foreign({} if mark == "none" else {MARK: OTHER_SESSION})
        options = {**provider.options, provider.attach_option: foreign, "keep": True}
        attached = sandbox.open_session(provider.backend, **options)
        await attached.start()
        ref = await attached.detach()
        assert _sandbox_of(ref) == foreign
        assert ref.sandbox.get("created") is not True and ref.sandbox["keep"] is True
        # The same authentic ref, now saying its close deletes the sandbox (because the
        # session created it, or because it was told to delete the one it attached to).
        claimed = {**ref.sandbox, "keep": False, "created": claim == "created"}
        hostile = dataclasses.replace(ref, sandbox=claimed)
        with pytest.raises(RefNotTrustedError, match="did not make it") as caught:
            async with sandbox.resume_session(hostile.to_json(), **provider.resume_options):
                pass
        message = str(caught.value)
        assert MARK in message and repr(foreign) in message and ref.session_id in message
        assert await provider.exists(foreign)
        # The caller may still resume it, leaving it running.
        async with sandbox.resume_session(
            hostile.to_json(), **provider.resume_options, keep=True
        ) as resumed:
            assert (await resumed.exec("echo", "ok")).stdout == b"ok\n"
        assert await provider.exists(foreign)


@pytest.mark.parametrize("backend", sorted(PROVIDERS))
async def test_a_callers_value_for_our_mark_is_refused(backend: str, tmp_path: Path) -> None:
    given = {
        "blaxel": {"labels": {MARK: OTHER_SESSION}},
        "e2b": {"labels": {MARK: OTHER_SESSION}},
        "daytona": {"create_options": {"labels": {MARK: OTHER_SESSION}}},
        "modal": {"create_options": {"tags": {MARK: OTHER_SESSION}}},
    }[backend]
    async with PROVIDERS[backend](tmp_path) as provider:
        with pytest.raises(sandbox.InvalidArgumentError, match="library's own mark"):
            sandbox.open_session(provider.backend, **provider.options, **given)
