"""Conformance fixture for the `kubernetes` backend with `runner=True` (docs/runner.md),
on the loopback API server: the runner is put into each pod by an exec with stdin and
really runs there (a local process in the pod's runner folder).

After each session: the pod is deleted, no exec is served, and no process that mentions
the pod's runner folder (the runner, its bridge, its keepers) is left on the host, nor
the folder itself.
"""

from __future__ import annotations

import os
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import sandbox
from sandbox.runner import unavailable_reason
from sandbox.testing import conformance

from . import kubernetes as plain


def skip_reason() -> str | None:
    return plain.skip_reason() or unavailable_reason()


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

    async with KubernetesApiServer(token=plain.TOKEN, root=tmp_path / "cluster") as server:
        kubeconfig = server.write_kubeconfig(tmp_path / "kubeconfig")
        yield sandbox.open_session(
            "kubernetes",
            kubeconfig=str(kubeconfig),
            image="busybox",
            runner=True,
            terminate_grace_s=0.5,
        )
        # Closing the session deleted its pod: its runner and every process with it.
        assert server.pods == {}, "the session's pod was not deleted"
        assert server.live_processes() == 0
        assert server.open_execs() == 0, "an exec (the runner's bridge?) is still served"
        assert_runner_gone(list(server.runner_dirs))


BACKEND = conformance.Backend(
    name="kubernetes_runner",
    session=conformance.fixture_session(environment),
    capabilities={"files", "open_stdin", "resize", "signals"},
    skip_reason=skip_reason,
)
