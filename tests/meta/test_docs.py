"""The documentation in docs/ stays true to the code.

The example backend in docs/architecture.md is run for real (local processes), using
only the names it says a backend needs; the contract names every error class and the
architecture every backend-author name; and no document sends a reader outside the
repository.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import sandbox
import sandbox.backend

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
LINK = re.compile(r"\]\(([^)\s]+)\)")

EXERCISE = """
import asyncio, sys
import sandbox
from here_backend import HereSession

async def main() -> None:
    async with HereSession(workdir=sys.argv[1]) as session:
        result = await session.exec("echo out; echo err >&2; exit 3")
        assert (result.stdout, result.stderr, result.exit_code) == (b"out\\n", b"err\\n", 3)
        try:
            await session.exec("sleep 30", timeout=0.5)
        except sandbox.ExecTimeoutError:
            pass
        else:
            raise AssertionError("no timeout")
        for call in (
            session.exec("true", cwd="missing"),
            session.pty_exec_start("true", cwd="missing", tty=True),
        ):
            try:
                await call
            except sandbox.WorkdirError:
                pass
            else:
                raise AssertionError("no WorkdirError")
        try:
            await session.exec("no-such-program-here", shell=False)
        except sandbox.CommandNotFoundError:
            pass
        else:
            raise AssertionError("no CommandNotFoundError")
        cat = await session.pty_exec_start("cat", tty=True, until=None, yield_time_s=0.3)
        assert cat.process_id is not None
        reply = await session.pty_write_stdin(cat.process_id, "ping\\n", until="ping\\r\\nping")
        assert "ping\\r\\nping" in reply.output, reply
        await session.pty_interrupt(cat.process_id)
        done = await session.pty_write_stdin(cat.process_id, "", yield_time_s=10)
        assert done.process_id is None and done.exit_code == 130, done
        await session.pty_exec_start("sleep 30")
        assert len(session.pty_processes()) == 1
    print("ok")

asyncio.run(main())
"""


def _example_backend() -> str:
    text = (DOCS / "architecture.md").read_text()
    section = text[text.index("## Adding a backend") :]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    assert blocks, "no python example in the 'Adding a backend' section"
    return blocks[-1]


def test_example_backend_uses_only_the_backend_face() -> None:
    tree = ast.parse(_example_backend())
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("sandbox"):
            assert node.module in ("sandbox", "sandbox.backend"), node.module
            for alias in node.names:
                module = sandbox.backend if node.module == "sandbox.backend" else sandbox
                assert alias.name in module.__all__, alias.name
        if isinstance(node, ast.Import):
            assert not any(a.name.startswith("sandbox.") for a in node.names)


def test_example_backend_runs(tmp_path: Path) -> None:
    (tmp_path / "here_backend.py").write_text(_example_backend())
    (tmp_path / "exercise.py").write_text(EXERCISE)
    result = subprocess.run(
        [sys.executable, str(tmp_path / "exercise.py"), str(tmp_path / "workdir")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr


def test_contract_names_every_error_and_public_name() -> None:
    contract = (DOCS / "contract.md").read_text()
    missing = [name for name in sandbox.__all__ if f"`{name}`" not in contract]
    assert not missing, missing


def test_architecture_names_every_backend_author_name() -> None:
    architecture = (DOCS / "architecture.md").read_text()
    missing = [name for name in sandbox.backend.__all__ if f"`{name}`" not in architecture]
    assert not missing, missing


def _documents() -> list[Path]:
    return [ROOT / "README.md", ROOT / "AGENTS.md", *sorted(DOCS.glob("*.md"))]


def test_no_document_points_outside_the_repository() -> None:
    for document in _documents():
        text = document.read_text()
        assert "../shared" not in text and "/work/" not in text, document.name
        for target in LINK.findall(text):
            if re.match(r"[a-z]+://", target) or target.startswith("#"):
                continue
            resolved = (document.parent / target.split("#")[0]).resolve()
            assert resolved.is_relative_to(ROOT), (document.name, target)


def test_readme_links_the_docs() -> None:
    readme = (ROOT / "README.md").read_text()
    for name in ("docs/contract.md", "docs/architecture.md", "docs/providers.md"):
        assert f"]({name})" in readme, name
    for name in ("contract.md", "architecture.md"):
        assert (DOCS / name).is_file(), name


DOTTED = re.compile(r"`(sandbox(?:\.[A-Za-z_][A-Za-z0-9_]*)+)")
# Our own tree only: the providers' files cited as sources live in their repositories.
OUR_FOLDERS = "src|tests|bench|scripts|backends|testing|cli|mcp|session|output|terminal|files|local"
FILE_PATH = re.compile(rf"(?<![\w./-])((?:{OUR_FOLDERS})/(?:[\w.-]+/)*[\w-]+\.py)\b")


def _resolves(dotted: str) -> bool:
    """True if `dotted` names a module, or an attribute reached from one."""
    import importlib
    import warnings

    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            target: object = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # old spellings still resolve
            for name in parts[cut:]:
                if not hasattr(target, name):
                    return False
                target = getattr(target, name)
        return True
    return False


def _file_exists(path: str) -> bool:
    bases = (ROOT, ROOT / "src", ROOT / "src" / "sandbox", ROOT / "tests")
    return any((base / path).is_file() for base in bases)


def test_module_paths_named_in_docs_exist() -> None:
    """A module, name or file a document points at is really there (docs drift otherwise)."""
    missing = []
    for doc in _documents():
        text = doc.read_text()
        for dotted in sorted(set(DOTTED.findall(text))):
            if not _resolves(dotted):
                missing.append(f"{doc.name}: {dotted}")
        for path in sorted(set(FILE_PATH.findall(text))):
            if not _file_exists(path):
                missing.append(f"{doc.name}: {path}")
    assert not missing, "documents name what does not exist:\n" + "\n".join(missing)
