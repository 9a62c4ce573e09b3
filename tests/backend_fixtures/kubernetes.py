"""Conformance fixture for the `kubernetes` backend as it is opened by default: through
the runner (docs/runner.md) where this install has it (`runner` left to its default,
auto), else the per-exec path; on the loopback API server
(`sandbox.testing.kubernetes_server`), a kubeconfig pointing at it, real sockets and
real processes behind it. The runner is put into each pod by an exec with stdin and
really runs there (a local process in the pod's runner folder). The per-exec path is
covered on its own by the `kubernetes_exec` fixture (`runner=False`).

After each session: the pod is deleted, no process of it is left, no exec is served,
and no process that mentions the pod's runner folder (the runner, its bridge, its
keepers) is left on the host, nor the folder itself; a session of an install with the
runner used it.
"""

from __future__ import annotations

import importlib.util
import os
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import sandbox
from sandbox.runner import runner_binary
from sandbox.testing import conformance

TOKEN = "conformance-token-5d2e9b"


def skip_reason() -> str | None:
    for module in ("aiohttp", "kubernetes_asyncio"):
        if importlib.util.find_spec(module) is None:
            return f"{module} is not installed: pip install 'agent-sandbox-pty[kubernetes]'"
    return None


def processes_mentioning(needles: list[str]) -> list[str]:
    """Command lines of live host processes that mention one of `needles`."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                line = f.read(65536).replace(b"\0", b" ").decode("utf-8", "replace")
            with open(f"/proc/{name}/stat", "rb") as f:
                if f.read().rsplit(b")", 1)[1].split()[0] == b"Z":
                    continue
        except (OSError, IndexError):
            continue
        if any(needle in line for needle in needles):
            found.append(line)
    return found


def assert_runner_gone(runner_dirs: list[str], timeout: float = 10.0) -> None:
    """Fail unless, within `timeout`, nothing of these runner folders is left."""
    deadline = time.monotonic() + timeout
    while True:
        left = processes_mentioning(runner_dirs)
        folders = [d for d in runner_dirs if os.path.exists(d)]
        if not left and not folders:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"left behind: processes {left}, folders {folders}")
        time.sleep(0.05)


@asynccontextmanager
async def environment(tmp_path: Path) -> AsyncIterator[sandbox.BaseSandboxSession]:
    from sandbox.testing.kubernetes_server import KubernetesApiServer

    async with KubernetesApiServer(token=TOKEN, root=tmp_path / "cluster") as server:
        kubeconfig = server.write_kubeconfig(tmp_path / "kubeconfig")
        session = sandbox.open_session(
            "kubernetes", kubeconfig=str(kubeconfig), image="busybox", terminate_grace_s=0.5
        )
        yield session
        # The default is the runner wherever this install has it: a session that fell
        # back would run this suite on the per-exec path twice and the runner's never.
        if runner_binary() is not None:
            assert session.runner_fallback_reason is None, session.runner_fallback_reason
            assert session.keeps_processes
        # Closing the session deleted its pod: its runner and every process with it.
        assert server.pods == {}, "the session's pod was not deleted"
        assert server.live_processes() == 0
        assert server.open_execs() == 0, "an exec (the runner's bridge?) is still served"
        assert_runner_gone(list(server.runner_dirs))


BACKEND = conformance.Backend(
    name="kubernetes",
    session=conformance.fixture_session(environment),
    capabilities={"files", "open_stdin", "resize", "signals"},
    skip_reason=skip_reason,
)
