"""Live suite for the `kubernetes` backend: runs against a real cluster.

Runs only with `-m integration` (`make test-integration`) and `KUBECONFIG` set (to a
reachable cluster); otherwise every test skips and says why. One pod (image
`SANDBOX_K8S_IMAGE`, default `busybox:1.36`) serves the whole module and is deleted at
the end. For a dry run, point `KUBECONFIG` at a kubeconfig a `KubernetesApiServer`
wrote (with `sandbox-test/no-such-image:0` in its `missing_images`).

The common flow is `LiveSuite` (tests/integration/live_flow.py).
"""

from __future__ import annotations

import os

import pytest

import sandbox
from tests.integration.live_flow import LiveSuite, Requirements, live_session

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="module")]

REQUIRES = Requirements(
    "Kubernetes",
    "kubernetes",
    {"kubernetes_asyncio": "kubernetes_asyncio", "aiohttp": "aiohttp"},
    ("KUBECONFIG",),
    unset="no cluster configured",
    suite="this suite",
)
IMAGE = os.environ.get("SANDBOX_K8S_IMAGE", "busybox:1.36")

live = live_session(REQUIRES, lambda: sandbox.open_session("kubernetes", image=IMAGE))


class TestKubernetes(LiveSuite):
    exec_timeout_s = 3.0
    exec_timeout_bound_s = 30.0

    async def test_pod_is_labelled_and_never_restarted(
        self, live: sandbox.BaseSandboxSession
    ) -> None:
        assert (await live.exec("echo $HOSTNAME")).stdout.strip() == str(
            getattr(live, "pod_name", "")
        ).encode()

    async def test_files_stay_in_the_workspace(self, live: sandbox.BaseSandboxSession) -> None:
        await live.write_file("live/notes.txt", b"hello")
        assert await live.read_file("/workspace/live/notes.txt") == b"hello"
        assert (await live.exec("cat live/notes.txt")).stdout == b"hello"
        with pytest.raises(sandbox.WorkspacePathError):
            await live.read_file("/etc/hostname")

    async def test_missing_image_is_a_clear_error(self) -> None:
        REQUIRES.skip_if_missing()
        session = sandbox.open_session(
            "kubernetes", image="sandbox-test/no-such-image:0", create_timeout_s=120
        )
        with pytest.raises(sandbox.ProviderError, match=r"ErrImagePull|ImagePullBackOff"):
            await session.start()
        await session.aclose()
