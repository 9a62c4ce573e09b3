"""What an authentic kubernetes ref says is still checked at resume, and a kubeconfig is
checked before it is used (the loopback API server, `sandbox.testing.kubernetes_server`).

Each hostile ref is rebuilt in code from a real session's ref and serialized again
(which seals it): an authentic ref whose content the library must still not trust."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

import sandbox
from sandbox.backends.kubernetes import KubernetesSession
from sandbox.errors import CredentialsMissingError, InvalidArgumentError, RefNotTrustedError
from sandbox.testing.kubernetes_server import KubernetesApiServer
from tests.helpers import eventually

TOKEN = "k8s-trust-token-SECRET-5b1f"
PLUGIN_SECRET = "plugin-stderr-SECRET-9c3e7a"


@pytest.fixture
async def server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[KubernetesApiServer]:
    # This client's own kubeconfig, found through the environment.
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "kubeconfig"))
    async with KubernetesApiServer(token=TOKEN, root=tmp_path / "cluster") as srv:
        srv.write_kubeconfig(tmp_path / "kubeconfig")
        yield srv


def _open(**options: Any) -> KubernetesSession:
    options.setdefault("image", "busybox")
    s = sandbox.open_session("kubernetes", terminate_grace_s=0.2, **options)
    assert isinstance(s, KubernetesSession)
    return s


def _plugin(tmp_path: Path, name: str, body: str) -> Path:
    script = tmp_path / name
    script.write_text(f"#!/bin/sh\n{body}\n")
    script.chmod(0o755)
    return script


def _plugin_kubeconfig(path: Path, server_url: str, plugin: Path) -> Path:
    """A kubeconfig whose user's credentials come from the exec plugin `plugin`."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": server_url}}],
        "users": [
            {
                "name": "u",
                "user": {
                    "exec": {
                        "apiVersion": "client.authentication.k8s.io/v1beta1",
                        "command": str(plugin),
                    }
                },
            }
        ],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "x",
    }
    path.write_text(json.dumps(config))
    return path


class Listener:
    """A loopback TCP server that records what reaches it (the "attacker")."""

    def __init__(self) -> None:
        self.received = bytearray()
        self.connections = 0
        self.server: asyncio.Server | None = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            self.received.extend(await reader.read(65536))
        finally:
            writer.close()

    async def __aenter__(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()
        await self.server.wait_closed()


async def test_a_ref_made_against_another_api_server_is_refused_and_it_gets_nothing(
    server, tmp_path
):
    session = _open()
    await session.start()
    ref = await session.detach()
    assert ref.sandbox["server"] == server.url
    listener = Listener()
    async with listener as attacker:
        elsewhere = tmp_path / "elsewhere.kubeconfig"
        elsewhere.write_text(
            json.dumps(
                {
                    "clusters": [{"name": "a", "cluster": {"server": attacker}}],
                    "users": [{"name": "a", "user": {"token": "attacker-side"}}],
                    "contexts": [{"name": "a", "context": {"cluster": "a", "user": "a"}}],
                    "current-context": "a",
                }
            )
        )
        hostile = dataclasses.replace(
            ref,
            sandbox={**ref.sandbox, "server": attacker},
            options={**ref.options, "kubeconfig": str(elsewhere), "context": "a"},
        )
        with pytest.raises(InvalidArgumentError) as caught:
            async with sandbox.resume_session(hostile.to_json()):
                pass
        message = str(caught.value)
        assert attacker in message and server.url in message
        assert f"kubeconfig={str(elsewhere)!r}" in message
        assert listener.connections == 0 and not listener.received
    # Resumed from this client's kubeconfig, the real ref works and deletes its pod.
    async with sandbox.resume_session(ref.to_json()) as resumed:
        assert (await resumed.exec("true")).exit_code == 0
    assert await eventually(lambda: server.pods == {})


async def test_a_kubeconfig_named_by_a_ref_alone_is_never_loaded(server, tmp_path):
    ran = tmp_path / "plugin-ran"
    plugin = _plugin(tmp_path, "ref-plugin", f"touch {ran}; exit 1")
    named = _plugin_kubeconfig(tmp_path / "named.kubeconfig", server.url, plugin)
    session = _open()
    await session.start()
    ref = await session.detach()
    # The same API server, but a kubeconfig whose exec plugin runs code.
    hostile = dataclasses.replace(ref, options={**ref.options, "kubeconfig": str(named)})
    async with sandbox.resume_session(hostile.to_json()) as resumed:
        assert isinstance(resumed, KubernetesSession)
        assert (await resumed.exec("true")).exit_code == 0
        assert resumed.ref().options["kubeconfig"] == str(tmp_path / "kubeconfig")
    assert not ran.exists()
    assert await eventually(lambda: server.pods == {})


async def test_a_created_claim_on_a_pod_of_another_session_deletes_nothing(server):
    async with _open(keep=True) as first:
        name = first.pod_name
    attached = _open(image=None, pod=name)
    await attached.start()
    ref = await attached.detach()
    assert ref.sandbox["created"] is None
    # The same authentic ref, now claiming its session created that pod.
    hostile = dataclasses.replace(ref, sandbox={**ref.sandbox, "created": name})
    with pytest.raises(RefNotTrustedError, match="did not make it"):
        async with sandbox.resume_session(hostile.to_json()):
            pass
    assert list(server.pods) == [("default", name)] and server.deleted == []


async def test_a_failing_exec_plugin_is_named_with_its_status_and_its_stderr_is_nowhere(
    server, tmp_path, caplog
):
    plugin = _plugin(tmp_path, "cred-helper", f"echo 'token: {PLUGIN_SECRET}' >&2; exit 3")
    kubeconfig = _plugin_kubeconfig(tmp_path / "plugin.kubeconfig", server.url, plugin)
    caplog.set_level(logging.DEBUG)
    session = _open(kubeconfig=str(kubeconfig))
    with pytest.raises(CredentialsMissingError) as caught:
        await session.start()
    message = str(caught.value)
    assert "'cred-helper'" in message and "exit status 3" in message
    assert PLUGIN_SECRET not in message and PLUGIN_SECRET not in repr(caught.value)
    assert str(tmp_path) not in message  # the basename only
    assert all(PLUGIN_SECRET not in record.getMessage() for record in caplog.records)
    assert server.pods == {}


DEEP = "a: " + "[" * 5000 + "]" * 5000


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("clusters: [unclosed\n  - {", "not valid YAML"),
        ("- just\n- a list\n", "not a YAML mapping"),
        ('{"clusters": "a string", "contexts": [], "users": []}', "'clusters'"),
        ('{"users": [{"user": {"token": "t"}}]}', "'users'"),
        ('{"users": [{"name": "u", "user": "a string"}]}', "not a mapping"),
        ('{"current-context": ["x"]}', "'current-context'"),
        (DEEP, "nested"),
        ("a: " + "[" * 40 + "]" * 40, "nested more than"),
    ],
    ids=[
        "bad-yaml",
        "a-list",
        "clusters-type",
        "no-name",
        "user-type",
        "context-type",
        "very-deep",
        "deep",
    ],
)
async def test_a_malformed_kubeconfig_is_one_clear_error(server, tmp_path, text, why):
    path = tmp_path / "bad.kubeconfig"
    path.write_text(text)
    session = _open(kubeconfig=str(path))
    with pytest.raises(CredentialsMissingError) as caught:
        await session.start()
    message = str(caught.value)
    assert message.startswith(f"the kubeconfig {str(path)!r} could not be used")
    assert why in message and "\n" not in message
    error = caught.value  # no chained traceback shown under it
    assert error.__cause__ is None and (error.__context__ is None or error.__suppress_context__)
    assert server.pods == {}


async def test_a_kubeconfig_with_fields_of_the_wrong_kind_deeper_in_is_one_clear_error(
    server, tmp_path
):
    path = tmp_path / "odd.kubeconfig"
    path.write_text(
        json.dumps(
            {
                "clusters": [{"name": "c", "cluster": {"server": 5}}],
                "users": [{"name": "u", "user": {"token": ["not", "a", "str"]}}],
                "contexts": [{"name": "x", "context": "c"}],
                "current-context": "x",
            }
        )
    )
    session = _open(kubeconfig=str(path))
    with pytest.raises(CredentialsMissingError) as caught:
        await session.start()
    assert str(caught.value).startswith("the kubeconfig")
    assert "\n" not in str(caught.value)
