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
