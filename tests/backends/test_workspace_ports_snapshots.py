"""`expose_port` reaches a real HTTP server started in the sandbox (unix_local; docker
with a published port and by the container's address), a port that cannot be exposed
is a clear error, and docker's `snapshot()` reopens as a fresh container holding the
same files."""

from __future__ import annotations

import asyncio
import json
import socket
import urllib.error
import urllib.request
from pathlib import Path

import pytest

import sandbox
from tests.backend_fixtures import docker as docker_fixture
from tests.conftest import skip_or_fail

# `-u`: where the backend gives the server a pipe rather than a terminal, Python buffers
# its "Serving HTTP on ..." line, so `until="Serving"` would only end at its deadline.
HTTP_SERVER = "exec python3 -u -m http.server"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def _fetch(exposed: sandbox.ExposedPort, path: str) -> bytes:
    def get() -> bytes:
        request = urllib.request.Request(exposed.url + path, headers=dict(exposed.headers))
        with urllib.request.urlopen(request, timeout=30) as answer:
            return bytes(answer.read())

    # The server may still be binding: retry on a refused connection only.
    for _ in range(300):
        try:
            return await asyncio.to_thread(get)
        except OSError as exc:
            if "refused" not in str(exc).lower():
                raise
            await asyncio.sleep(0.1)
    raise AssertionError(f"nothing answered at {exposed.url}")


async def test_unix_local_exposes_a_loopback_server(tmp_path: Path) -> None:
    port = _free_port()
    async with sandbox.open_session("unix_local", workdir=tmp_path / "ws") as session:
        await session.write_file("site/hello.txt", b"hello from the sandbox")
        update = await session.pty_exec_start(
            f"cd site && {HTTP_SERVER} {port} --bind 127.0.0.1",
            until="Serving",
            yield_time_s=30,
        )
        assert update.process_id is not None and "Serving" in update.output, update
        exposed = await session.expose_port(port)
        assert (exposed.host, exposed.port, exposed.tls) == ("127.0.0.1", port, False)
        assert exposed.url == f"http://127.0.0.1:{port}/"
        assert await _fetch(exposed, "hello.txt") == b"hello from the sandbox"
        for bad in (0, 70000, "80", True):
            with pytest.raises(sandbox.InvalidArgumentError, match="port"):
                await session.expose_port(bad)  # type: ignore[arg-type]


async def test_a_confined_session_without_network_cannot_expose(tmp_path: Path) -> None:
    from sandbox.backends.unix_local import confine

    if not confine.availability()[0]:
        pytest.skip("no bubblewrap jail here")
    async with sandbox.open_session("unix_local", workdir=tmp_path, confine=True) as session:
        with pytest.raises(sandbox.UnsupportedOperationError, match="network=True"):
            await session.expose_port(8000)


def _docker_or_skip() -> str:
    reason = docker_fixture.skip_reason()
    if reason:
        skip_or_fail(f"docker: {reason}")
    return docker_fixture.image()


async def _serve(session: sandbox.BaseSandboxSession, port: int) -> None:
    """busybox httpd in the foreground, as a process the session owns."""
    await session.write_file("www/index.html", b"served by busybox")
    update = await session.pty_exec_start(f"exec httpd -f -p {port} -h www", yield_time_s=0.2)
    assert update.process_id is not None and update.exit_code is None, update


async def test_docker_published_port_and_container_address() -> None:
    image = _docker_or_skip()
    async with sandbox.open_session("docker", image=image, ports=[8080]) as session:
        await _serve(session, 8080)
        published = await session.expose_port(8080)
        assert published.host == "127.0.0.1" and published.port != 8080
        assert await _fetch(published, "index.html") == b"served by busybox"
        await _serve(session, 9090)
        direct = await session.expose_port(9090)  # not published: the bridge address
        assert direct.port == 9090 and direct.host not in ("127.0.0.1", "")
        assert await _fetch(direct, "index.html") == b"served by busybox"


async def test_docker_without_a_network_cannot_expose() -> None:
    image = _docker_or_skip()
    async with sandbox.open_session("docker", image=image, network=False) as session:
        with pytest.raises(sandbox.UnsupportedOperationError, match=r"ports=\[8080\]"):
            await session.expose_port(8080)


async def test_docker_snapshot_reopens_with_the_files() -> None:
    image = _docker_or_skip()
    import docker

    async with sandbox.open_session("docker", image=image, network=False) as session:
        await session.write_file("state/kept.txt", b"from before the snapshot")
        ref = await session.snapshot()
    try:
        text = ref.to_json()
        assert json.loads(text)["backend"] == "docker"
        assert sandbox.SnapshotRef.from_json(text) == ref
        async with sandbox.open_session("docker", snapshot=text, network=False) as reopened:
            assert await reopened.read_file("state/kept.txt") == b"from before the snapshot"
        with pytest.raises(sandbox.InvalidArgumentError, match="SnapshotRef of the unix_local"):
            sandbox.open_session("unix_local", snapshot=ref)
        with pytest.raises(sandbox.InvalidArgumentError, match="not a snapshot"):
            sandbox.SnapshotRef.from_json("{}")
    finally:
        docker.APIClient(version="auto").remove_image(ref.snapshot_id, force=True)


async def test_unix_local_has_no_snapshots(tmp_path: Path) -> None:
    async with sandbox.open_session("unix_local", workdir=tmp_path) as session:
        with pytest.raises(sandbox.UnsupportedOperationError, match="persist_workspace"):
            await session.snapshot()
    ref = sandbox.SnapshotRef(backend="unix_local", snapshot_id="x")
    with pytest.raises(sandbox.UnsupportedOperationError, match="hydrate_workspace"):
        sandbox.open_session("unix_local", snapshot=ref)


@pytest.mark.parametrize("name", ["e2b", "daytona", "cloudflare", "blaxel"])
async def test_remote_backends_expose_through_their_stand_ins(name: str, tmp_path: Path) -> None:
    import importlib

    fixture = importlib.import_module(f"tests.backend_fixtures.{name}").BACKEND
    if reason := fixture.skip_reason():
        skip_or_fail(f"{name}: {reason}")
    port = _free_port()
    async with fixture.session(tmp_path) as session:
        await session.write_file("site/hello.txt", b"through the preview")
        update = await session.pty_exec_start(
            f"cd site && {HTTP_SERVER} {port} --bind 127.0.0.1",
            until="Serving",
            yield_time_s=30,
        )
        assert update.process_id is not None and "Serving" in update.output, update
        exposed = await session.expose_port(port)
        assert await _fetch(exposed, "hello.txt") == b"through the preview"
        if name in ("daytona", "blaxel"):
            header = "X-Daytona-Preview-Token" if name == "daytona" else "X-Blaxel-Preview-Token"
            token = exposed.headers[header]
            assert token and token not in repr(exposed)
            bare = sandbox.ExposedPort(exposed.url, exposed.host, exposed.port)
            with pytest.raises(urllib.error.HTTPError, match="401"):
                await _fetch(bare, "hello.txt")
        if name == "blaxel":
            # The preview is made once; each call mints a new token, and both work.
            again = await session.expose_port(port)
            assert again.url == exposed.url and again.headers[header] != token
            assert await _fetch(again, "hello.txt") == b"through the preview"
        if name == "cloudflare":
            with pytest.raises(sandbox.UnsupportedOperationError, match="3000"):
                await session.expose_port(3000)


async def test_modal_snapshot_reopens_with_the_files(tmp_path: Path) -> None:
    from sandbox.testing.modal_fake import FakeModal

    fake = FakeModal()
    options = {"sdk": fake, "token_id": "fake-id", "token_secret": "fake-secret"}
    first = sandbox.open_session("modal", workdir=str(tmp_path / "one"), **options)
    async with first as session:
        await session.write_file("state/kept.txt", b"kept by the image")
        ref = await session.snapshot()
    text = ref.to_json()
    assert "fake-secret" not in text and json.loads(text)["backend"] == "modal"
    reopened = sandbox.open_session(
        "modal", snapshot=text, workdir=str(tmp_path / "two"), **options
    )
    async with reopened as session:
        assert await session.read_file("state/kept.txt") == b"kept by the image"
    with pytest.raises(sandbox.InvalidArgumentError, match="replaces image"):
        sandbox.open_session("modal", snapshot=ref, image="python:3.12", **options)
    assert fake.live_sandboxes() == []


async def test_modal_exposes_ports_declared_at_create(tmp_path: Path) -> None:
    from sandbox.testing.modal_fake import FakeModal

    port, tls_port = _free_port(), 8443
    session = sandbox.open_session(
        "modal",
        sdk=FakeModal(),
        token_id="fake-id",
        token_secret="fake-secret",
        workdir=str(tmp_path / "ws"),
        create_options={"unencrypted_ports": [port], "encrypted_ports": [tls_port]},
    )
    async with session:
        await session.write_file("site/hello.txt", b"through a tunnel")
        update = await session.pty_exec_start(
            f"cd site && {HTTP_SERVER} {port} --bind 127.0.0.1",
            until="Serving",
            yield_time_s=30,
        )
        assert update.process_id is not None and "Serving" in update.output, update
        plain = await session.expose_port(port)
        assert not plain.tls and await _fetch(plain, "hello.txt") == b"through a tunnel"
        secure = await session.expose_port(tls_port)
        assert secure.tls and secure.url.startswith("https://")
        with pytest.raises(sandbox.UnsupportedOperationError, match="encrypted_ports"):
            await session.expose_port(9999)


# ---- E2B and Daytona snapshots (through their SDK fakes) ------------------------------


async def _snapshot_round_trip(
    backend: str, options: dict[str, object], secret: str
) -> sandbox.SnapshotRef:
    """Write files, snapshot, close; reopen from the ref's JSON and read them back."""
    async with sandbox.open_session(backend, **options) as session:  # type: ignore[arg-type]
        await session.write_file("state/kept.txt", b"kept by the snapshot")
        await session.exec("ln -s kept.txt state/alias && chmod 700 state/kept.txt")
        ref = await session.snapshot()
        await session.write_file("state/after.txt", b"written after the snapshot")
    text = ref.to_json()
    assert secret not in text and json.loads(text)["backend"] == backend
    assert sandbox.SnapshotRef.from_json(text) == ref
    async with sandbox.open_session(backend, snapshot=text, **options) as reopened:  # type: ignore[arg-type]
        assert await reopened.read_file("state/kept.txt") == b"kept by the snapshot"
        link = await reopened.stat("state/alias")
        assert (link.kind, link.link_target) == ("symlink", "kept.txt")
        assert (await reopened.stat("state/kept.txt")).mode == 0o700
        with pytest.raises(sandbox.SandboxFileNotFoundError):
            await reopened.stat("state/after.txt")
    return ref


async def test_e2b_snapshot_reopens_as_a_new_sandbox(tmp_path: Path) -> None:
    from sandbox.testing.e2b_fake import FakeE2B

    async with FakeE2B(api_key="e2b-snap-key", root=tmp_path) as fake:
        options = {"api_key": "e2b-snap-key", "sandbox_class": fake.AsyncSandbox}
        ref = await _snapshot_round_trip("e2b", options, "e2b-snap-key")
        # The snapshot is a template: it outlives both sandboxes, which are gone.
        assert fake.live_sandbox_ids() == [] and fake.snapshot_ids() == [ref.snapshot_id]
        assert fake.snapshot_modes[ref.snapshot_id] == "full"  # the API's default
        with pytest.raises(sandbox.InvalidArgumentError, match="replaces image"):
            sandbox.open_session("e2b", snapshot=ref, image="base", **options)  # type: ignore[arg-type]
        filesystem = sandbox.open_session("e2b", snapshot_mode="filesystem", **options)  # type: ignore[arg-type]
        async with filesystem as session:
            ref = await session.snapshot()
        assert fake.snapshot_modes[ref.snapshot_id] == "filesystem"
        assert ref.details["mode"] == "filesystem"
        with pytest.raises(sandbox.InvalidArgumentError, match="snapshot_mode"):
            sandbox.open_session("e2b", snapshot_mode="memory", **options)  # type: ignore[arg-type]


async def test_daytona_snapshot_reopens_as_a_new_sandbox(tmp_path: Path) -> None:
    from sandbox.testing.daytona_fake import FakeDaytona

    async with FakeDaytona(api_key="dtn-snap-key", root=tmp_path) as fake:
        options = {"api_key": "dtn-snap-key", "daytona_class": fake.AsyncDaytona}
        ref = await _snapshot_round_trip("daytona", options, "dtn-snap-key")
        assert fake.live_sandbox_ids() == [] and list(fake.snapshots) == [ref.snapshot_id]
        with pytest.raises(sandbox.InvalidArgumentError, match="replaces image"):
            sandbox.open_session("daytona", snapshot=ref, image="debian:12", **options)  # type: ignore[arg-type]
        # A plain name (not a ref's JSON) is Daytona's own `snapshot` option.
        async with sandbox.open_session("daytona", snapshot="stock-snapshot", **options):  # type: ignore[arg-type]
            (state,) = fake.sandboxes.values()
            assert state.params.snapshot == "stock-snapshot"


async def test_e2b_snapshot_cancelled_while_made_deletes_it(tmp_path: Path) -> None:
    from sandbox.testing.e2b_fake import FakeE2B

    async with FakeE2B(api_key="k", root=tmp_path) as fake:
        async with sandbox.open_session("e2b", api_key="k", sandbox_class=fake.AsyncSandbox) as s:
            gate = fake.block("create_snapshot", after=True)  # made, the answer held back
            call = asyncio.ensure_future(s.snapshot())
            await gate.reached.wait()
            assert len(fake.snapshot_ids()) == 1
            call.cancel()
            gate.release()
            with pytest.raises(asyncio.CancelledError):
                await call
            assert fake.snapshot_ids() == []  # the cancelled call's snapshot is gone
            assert (await s.exec("echo still here")).stdout == b"still here\n"
        assert fake.live_sandbox_ids() == []


async def test_daytona_snapshot_cancelled_while_made_deletes_it(tmp_path: Path) -> None:
    from sandbox.testing.daytona_fake import FakeDaytona

    async with FakeDaytona(api_key="k", root=tmp_path) as fake:
        session = sandbox.open_session("daytona", api_key="k", daytona_class=fake.AsyncDaytona)
        async with session as s:
            gate = fake.block("create_snapshot", after=True)
            call = asyncio.ensure_future(s.snapshot())
            await gate.reached.wait()
            assert len(fake.snapshots) == 1
            call.cancel()
            gate.release()
            with pytest.raises(asyncio.CancelledError):
                await call
            assert fake.snapshots == {}
            assert (await s.exec("echo still here")).stdout == b"still here\n"
        assert fake.live_sandbox_ids() == []


async def test_snapshot_refusals_are_mapped_and_leave_nothing(tmp_path: Path) -> None:
    import e2b
    from daytona import DaytonaConflictError

    from sandbox.testing.daytona_fake import FakeDaytona
    from sandbox.testing.e2b_fake import FakeE2B

    async with FakeE2B(api_key="k", root=tmp_path / "e2b") as fake:
        async with sandbox.open_session("e2b", api_key="k", sandbox_class=fake.AsyncSandbox) as s:
            refusal = e2b.SandboxException("400: snapshot_filesystem_only_disabled")
            fake.fail("create_snapshot", refusal)
            with pytest.raises(sandbox.SandboxError, match="snapshot the sandbox"):
                await s.snapshot()
            assert fake.snapshot_ids() == []
    (tmp_path / "dt").mkdir()
    async with FakeDaytona(api_key="k", root=tmp_path / "dt") as fake:
        session = sandbox.open_session("daytona", api_key="k", daytona_class=fake.AsyncDaytona)
        async with session as s:
            fake.fail("create_snapshot", DaytonaConflictError("name in use", status_code=409))
            with pytest.raises(sandbox.ProviderError, match="snapshot the sandbox"):
                await s.snapshot()
            assert fake.snapshots == {}
