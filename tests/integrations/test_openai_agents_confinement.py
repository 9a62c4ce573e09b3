"""The Agents SDK adapter never acts outside the workspace, and trusts only states it wrote.

Issue 33, item 7: through the adapter, the SDK's `rm`, `mkdir`, `ls`, `mv` and
`same_file` ran `rm`/`mkdir`/`ls`/`mv`/`test -ef` in the sandbox after a lexical check
only, so a symlink in the workspace to a host folder let them act on that folder. Here a
unix_local workspace holds `link -> <a host folder outside>` (and `esc -> <a host file>`),
and every operation through the SDK's own session object leaves the outside untouched
and raises the SDK's `InvalidManifestPathError` (caused by our `WorkspacePathError`).

Issue 33, item 1: a serialized state names folders on the host (the unix_local
`workspace`, whether `delete` removes it). A state edited after the library wrote it
(ownership claimed, another workspace named, the ref changed, the seal dropped) makes
`resume`/`delete` raise `RefNotTrustedError` and removes nothing; a genuine state still
deletes its own temporary workspace.
"""

from __future__ import annotations

import copy
import io
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("agents.sandbox", reason="the openai-agents extra is not installed")

from agents.sandbox.errors import InvalidManifestPathError
from agents.sandbox.session.sandbox_session import SandboxSession

import sandbox
from sandbox.integrations.openai_agents import SandboxClient, SandboxClientOptions


class Host:
    """A workspace and a host folder outside it, with links from one to the other."""

    def __init__(self, root: Path) -> None:
        self.workspace = root / "ws"
        self.outside = root / "outside"
        self.workspace.mkdir()
        self.outside.mkdir()
        self.victim = self.outside / "victim.txt"
        self.victim.write_text("host data")
        (self.workspace / "link").symlink_to(self.outside)
        (self.workspace / "esc").symlink_to(self.victim)
        (self.workspace / "inside.txt").write_text("inside")

    def outside_names(self) -> list[str]:
        return sorted(os.listdir(self.outside))


@pytest.fixture
def host(tmp_path: Path) -> Host:
    return Host(tmp_path)


@pytest.fixture
async def sdk_session(host: Host) -> AsyncIterator[SandboxSession]:
    """The SDK's session object (what its tools call) on a unix_local workspace."""
    client = SandboxClient()
    session = await client.create(
        options=SandboxClientOptions(
            backend="unix_local", backend_options={"workdir": str(host.workspace)}
        )
    )
    await session.start()
    try:
        yield session
    finally:
        await session.shutdown()
        await client.delete(session)


def escaped(error: pytest.ExceptionInfo[InvalidManifestPathError]) -> None:
    """The SDK's error, caused by our refusal of a path a link leads out of."""
    assert isinstance(error.value.__cause__, sandbox.WorkspacePathError)


# ---- issue 33 item 7: paths ----


async def test_rm_through_a_link_leaves_the_host_file(
    sdk_session: SandboxSession, host: Host
) -> None:
    with pytest.raises(InvalidManifestPathError) as error:
        await sdk_session.rm("link/victim.txt")
    escaped(error)
    with pytest.raises(InvalidManifestPathError):
        await sdk_session.rm("link/victim.txt", recursive=True)
    assert host.victim.read_text() == "host data"
    # The link itself is the workspace's: removing it removes the link, not the folder.
    await sdk_session.rm("link")
    assert not (host.workspace / "link").is_symlink()
    assert host.outside_names() == ["victim.txt"]


async def test_mkdir_through_a_link_makes_nothing_outside(
    sdk_session: SandboxSession, host: Host
) -> None:
    with pytest.raises(InvalidManifestPathError) as error:
        await sdk_session.mkdir("link/nested")
    escaped(error)
    with pytest.raises(InvalidManifestPathError):
        await sdk_session.mkdir("link/deeper/nested", parents=True)
    assert host.outside_names() == ["victim.txt"]
    await sdk_session.mkdir("made/here", parents=True)
    assert (host.workspace / "made" / "here").is_dir()


async def test_ls_of_a_link_out_lists_nothing_outside(
    sdk_session: SandboxSession, host: Host
) -> None:
    with pytest.raises(InvalidManifestPathError) as error:
        await sdk_session.ls("link")
    escaped(error)
    listed = {Path(entry.path).name: entry for entry in await sdk_session.ls(".")}
    assert set(listed) == {"link", "esc", "inside.txt"}
    assert listed["link"].kind.value == "symlink"  # described, not followed


async def test_mv_into_or_out_of_a_link_moves_nothing(
    sdk_session: SandboxSession, host: Host
) -> None:
    with pytest.raises(InvalidManifestPathError) as into:
        await sdk_session.mv("inside.txt", "link/moved.txt")
    escaped(into)
    with pytest.raises(InvalidManifestPathError) as out_of:
        await sdk_session.mv("link/victim.txt", "stolen.txt")
    escaped(out_of)
    assert host.outside_names() == ["victim.txt"]
    assert host.victim.read_text() == "host data"
    assert (host.workspace / "inside.txt").read_text() == "inside"
    assert not (host.workspace / "stolen.txt").exists()

    # Onto a link leading out, mv replaces the link (as rename does), never its target.
    (host.workspace / "note.txt").write_text("note")
    await sdk_session.mv("note.txt", "esc")
    assert not (host.workspace / "esc").is_symlink()
    assert (host.workspace / "esc").read_text() == "note"
    assert host.victim.read_text() == "host data"

    # Inside, mv still moves: a file, and a symlink as a link (its target unchanged).
    await sdk_session.mv("inside.txt", "renamed.txt")
    assert (host.workspace / "renamed.txt").read_text() == "inside"
    assert not (host.workspace / "inside.txt").exists()
    (host.workspace / "alias").symlink_to("renamed.txt")
    await sdk_session.mv("alias", "alias2")
    assert os.readlink(host.workspace / "alias2") == "renamed.txt"
    assert not (host.workspace / "alias").is_symlink()


async def test_same_file_never_resolves_outside(sdk_session: SandboxSession, host: Host) -> None:
    with pytest.raises(InvalidManifestPathError) as through_folder:
        await sdk_session.same_file("link/victim.txt", "link/victim.txt")
    escaped(through_folder)
    with pytest.raises(InvalidManifestPathError) as through_leaf:
        await sdk_session.same_file("esc", "inside.txt")
    escaped(through_leaf)

    # Inside, it answers as the SDK's contract says.
    (host.workspace / "alias").symlink_to("inside.txt")
    os.link(host.workspace / "inside.txt", host.workspace / "hard.txt")
    (host.workspace / "other.txt").write_text("inside")
    assert await sdk_session.same_file("alias", "inside.txt")
    assert not await sdk_session.same_file("alias", "inside.txt", follow_symlinks=False)
    assert await sdk_session.same_file("hard.txt", "inside.txt", follow_symlinks=False)
    assert not await sdk_session.same_file("other.txt", "inside.txt")
    assert not await sdk_session.same_file("missing.txt", "inside.txt")


# ---- issue 33 item 1: state trust ----


async def started(
    client: SandboxClient, options: SandboxClientOptions
) -> tuple[SandboxSession, dict[str, Any]]:
    """A session started, its state serialized while it runs (so it holds our sealed
    `SessionRef`), then shut down."""
    session = await client.create(options=options)
    await session.start()
    try:
        payload = client.serialize_session_state(session.state)
    finally:
        await session.shutdown()
    assert payload["session_ref"] is not None
    return session, payload


OWNED = SandboxClientOptions(backend="unix_local")  # the client makes the workspace


def forge(payload: dict[str, Any], folder: str, *, edit_ref: bool) -> dict[str, Any]:
    """The state edited to claim `folder`: ownership, the workspace option, the root;
    with `edit_ref` the ref's workspace too (its seal then no longer matches)."""
    forged = copy.deepcopy(payload)
    forged["workspace_root_owned"] = True
    forged["backend_options"] = {**forged["backend_options"], "workdir": folder}
    forged["manifest"]["root"] = folder
    if edit_ref:
        assert forged["session_ref"] is not None
        forged["session_ref"]["sandbox"]["workspace"] = folder
    return forged


@pytest.mark.parametrize("edit_ref", [False, True], ids=["ref-unchanged", "ref-edited"])
@pytest.mark.parametrize("claimed_owned", [False, True], ids=["given-workspace", "owned"])
async def test_a_forged_state_removes_nothing(
    tmp_path: Path, edit_ref: bool, claimed_owned: bool
) -> None:
    client = SandboxClient()
    # The victim: another session's live workspace, the very kind of folder delete removes.
    victim_session = await client.create(options=SandboxClientOptions(backend="unix_local"))
    victim = Path(victim_session.state.manifest.root)
    (victim / "keep.txt").write_text("keep")
    try:
        if claimed_owned:
            forged_from, payload = await started(client, OWNED)
        else:
            given = tmp_path / "given"
            given.mkdir()
            options = SandboxClientOptions(
                backend="unix_local", backend_options={"workdir": str(given)}
            )
            forged_from, payload = await started(client, options)
        await client.delete(forged_from)
        forged = forge(payload, str(victim), edit_ref=edit_ref)

        fresh = SandboxClient()
        with pytest.raises(sandbox.RefNotTrustedError, match="not written by this user"):
            session = await fresh.resume(fresh.deserialize_session_state(forged))
            await fresh.delete(session)
        assert (victim / "keep.txt").read_text() == "keep"
    finally:
        await client.delete(victim_session)
    # The genuine state still removes its own workspace.
    assert not victim.exists()


async def test_a_state_without_its_seal_removes_nothing(tmp_path: Path) -> None:
    client = SandboxClient()
    victim_session = await client.create(options=SandboxClientOptions(backend="unix_local"))
    victim = Path(victim_session.state.manifest.root)
    try:
        payload = client.serialize_session_state(victim_session.state)
        # A state written from scratch (or by an older library): no seal, no ref.
        payload.pop("host_seal", None)
        payload["session_ref"] = None
        with pytest.raises(sandbox.RefNotTrustedError):
            session = await client.resume(client.deserialize_session_state(payload))
            await client.delete(session)
        assert victim.is_dir()
    finally:
        await client.delete(victim_session)
    assert not victim.exists()


async def test_a_state_edited_in_memory_removes_nothing(tmp_path: Path) -> None:
    client = SandboxClient()
    victim_session = await client.create(options=SandboxClientOptions(backend="unix_local"))
    victim = Path(victim_session.state.manifest.root)
    mine, _ = await started(client, OWNED)
    own = Path(mine.state.manifest.root)
    try:
        state = mine.state
        state.backend_options["workdir"] = str(victim)
        state.manifest = state.manifest.model_copy(update={"root": str(victim)})
        with pytest.raises(sandbox.RefNotTrustedError):
            await client.delete(mine)
        assert victim.is_dir()
        assert own.is_dir()  # nothing at all is removed for a state that lies
    finally:
        await client.delete(victim_session)
        remove_own(own)
    assert not victim.exists()


async def test_a_genuine_state_deletes_its_temporary_workspace_after_resume() -> None:
    client = SandboxClient()
    made, payload = await started(client, OWNED)
    root = Path(made.state.manifest.root)
    (root / "work.txt").write_text("w")
    (root / "out").symlink_to("/")  # a link inside is removed as a link
    fresh = SandboxClient()
    resumed = await fresh.resume(fresh.deserialize_session_state(payload))
    await resumed.start()
    try:
        assert (await resumed.read("work.txt")).read() == b"w"
        await resumed.write("more.txt", io.BytesIO(b"m"))
    finally:
        await resumed.shutdown()
    await fresh.delete(resumed)
    assert not root.exists()


def remove_own(folder: Path) -> None:
    """Clean up the test's own temporary workspace (the test made its state lie)."""
    from sandbox.files.remove_tree import remove_tree

    remove_tree(str(folder))
