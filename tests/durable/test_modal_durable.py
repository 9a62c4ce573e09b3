"""Modal: a SIGKILLed client is resumed from its ref file (against the SDK fake, served
from this process so that it outlives the client)."""

from __future__ import annotations

import pytest

pytest.importorskip("modal")

import sandbox
from sandbox.testing.modal_fake import FakeClient, FakeModal
from sandbox.testing.remote_fake import FakeServer
from tests.helpers import eventually, host_pids_with_arg, unique_seconds


def _release(obj: object) -> object:
    # What dies with the client beyond its handles: its Modal client (connection).
    return obj.close.aio() if isinstance(obj, FakeClient) else None


async def test_sigkilled_client_is_resumed_from_its_ref_file(tmp_path):
    from tests.durable.crash import crash_with_a_process, socket_path

    marker = unique_seconds()
    options: dict[str, object] = {
        "token_id": "fake-token-id",
        "token_secret": "fake-token-secret",
        "workdir": str(tmp_path / "ws"),
        "state_dir": str(tmp_path / "state"),
        "terminate_grace_s": 0.3,
        "runner": False,  # the per-exec path: no SDK call finds an exec again
    }
    ref_file = tmp_path / "ref.json"
    fake = FakeModal()
    try:
        with socket_path() as path:
            async with FakeServer(fake, path, release=_release) as server:
                process_id = await crash_with_a_process(
                    "modal", options, ref_file, ["sleep", marker], remote=(path, "sdk", None)
                )
                await server.wait_idle()
                assert fake.open_clients() == []  # the dead client's connection is gone
        # The sandbox keeps running the exec with nobody reading it.
        assert host_pids_with_arg(marker) != []
        ref = sandbox.read_ref_file(ref_file)
        [proc] = ref.processes
        assert proc.process_id == process_id and proc.running
        assert [s.object_id for s in fake.live_sandboxes()] == [ref.sandbox["sandbox_id"]]
        secrets = {k: v for k, v in options.items() if k.startswith("token")}
        async with sandbox.resume_session(ref, sdk=fake, **secrets) as s:
            # No SDK call finds an exec again: its tree is killed by tag, and it is
            # reported ended with a note.
            assert await eventually(lambda: host_pids_with_arg(marker) == [])
            [info] = s.pty_processes()
            assert info.process_id == process_id and not info.running
            update = await s.pty_write_stdin(process_id, "")
            assert "cannot reattach" in update.output
            assert (await s.exec("echo", "ok")).stdout == b"ok\n"
        assert fake.live_sandboxes() == []
        assert fake.open_clients() == []
        assert "fake-token-secret" not in ref.to_json()
        assert await eventually(lambda: fake.leftover_pids() == [])
    finally:
        await fake.aclose()
