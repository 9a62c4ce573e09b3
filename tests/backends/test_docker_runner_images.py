"""The runner in images of every shape it must run in (issue: "runs as any uid in
busybox, alpine, debian-slim and distroless-with-a-shell images"), with no registry:
the busybox image, the minimal one (only `sh`, `cat` and `sleep`, not even /tmp: a
distroless image with a shell) and the glibc one (the host's dynamically linked dash
and coreutils with their C library: debian-slim's userland), each as root, as a named
user and as a uid no passwd file names. The runner is static, so the image's C library
(glibc here, musl on alpine) is never loaded: what differs between images is the
folders and programs they have, which these three span.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable

import pytest

import sandbox
from sandbox.backends.docker import DockerSession
from sandbox.runner import unavailable_reason
from sandbox.testing import docker_image
from tests.backend_fixtures import docker as fx
from tests.conftest import skip_or_fail

# Each image, and the workdir a session there uses: the minimal image's own (/work; it
# has no /tmp, which the runner's delivery makes 1777 as usual images have it).
IMAGES: dict[str, tuple[Callable[[], str], str | None]] = {
    "busybox": (docker_image.ensure_busybox_image, "/tmp/w"),
    "distroless-like (sh, cat, sleep; no /tmp)": (docker_image.ensure_minimal_image, None),
    "glibc (debian-slim-like)": (docker_image.ensure_glibc_image, "/tmp/w"),
}
CASE_LABEL = "sandbox.test.case"
USERS = {"root": ("0", None), "named user": ("1000", "1000"), "unnamed uid": ("54321", "54321:7")}


@pytest.fixture(autouse=True)
def _engine() -> None:
    reason = fx.skip_reason() or unavailable_reason()
    if reason:
        skip_or_fail(f"docker runner: {reason}")


@pytest.mark.parametrize("user", list(USERS))
@pytest.mark.parametrize("image", list(IMAGES))
async def test_the_runner_runs_in_the_image_as_the_user(image: str, user: str) -> None:
    build, workdir = IMAGES[image]
    tag = build()
    uid, option = USERS[user]
    label = secrets.token_hex(6)
    session = sandbox.open_session(
        "docker",
        image=tag,
        user=option,
        workdir=workdir,
        network_mode="none",
        labels={CASE_LABEL: label},
        runner=True,
    )
    assert isinstance(session, DockerSession)
    try:
        async with session as s:
            assert s.uses_runner and s.keeps_processes
            status = await s.exec("cat", "/proc/self/status")
            assert status.exit_code == 0, status.stderr
            uids = [line.split()[1:] for line in status.stdout.decode().splitlines()
                    if line.startswith("Uid:")]  # fmt: skip
            assert uids == [[uid] * 4]
            # A terminal, and pipes whose stdin ends by close_stdin (cat gets its EOF).
            term = await s.pty_exec_start("echo ready; exec cat", tty=True, until="ready")
            assert term.process_id is not None and b"ready" in term.output.encode()
            piped = await s.pty_exec_start("cat", tty=False, stdin=True)
            assert piped.process_id is not None
            update = await s.pty_write_stdin(piped.process_id, "through stdin\n")
            output = update.output
            await s.pty_close_stdin(piped.process_id)
            while update.exit_code is None:
                update = await s.pty_write_stdin(piped.process_id, yield_time_s=10)
                output += update.output
            assert update.exit_code == 0 and output == "through stdin\n"
            await s.pty_terminate(term.process_id)
    finally:
        await session.aclose()
        # The session made its container, so its close removed it.
        assert fx._client().containers(all=True, filters={"label": f"{CASE_LABEL}={label}"}) == []
