"""docs/openai-agents.md's offline example (the block after the `offline-example`
marker) runs as written, with no API key and no way to reach a model: the scripted
model in `sandbox.testing.openai_agents_model` drives a real `Runner.run` on unix_local."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("agents.sandbox", reason="the openai-agents extra is not installed")

DOC = Path(__file__).resolve().parents[2] / "docs" / "openai-agents.md"
BLOCK = re.compile(r"<!-- offline-example\b[^\n]*-->\n```python\n(.*?)```", re.S)


def test_the_offline_example_runs_as_written(tmp_path: Path) -> None:
    found = BLOCK.findall(DOC.read_text())
    assert len(found) == 1, "one python block after the offline-example marker"
    program = tmp_path / "offline_example.py"
    program.write_text(found[0])
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPENAI_")}
    # Any call to a real model would go here and fail at once.
    env["OPENAI_BASE_URL"] = "http://127.0.0.1:9/v1"
    ran = subprocess.run(
        [sys.executable, "-W", "error", str(program)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert ran.stdout.rstrip().endswith("hello from Linux"), ran.stdout
    assert "Process exited with code 0" in ran.stdout
