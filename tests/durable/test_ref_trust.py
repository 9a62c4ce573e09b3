"""A ref read back from a file a sandbox could have written decides nothing unchecked.

Refs are sealed (`sandbox.durable.seal`); a forged or edited one is refused with
`RefNotTrustedError` (exit 2 in the CLI). Even a sealed ref never widens what the
caller asked for, never names a temporary workspace the library did not make, and the
ref file is rewritten at every detach.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import sandbox
from sandbox.backends.unix_local import confine
from sandbox.durable import seal
from sandbox.durable.resume import merge_options

BWRAP = confine.availability()


def _cli(
    *words: str, cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[bytes]:
    full = dict(os.environ)
    full["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    full.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "sandbox.cli", *words],
        capture_output=True,
        cwd=cwd,
        env=full,
        timeout=120,
    )


def _forge(path: Path, **changes: object) -> None:
    """Edit a ref file's JSON as a process in the sandbox would (the seal is kept)."""
    data = json.loads(path.read_bytes())
    for dotted, value in changes.items():
        where = data
        *parents, last = dotted.split("__")
        for name in parents:
            where = where[name]
        where[last] = value
    path.write_text(json.dumps(data))


def _one_error_line(result: subprocess.CompletedProcess[bytes]) -> str:
    text = result.stderr.decode()
    assert "Traceback" not in text, text
    assert len(text.strip().splitlines()) == 1, text
    return text


# ---- the seal ---------------------------------------------------------------------------


def test_a_ref_round_trips_sealed_and_any_edit_is_refused():
    ref = sandbox.SessionRef(
        backend="unix_local",
        session_id="abc",
        sandbox={"workspace": "/tmp/x", "temporary": False},
        options={"confine": True},
    )
    data = json.loads(ref.to_json())
    assert isinstance(data["seal"], str) and len(data["seal"]) == 64
    assert sandbox.SessionRef.from_json(ref.to_json()) == ref
    for edit in (
        {"options": {"confine": False}},
        {"sandbox": {"workspace": "/tmp/x", "temporary": True}},
        {"session_id": "abd"},
        {"seal": "0" * 64},
    ):
        forged = {**data, **edit}
        with pytest.raises(sandbox.RefNotTrustedError, match="seal does not match"):
            sandbox.SessionRef.from_dict(forged)
    unsealed = {k: v for k, v in data.items() if k != "seal"}
    with pytest.raises(sandbox.RefNotTrustedError):
        sandbox.SessionRef.from_json(json.dumps(unsealed))
    # RefNotTrustedError is a usage error (exit 2 in the CLI).
    assert issubclass(sandbox.RefNotTrustedError, sandbox.InvalidArgumentError)


def test_a_ref_sealed_under_another_users_key_is_refused(tmp_path, monkeypatch):
    ref = sandbox.SessionRef(backend="unix_local", session_id="abc")
    text = ref.to_json()
    monkeypatch.setenv("SANDBOX_STATE_DIR", str(tmp_path / "other-user"))
    with pytest.raises(sandbox.RefNotTrustedError):
        sandbox.SessionRef.from_json(text)
    # ... and this user's key file was made private.
    info = os.stat(tmp_path / "other-user" / seal.KEY_FILE)
    assert info.st_mode & 0o777 == 0o600
    assert os.stat(tmp_path / "other-user").st_mode & 0o777 == 0o700


def test_a_state_folder_others_can_enter_is_refused(tmp_path, monkeypatch):
    folder = tmp_path / "shared"
    folder.mkdir(mode=0o755)
    folder.chmod(0o755)
    monkeypatch.setenv("SANDBOX_STATE_DIR", str(folder))
    with pytest.raises(sandbox.HostPathError, match="nobody else"):
        seal.user_key()


def test_deeply_nested_ref_json_is_one_clear_error():
    for text in ("[" * 100_000 + "]" * 100_000, '{"a":' * 50_000 + "1" + "}" * 50_000):
        with pytest.raises(sandbox.InvalidArgumentError):
            sandbox.SessionRef.from_json(text)
    deep: dict[str, object] = {}
    for _ in range(200):
        deep = {"x": deep}
    with pytest.raises(sandbox.InvalidArgumentError, match="nested"):
        sandbox.SessionRef(backend="unix_local", session_id="abc", sandbox=deep)


# ---- what even a sealed ref may not do ---------------------------------------------------


def test_a_sealed_ref_never_widens_the_narrow_options():
    ref_side = {"confine": True, "network": False, "inherit_env": False, "max_processes": 4}
    assert merge_options(ref_side, {"confine": False, "network": True, "inherit_env": True}) == {
        "confine": True,
        "network": False,
        "inherit_env": False,
        "max_processes": 4,
    }
    # The caller narrows what the ref allowed; other options are the caller's.
    wide = {"confine": False, "network": True, "inherit_env": True}
    assert merge_options(wide, {"confine": True, "max_processes": 2}) == {
        "confine": True,
        "network": True,
        "inherit_env": True,
        "max_processes": 2,
    }


async def test_a_sealed_ref_naming_a_host_folder_temporary_is_refused(tmp_path):
    victim = tmp_path / "precious"
    victim.mkdir()
    (victim / "keep.txt").write_text("mine")
    # Sealed, because made in code: what a replayed or mis-made ref could hold.
    ref = sandbox.SessionRef(
        backend="unix_local",
        session_id="replayed",
        sandbox={"workspace": str(victim), "temporary": True},
    )
    session = sandbox.resume_session(ref.to_json())
    with pytest.raises(sandbox.InvalidArgumentError, match="temporary"):
        await session.start()
    await session.aclose()
    assert (victim / "keep.txt").read_text() == "mine"


async def test_a_temporary_workspace_the_library_made_is_still_removed_at_close():
    async with sandbox.open_session("unix_local") as first:
        ref = await first.detach()
    workspace = ref.sandbox["workspace"]
    assert os.path.isdir(workspace)
    async with sandbox.resume_session(ref.to_json()) as again:
        assert (await again.exec("echo hi")).stdout == b"hi\n"
    assert not os.path.exists(workspace)


# ---- the CLI -----------------------------------------------------------------------------


def test_cli_refuses_a_forged_ref_file_with_exit_2_and_deletes_nothing(tmp_path):
    victim = tmp_path / "host-folder"
    victim.mkdir()
    (victim / "keep.txt").write_text("mine")
    opened = _cli("open", cwd=tmp_path)
    assert opened.returncode == 0, opened.stderr
    ref_file = tmp_path / "ref.json"
    ref_file.write_bytes(opened.stdout)
    workspace = json.loads(opened.stdout)["sandbox"]["workspace"]
    _forge(
        ref_file,
        sandbox__workspace=str(victim),
        sandbox__temporary=True,
        options__inherit_env=True,
    )
    ran = _cli("run", "--session", str(ref_file), "--", "true", cwd=tmp_path)
    assert ran.returncode == 2
    assert "seal" in _one_error_line(ran)
    closed = _cli("close", str(ref_file), cwd=tmp_path)
    assert closed.returncode == 2
    _one_error_line(closed)
    assert (victim / "keep.txt").read_text() == "mine"
    assert ref_file.exists()  # kept: nothing was closed
    assert os.path.isdir(workspace)
    # The genuine ref still closes its sandbox.
    ref_file.write_bytes(opened.stdout)
    assert _cli("close", str(ref_file), cwd=tmp_path).returncode == 0
    assert not os.path.exists(workspace)


@pytest.mark.skipif(not BWRAP[0], reason=f"bubblewrap: {BWRAP[1]}")
def test_a_confined_sandbox_rewriting_its_own_ref_file_changes_nothing(tmp_path):
    workspace = tmp_path / "ws"
    workspace.mkdir()
    opened = _cli("open", "--confine", "--workdir", str(workspace), cwd=tmp_path)
    assert opened.returncode == 0, opened.stderr
    ref_file = workspace / "ref.json"
    ref_file.write_bytes(opened.stdout)
    # The sandbox unconfines itself in the file it can write...
    script = (
        'sed -i -e \'s/"confine":true/"confine":false/\' '
        '-e \'s/"inherit_env":false/"inherit_env":true/\' ref.json && grep -c confine ref.json'
    )
    ran = _cli("run", "--session", str(ref_file), "--", "sh", "-c", script, cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    # ... and the detach wrote the session's ref back over it.
    after = sandbox.read_ref_file(ref_file)
    assert after.options["confine"] is True and after.options["inherit_env"] is False
    # Forged while no client runs: refused.
    forged_again = _cli("run", "--session", str(ref_file), "--", "sh", "-c", script, cwd=tmp_path)
    assert forged_again.returncode == 0
    _forge(ref_file, options__confine=False)
    refused = _cli("run", "--session", str(ref_file), "--", "true", cwd=tmp_path)
    assert refused.returncode == 2
    _one_error_line(refused)
    ref_file.write_bytes(opened.stdout)
    assert _cli("close", str(ref_file), cwd=tmp_path).returncode == 0


def test_cp_out_refuses_to_write_over_the_session_ref_file(tmp_path):
    opened = _cli("open", cwd=tmp_path)
    assert opened.returncode == 0, opened.stderr
    ref_file = tmp_path / "ref.json"
    ref_file.write_bytes(opened.stdout)
    made = _cli(
        "run",
        "--session",
        str(ref_file),
        "--",
        "sh",
        "-c",
        "mkdir -p out && echo forged > out/ref.json && echo forged > single",
        cwd=tmp_path,
    )
    assert made.returncode == 0, made.stderr
    genuine = ref_file.read_bytes()
    as_file = _cli("cp", "--session", str(ref_file), ":single", str(ref_file), cwd=tmp_path)
    assert as_file.returncode == 2
    assert "ref file" in _one_error_line(as_file)
    assert sandbox.read_ref_file(ref_file).session_id == json.loads(genuine)["session_id"]
    as_member = _cli("cp", "--session", str(ref_file), ":out", str(tmp_path), cwd=tmp_path)
    assert as_member.returncode == 2
    assert "ref file" in _one_error_line(as_member)
    assert sandbox.read_ref_file(ref_file).session_id == json.loads(genuine)["session_id"]
    assert _cli("close", str(ref_file), cwd=tmp_path).returncode == 0


def test_cli_refuses_a_deeply_nested_ref_file_with_one_line(tmp_path):
    ref_file = tmp_path / "ref.json"
    ref_file.write_text("[" * 200_000 + "]" * 200_000)
    ran = _cli("run", "--session", str(ref_file), "--", "true", cwd=tmp_path)
    assert ran.returncode == 2
    _one_error_line(ran)


def test_mcp_refuses_a_forged_state_file_with_exit_2(tmp_path):
    opened = _cli("open", cwd=tmp_path)
    assert opened.returncode == 0, opened.stderr
    state = tmp_path / "state.json"
    state.write_bytes(opened.stdout)
    workspace = json.loads(opened.stdout)["sandbox"]["workspace"]
    _forge(state, sandbox__temporary=False)
    served = subprocess.run(
        [sys.executable, "-m", "sandbox.cli", "mcp", "--state-file", str(state)],
        capture_output=True,
        stdin=subprocess.DEVNULL,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)},
        timeout=120,
    )
    assert served.returncode == 2
    assert "seal" in _one_error_line(served)
    state.write_bytes(opened.stdout)
    assert _cli("close", str(state), cwd=tmp_path).returncode == 0
    assert not os.path.exists(workspace)
