"""Conformance fixture for the `kubernetes` backend on its per-exec path (`runner=False`:
an exec per process, no runner), which sessions also take where this install has no
runner or the pod cannot take it (docs/runner.md); on the loopback API server
(`sandbox.testing.kubernetes_server`). The `kubernetes` fixture covers the default, the
runner.

After each session: the pod is deleted, no process of it is left, and no exec of it
was the runner's (nothing was put into the pod, nothing connected).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import sandbox
from sandbox.testing import conformance

from . import kubernetes as plain


def skip_reason() -> str | None:
    return plain.skip_reason()


@asynccontextmanager
async def environment(tmp_path: Path) -> AsyncIterator[sandbox.BaseSandboxSession]:
    from sandbox.testing.kubernetes_server import KubernetesApiServer

    async with KubernetesApiServer(token=plain.TOKEN, root=tmp_path / "cluster") as server:
        kubeconfig = server.write_kubeconfig(tmp_path / "kubeconfig")
        session = sandbox.open_session(
            "kubernetes", kubeconfig=str(kubeconfig), image="busybox", runner=False
        )
        yield session
        assert not session.keeps_processes
        assert session.runner_fallback_reason in (None, "runner=False")
        assert not any("sandbox-runner" in arg for argv in server.exec_argvs for arg in argv), (
            "a per-exec session ran the runner's execs"
        )
        # Closing the session deleted its pod, and with it every process.
        assert server.pods == {}, "the session's pod was not deleted"
        assert server.live_processes() == 0


BACKEND = conformance.Backend(
    name="kubernetes_exec",
    session=conformance.fixture_session(environment),
    capabilities={"files", "open_stdin", "resize", "signals"},
    skip_reason=skip_reason,
)
