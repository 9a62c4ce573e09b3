"""Conformance fixture for the `kubernetes` backend: the loopback API server
(`sandbox.testing.kubernetes_server`), a kubeconfig pointing at it, real sockets and
real processes behind it."""

from __future__ import annotations

import importlib.util
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import sandbox
from sandbox.testing import conformance

TOKEN = "conformance-token-5d2e9b"


def skip_reason() -> str | None:
    for module in ("aiohttp", "kubernetes_asyncio"):
        if importlib.util.find_spec(module) is None:
            return f"{module} is not installed: pip install 'agent-sandbox-pty[kubernetes]'"
    return None


@asynccontextmanager
async def environment(tmp_path: Path) -> AsyncIterator[sandbox.BaseSandboxSession]:
    from sandbox.testing.kubernetes_server import KubernetesApiServer

    async with KubernetesApiServer(token=TOKEN, root=tmp_path / "cluster") as server:
        kubeconfig = server.write_kubeconfig(tmp_path / "kubeconfig")
        yield sandbox.open_session("kubernetes", kubeconfig=str(kubeconfig), image="busybox")
        # Closing the session deleted its pod, and with it every process.
        assert server.pods == {}, "the session's pod was not deleted"
        assert server.live_processes() == 0


BACKEND = conformance.Backend(
    name="kubernetes",
    session=conformance.fixture_session(environment),
    capabilities={"files", "open_stdin", "resize", "signals"},
    skip_reason=skip_reason,
)
