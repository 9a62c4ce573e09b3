"""`sandbox open`, `run --session`, `close`: a sandbox that outlives each command."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import sandbox


def _cli(*words: str, cwd: Path) -> subprocess.CompletedProcess[bytes]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    return subprocess.run(
        [sys.executable, "-m", "sandbox.cli", *words], capture_output=True, cwd=cwd, env=env
    )


def test_open_run_close_keep_one_sandbox_across_commands(tmp_path):
    opened = _cli("open", cwd=tmp_path)
    assert opened.returncode == 0, opened.stderr
    ref = sandbox.SessionRef.from_json(opened.stdout)
    workspace = ref.sandbox["workspace"]
    ref_file = tmp_path / "ref.json"
    ref_file.write_bytes(opened.stdout)
    assert os.path.isdir(workspace)

    wrote = _cli("run", "--session", str(ref_file), "--", "sh", "-c", "echo hi > f", cwd=tmp_path)
    assert wrote.returncode == 0, wrote.stderr
    after = sandbox.read_ref_file(ref_file)
    assert after.session_id == ref.session_id and after.sandbox["workspace"] == workspace
    assert stat.S_IMODE(os.stat(ref_file).st_mode) == 0o600

    read = _cli("run", "--session", str(ref_file), "--", "cat", "f", cwd=tmp_path)
    assert (read.returncode, read.stdout) == (0, b"hi\n")
    failed = _cli("run", "--session", str(ref_file), "--", "sh", "-c", "exit 3", cwd=tmp_path)
    assert failed.returncode == 3

    closed = _cli("close", str(ref_file), cwd=tmp_path)
    assert closed.returncode == 0, closed.stderr
    assert not ref_file.exists() and not os.path.exists(workspace)
    again = _cli("close", str(ref_file), cwd=tmp_path)
    assert again.returncode != 0 and b"Traceback" not in again.stderr


def test_a_bad_ref_file_is_one_error_line(tmp_path):
    bad = tmp_path / "ref.json"
    bad.write_text(json.dumps({"version": 99}))
    result = _cli("run", "--session", str(bad), "--", "true", cwd=tmp_path)
    assert result.returncode == 2
    assert b"version" in result.stderr and b"Traceback" not in result.stderr


def test_cp_with_session_moves_trees_into_and_out_of_the_open_sandbox(tmp_path):
    source = tmp_path / "src"
    (source / "deep").mkdir(parents=True)
    (source / "empty").mkdir()
    (source / "deep" / "data.bin").write_bytes(bytes(range(256)) * 64)
    (source / "alias").symlink_to("deep/data.bin")
    opened = _cli("open", cwd=tmp_path)
    assert opened.returncode == 0, opened.stderr
    ref_file = tmp_path / "ref.json"
    ref_file.write_bytes(opened.stdout)
    workspace = sandbox.SessionRef.from_json(opened.stdout).sandbox["workspace"]
    try:
        into = _cli("cp", "--session", str(ref_file), str(source), ":tree", cwd=tmp_path)
        assert into.returncode == 0, into.stderr
        # The copy landed in the sandbox the ref names, and a later command there sees it.
        seen = _cli(
            "run",
            "--session",
            str(ref_file),
            "--",
            "sh",
            "-c",
            "cksum < tree/deep/data.bin; readlink tree/alias; test -d tree/empty && echo dir",
            cwd=tmp_path,
        )
        expected = subprocess.run(
            ["cksum"], input=(source / "deep" / "data.bin").read_bytes(), capture_output=True
        ).stdout
        assert seen.stdout == expected + b"deep/data.bin\ndir\n", seen.stderr
        one = _cli(
            "cp", "--session", str(ref_file), ":tree/deep/data.bin", str(tmp_path), cwd=tmp_path
        )
        assert one.returncode == 0, one.stderr
        assert (tmp_path / "data.bin").read_bytes() == (source / "deep" / "data.bin").read_bytes()
        back = _cli("cp", "--session", str(ref_file), ":tree", str(tmp_path / "back"), cwd=tmp_path)
        assert back.returncode == 0, back.stderr
        assert os.readlink(tmp_path / "back" / "alias") == "deep/data.bin"
        assert (tmp_path / "back" / "empty").is_dir()
        assert sandbox.read_ref_file(ref_file).sandbox["workspace"] == workspace
    finally:
        closed = _cli("close", str(ref_file), cwd=tmp_path)
    assert closed.returncode == 0, closed.stderr
    assert not os.path.exists(workspace)


def test_cp_with_a_bad_ref_file_is_a_usage_error(tmp_path):
    bad = tmp_path / "ref.json"
    bad.write_text(json.dumps({"version": 99}))
    (tmp_path / "f").write_bytes(b"x")
    result = _cli("cp", "--session", str(bad), str(tmp_path / "f"), ":f", cwd=tmp_path)
    assert result.returncode == 2
    assert b"version" in result.stderr and b"Traceback" not in result.stderr
