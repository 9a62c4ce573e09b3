"""Leases the sandbox cannot forge, checked by every call at no cost per call (issue 33).

A record the library did not write (forged, malformed, oversized, an earlier one written
back) is a logged anomaly, never a takeover: the owner's close still tears the sandbox
down. A real takeover still locks the old client out of every call kind, after the hold
window. unix_local's lease folder is in the private state folder.
"""

from __future__ import annotations

import logging
import os
import tempfile
import time

import pytest

import sandbox
from sandbox.backend import HostLease, durable_session_id
from sandbox.backends.unix_local import UnixLocalSession
from sandbox.backends.unix_local.durable import LocalDurability
from tests.backend_fixtures import docker as docker_fixture

FORGED_OWNER = f"owner {'ab' * 12} 99999999999999 1000 {'0' * 64}"
FORGED_VALUES = [
    pytest.param(f"owner {'ab' * 12}", id="unsealed"),
    pytest.param(FORGED_OWNER, id="wrong-seal"),
    pytest.param("owner " + "x" * 5000, id="oversized"),
    pytest.param(f"closed {'0' * 64}", id="closed-unsealed"),
]


def _forged_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "did not write" in r.getMessage()]


async def _overwrite(session_id: str, value: str) -> None:
    """Write `value` as the host lease of `session_id` (as the sandbox would, if it
    could reach the host's lease folder)."""
    store = HostLease(session_id)
    try:
        current = await store.read()
        assert await store.swap(current, value) == current
    finally:
        store.close()


# ---- unix_local -------------------------------------------------------------------------


@pytest.mark.parametrize("forged", FORGED_VALUES)
async def test_a_forged_host_lease_record_does_not_stop_the_close(caplog, forged):
    session = sandbox.open_session("unix_local")
    await session.start()
    workspace = session.workdir
    ref = session.ref()
    await session.exec("true")  # a shared session's call: its owner's record is there
    await _overwrite(ref.session_id, forged)
    with caplog.at_level(logging.WARNING, logger="sandbox"):
        await session.aclose()
    assert not os.path.exists(workspace)  # torn down: the forged record took nothing
    [warning] = _forged_warnings(caplog)
    assert ref.session_id in warning and forged[:20] not in warning


async def test_an_earlier_record_written_back_is_no_takeover_of_the_new_owner(caplog):
    old = sandbox.open_session("unix_local")
    await old.start()
    workspace = old.workdir
    ref = old.ref()
    await old.exec("true")
    store = HostLease(ref.session_id)
    earlier = await store.read()
    store.close()
    assert earlier is not None and earlier.startswith("owner ")
    new = sandbox.resume_session(ref)
    await new.start()
    await new.exec("true")
    await _overwrite(ref.session_id, earlier)  # a replay of the old owner's sealed record
    with caplog.at_level(logging.WARNING, logger="sandbox"):
        await new.aclose()
    assert not os.path.exists(workspace)
    assert _forged_warnings(caplog)
    await old.aclose()  # a later owner's record is there: it only lets go


async def test_a_takeover_locks_every_call_kind_out_after_the_hold_window(tmp_path):
    old = sandbox.open_session("unix_local", workdir=tmp_path)
    await old.start()
    await old.write_file("keep/data.txt", b"new owner's")
    ref = old.ref()
    await old.make_dir("fresh")  # the old owner's check is fresh when the resume comes
    async with sandbox.resume_session(ref) as new:
        # The resume waited out the hold the old owner's record announced, so the old
        # client's cached check has run out: its next call of any kind reads the lease.
        with pytest.raises(sandbox.SessionTakenOverError):
            await old.remove("keep", recursive=True)
        with pytest.raises(sandbox.SessionTakenOverError):
            await old.make_dir("more")
        with pytest.raises(sandbox.SessionTakenOverError):
            await old.stat("keep")
        with pytest.raises(sandbox.SessionTakenOverError):
            async for _ in old.persist_workspace():
                pass
        with pytest.raises(sandbox.SessionTakenOverError):
            async for _ in old.read_file_chunks("keep/data.txt"):
                pass
        await old.aclose()  # lets go: the workspace is the new owner's
        assert await new.read_file("keep/data.txt") == b"new owner's"
        assert not (tmp_path / "more").exists()
    assert tmp_path.exists()  # a given workspace is left, as the first session would


class CountingLease(HostLease):
    """The real host lease, counting how often it is read or swapped."""

    def __init__(self, session_id: str) -> None:
        super().__init__(session_id)
        self.reads = 0

    async def read(self) -> str | None:
        self.reads += 1
        return await super().read()

    async def swap(self, expected: str | None, new: str) -> str | None:
        self.reads += 1
        return await super().swap(expected, new)


class CountingDurability(LocalDurability):
    """unix_local's durability, its lease store counting its reads."""

    def lease_store(self) -> CountingLease:
        self.session.store = CountingLease(durable_session_id(self.session))
        return self.session.store


class CountingSession(UnixLocalSession):
    """unix_local whose lease store counts its reads (a backend's own capability)."""

    store: CountingLease | None = None
    _durability = CountingDurability


def _allowed_reads(elapsed_s: float) -> float:
    """At most: the first check and its record, a renewal per half second (they come
    every `lease.RENEW_AFTER` of `lease.HOLD_MS`: 0.6 s), and one under way."""
    return 3 + elapsed_s / 0.5


async def test_a_shared_sessions_round_trips_do_not_read_the_lease_each_call(tmp_path):
    trips = 200
    async with CountingSession(workdir=tmp_path) as s:
        start = await s.pty_exec_start("cat", tty=True, yield_time_s=0.2)
        pid = start.process_id
        assert pid is not None
        s.ref()
        started = time.monotonic()
        for i in range(trips):
            reply = await s.pty_write_stdin(pid, f"p{i}\n", until=f"p{i}\r\np{i}\r\n")
            assert f"p{i}\r\n" in reply.output
        elapsed = time.monotonic() - started
        assert s.store is not None
        assert 1 <= s.store.reads <= _allowed_reads(elapsed) < trips


async def test_a_foreign_leases_folder_in_tmp_blocks_nothing(tmp_path, monkeypatch):
    if os.geteuid() != 0:
        pytest.skip("making a folder another user owns needs root")
    # Another user made `<tmp>/sandbox-leases-<uid>` first (where leases once lived).
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    squatted = tmp_path / f"sandbox-leases-{os.getuid()}"
    squatted.mkdir(mode=0o700)
    os.chown(squatted, 65534, 65534)
    session = sandbox.open_session("unix_local", workdir=tmp_path / "ws")
    await session.start()
    session.ref()
    assert (await session.exec("true")).exit_code == 0  # the lease is read and written
    await session.aclose()


async def test_a_foreign_leases_folder_in_the_state_folder_is_a_clear_error(tmp_path, monkeypatch):
    if os.geteuid() != 0:
        pytest.skip("making a folder another user owns needs root")
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    monkeypatch.setenv("SANDBOX_STATE_DIR", str(state))
    leases = state / "leases"
    leases.mkdir(mode=0o700)
    os.chown(leases, 65534, 65534)
    session = sandbox.open_session("unix_local", workdir=tmp_path / "ws")
    await session.start()
    session.ref()
    with pytest.raises(sandbox.HostPathError) as caught:
        await session.exec("true")
    assert str(leases) in str(caught.value) and "chmod 700" in str(caught.value)
    # Who owns the sandbox cannot be told: the close lets go and says why.
    with pytest.raises(sandbox.CleanupError, match="cannot keep leases"):
        await session.aclose()


# ---- docker: a process in the container writes the lease file ---------------------------

docker_only = pytest.mark.skipif(
    docker_fixture.skip_reason() is not None, reason=str(docker_fixture.skip_reason())
)


def _exists(container_id: str) -> bool:
    import docker

    try:
        docker.APIClient(version="auto").inspect_container(container_id)
    except docker.errors.NotFound:
        return False
    return True


def _open_docker() -> sandbox.BaseSandboxSession:
    return sandbox.open_session("docker", image=docker_fixture.image(), terminate_grace_s=0.2)


@docker_only
async def test_a_lease_forged_inside_the_container_does_not_keep_it_running(caplog):
    session = _open_docker()
    await session.start()
    container = session.container_id
    assert container is not None
    ref = session.ref()
    path = f"/tmp/.sandbox-lease-{ref.session_id}"
    # A process in the sandbox fakes a takeover through the in-sandbox lease file.
    forge = await session.exec("sh", "-c", f"printf '%s\\n' '{FORGED_OWNER}' > {path}")
    assert forge.exit_code == 0
    assert (await session.exec("cat", path)).stdout.decode().strip() == FORGED_OWNER
    with caplog.at_level(logging.WARNING, logger="sandbox"):
        await session.aclose()
    assert not _exists(container)
    [warning] = _forged_warnings(caplog)
    assert ref.session_id in warning


def _lease_execs(container_id: str, since: int) -> int:
    """How many lease scripts the engine ran in `container_id` since `since` (seconds)."""
    import docker

    api = docker.APIClient(version="auto")
    events = api.events(
        since=since,
        until=int(time.time()) + 1,
        filters={"container": container_id, "event": "exec_create"},
        decode=True,
    )
    return sum(1 for e in events if ".sandbox-lease-" in str(e.get("Action", "")))


@docker_only
async def test_a_shared_docker_sessions_round_trips_do_not_exec_a_lease_read_each(caplog):
    trips = 60
    async with _open_docker() as s:
        container = s.container_id
        assert container is not None
        start = await s.pty_exec_start("cat", tty=True, yield_time_s=0.3)
        pid = start.process_id
        assert pid is not None
        s.ref()
        since = int(time.time())
        started = time.monotonic()
        for i in range(trips):
            reply = await s.pty_write_stdin(pid, f"p{i}\n", until=f"p{i}\r\np{i}\r\n")
            assert f"p{i}\r\n" in reply.output
        elapsed = time.monotonic() - started
        # Execs of the second before `since` count too: allow the whole of it.
        execs = _lease_execs(container, since - 1)
        assert 1 <= execs <= _allowed_reads(elapsed + 1) < trips


@pytest.mark.parametrize("before", ["nothing", "ref", "ref-and-a-call"])
async def test_a_detach_leaves_a_released_record_so_the_resume_need_not_wait(before):
    """Whether the session was shared or not, and whether the client wrote its record
    before (a call of a shared session does), its detach leaves the lease released (a
    hold of 0): the resume's takeover then waits for nothing, where an absent record
    costs it `HOLD_MS`."""
    from sandbox.durable import lease, seal

    session = sandbox.open_session("unix_local")
    await session.start()
    if before != "nothing":
        session.ref()
    if before == "ref-and-a-call":
        await session.exec("true")
    detached = await session.detach()
    store = HostLease(detached.session_id)
    try:
        key = seal.session_secret(detached.session_id)
        found = lease.parse(await store.read(), key)
        assert isinstance(found, lease.Record) and found.state == lease.OWNER
        assert found.hold_ms == 0
        newcomer = lease.Holder(lease.new_token(), key, lambda reason: None)
        assert await lease.take_over(store, newcomer, "test") == 0
    finally:
        store.close()
    async with sandbox.resume_session(detached):
        pass  # the resumed session closes it: nothing of it is left behind
