"""The documentation in README.md and docs/ stays true to the code.

Code blocks. Every fenced block in README.md and docs/*.md says by its info string what
it is, and is treated so (a person following the docs to the letter meets no failing
example):

- ```python            a complete program, run as is: `python example.py` with this
                       interpreter, in a fresh temporary folder, with a timeout
                       (`asyncio.run(main())`, no top-level await). docs/architecture.md's
                       example backend is saved beside it as `here_backend.py`. One that
                       opens the docker backend needs a reachable engine (skipped without
                       one, failed under SANDBOX_REQUIRE_ALL=1): it uses the suite's local
                       image (`ensure_busybox_image()`), never one to pull.
- ```python pytest     a complete pytest module, run as is there by `python -m pytest`.
- ```python signature  the shape of calls (`*,`, `...`), not a program: not run.
- ```sh                shell commands, run as one `sh -e` script there with this venv's
                       bin first on PATH: only safe, fast ones (`sandbox run -- echo hi`).
- ```json              parsed.
- ```text              not run: synopses, layouts, transcripts, slow commands
                       (`make test`), examples that need a provider account.

Besides: the example backend in docs/architecture.md runs for real (local processes)
using only the names it says a backend needs; the contract names every public name and
the architecture every backend-author name; every `src/...`/`tests/...` path and every
`sandbox.X` name a document mentions exists; cli.md covers every command, providers.md
every unix_local option, workspaces.md exactly the backends with snapshots; the number
of backends is the registry's everywhere; and no document sends a reader outside the
repository.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import sandbox
import sandbox.backend
from tests.conftest import skip_or_fail

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
    return str(blocks[-1])


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


# Any file or folder of ours a document names by its path from the root (not a pattern
# such as tests/backends/test_<name>.py; providers' own sources, in other languages, aside).
ROOT_PATH = re.compile(
    r"(?<![\w./-])((?:src|tests|scripts|tools|bench)/[\w./-]*[\w/])(?![\w/<*{-]|\.\w)"
)
FOREIGN_SUFFIXES = (".go", ".ts", ".js", ".rs")


def test_paths_from_the_root_named_in_docs_exist() -> None:
    missing = []
    for doc in _documents():
        for path in sorted(set(ROOT_PATH.findall(doc.read_text()))):
            if not path.endswith(FOREIGN_SUFFIXES) and not (ROOT / path).exists():
                missing.append(f"{doc.name}: {path}")
    assert not missing, "documents name paths that do not exist:\n" + "\n".join(missing)


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


# ---- code blocks ------------------------------------------------------------------------

FENCE = re.compile(r"^```([^`\n]*)\n(.*?)^```[ \t]*$", re.S | re.M)
INDENTED_FENCE = re.compile(r"^[ \t]+```", re.M)
RUN_KINDS = ("python", "python pytest", "sh")
KINDS = (*RUN_KINDS, "python signature", "json", "text")
EXAMPLE_TIMEOUT_S = 120  # all run at once on a shared two-core machine


@dataclass(frozen=True)
class Block:
    """One fenced code block of a document."""

    doc: str
    line: int
    kind: str
    code: str

    @property
    def label(self) -> str:
        return f"{self.doc}:{self.line}"


def _code_documents() -> list[Path]:
    return [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]


def _blocks() -> list[Block]:
    blocks = []
    for path in _code_documents():
        text = path.read_text()
        for match in FENCE.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            name = str(path.relative_to(ROOT))
            blocks.append(Block(name, line, match[1].strip(), match[2]))
    return blocks


BLOCKS = _blocks()
RUNNABLE = [b for b in BLOCKS if b.kind in RUN_KINDS]


def _needs_docker(block: Block) -> bool:
    return re.search(r"""open_session\(\s*["']docker["']""", block.code) is not None


def test_every_block_says_what_it_is() -> None:
    """Every fence carries a known info string, and none is indented (the parser would
    miss it, and so would a reader's copy)."""
    assert BLOCKS and RUNNABLE
    unknown = [f"{b.label} {b.kind!r}" for b in BLOCKS if b.kind not in KINDS]
    assert not unknown, f"info strings other than {KINDS}: {unknown}"
    for path in _code_documents():
        assert not INDENTED_FENCE.search(path.read_text()), path.name


def test_json_blocks_parse() -> None:
    for block in BLOCKS:
        if block.kind == "json":
            json.loads(block.code)


def _launch(block: Block, folder: Path) -> subprocess.Popen[str]:
    # Programs may import the example backend of docs/architecture.md, as the docs say.
    (folder / "here_backend.py").write_text(_example_backend())
    bin_dir = Path(sys.executable).parent
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}"}
    env.pop("PYTHONPATH", None)
    if block.kind == "sh":
        (folder / "example.sh").write_text(block.code)
        argv = ["sh", "-e", "example.sh"]
    elif block.kind == "python pytest":
        (folder / "test_example.py").write_text(block.code)
        argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_example.py"]
    else:
        (folder / "example.py").write_text(block.code)
        argv = [sys.executable, "example.py"]
    return subprocess.Popen(
        argv,
        cwd=folder,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


@pytest.fixture(scope="module")
def started(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Any]]:
    """The runnable blocks this run selected, all started with the module's first test,
    so they run while the other tests do: label -> process, or why it cannot run here."""
    from tests.backend_fixtures.docker import skip_reason

    selected = {
        item.callspec.id  # the block's label (ids=)
        for item in request.session.items
        if isinstance(item, pytest.Function) and item.originalname == "test_example_runs_as_written"
    }
    runs: dict[str, Any] = {}
    for block in RUNNABLE:
        if block.label not in selected:
            continue
        reason = skip_reason() if _needs_docker(block) else None
        if reason is not None:
            runs[block.label] = reason
            continue
        runs[block.label] = _launch(block, tmp_path_factory.mktemp("example"))
    yield runs
    for run in runs.values():
        if isinstance(run, subprocess.Popen):
            if run.poll() is None:
                os.killpg(run.pid, signal.SIGKILL)
                run.wait()
            if run.stdout is not None:
                run.stdout.close()


# On one xdist worker: the fixture starts every selected block at once (they run side by
# side), and each worker collects every item, so on several workers each would start all.
@pytest.mark.xdist_group("docs-examples")
@pytest.mark.parametrize("block", RUNNABLE, ids=[b.label for b in RUNNABLE])
def test_example_runs_as_written(block: Block, started: dict[str, Any]) -> None:
    """A person who copies the block and runs it meets no failure."""
    run = started[block.label]
    if isinstance(run, str):
        skip_or_fail(run)
    try:
        output, _ = run.communicate(timeout=EXAMPLE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(run.pid, signal.SIGKILL)
        output, _ = run.communicate()
        pytest.fail(f"{block.label} ran over {EXAMPLE_TIMEOUT_S} s:\n{output}")
    assert run.returncode == 0, f"{block.label} ({block.kind}) exited {run.returncode}:\n{output}"


# ---- one fact, one place ------------------------------------------------------------------

NUMBERS = {"two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8}
NUMBERS |= {"nine": 9, "ten": 10, "eleven": 11, "twelve": 12}
COUNTED_BACKENDS = re.compile(rf"\b({'|'.join(NUMBERS)}|\d+) backends\b", re.I)


def test_the_number_of_backends_is_the_registry_s() -> None:
    sources = [*_documents(), ROOT / "pyproject.toml"]
    wrong = []
    for path in sources:
        for said in COUNTED_BACKENDS.findall(path.read_text()):
            count = int(said) if said.isdigit() else NUMBERS[said.lower()]
            if count != len(sandbox.BACKENDS):
                wrong.append(f"{path.name}: {said} backends")
    assert not wrong, f"there are {len(sandbox.BACKENDS)} backends: {wrong}"
    readme = (ROOT / "README.md").read_text()
    table = {name for name in sandbox.BACKENDS if re.search(rf"^\| `{name}`", readme, re.M)}
    assert table == set(sandbox.BACKENDS), "the README's backend table"


def test_cli_doc_covers_every_command() -> None:
    from sandbox.cli.app import _build_parser

    (commands,) = [
        action
        for action in _build_parser()._actions
        if isinstance(action, argparse._SubParsersAction)
    ]
    # The synopsis at the top, where a reader looks for them, not a mention in passing.
    synopsis = next(b.code for b in BLOCKS if b.doc == "docs/cli.md")
    shown = set(re.findall(r"^sandbox ([a-z]+)", synopsis, re.M))
    missing = sorted(set(commands.choices) - shown)
    assert not missing, f"docs/cli.md's synopsis lacks: {missing}"


def _section(text: str, heading: str) -> str:
    start = text.index(f"\n{heading}\n")
    level = heading.split(" ")[0]
    end = re.compile(rf"^#{{1,{len(level)}}} ", re.M).search(text, start + len(heading) + 2)
    return text[start : end.start() if end else len(text)]


def _table_names(section: str) -> set[str]:
    return set(re.findall(r"^\| `([a-z_]+)` \|", section, re.M))


def test_every_option_is_in_its_one_table() -> None:
    """unix_local's own options in providers.md, the common ones in contract.md."""
    import inspect

    from sandbox.backends.unix_local.session import UnixLocalSession
    from sandbox.session.base import BaseSandboxSession

    def keywords(cls: type) -> set[str]:
        parameters = inspect.signature(cls).parameters.values()
        return {p.name for p in parameters if p.kind is inspect.Parameter.KEYWORD_ONLY}

    providers = _section((DOCS / "providers.md").read_text(), "## unix_local")
    assert keywords(UnixLocalSession) <= _table_names(providers), "providers.md, unix_local"
    common = _section((DOCS / "contract.md").read_text(), "## Opening a session")
    assert keywords(BaseSandboxSession) <= _table_names(common), "contract.md's option table"


def _backends_with_snapshots() -> set[str]:
    """The backends with a `Snapshots` capability whose `take` does more than refuse."""
    found = set()
    for module in sorted((ROOT / "src" / "sandbox" / "backends").glob("*/*.py")):
        for cls in ast.walk(ast.parse(module.read_text())):
            if not isinstance(cls, ast.ClassDef):
                continue
            if not any(isinstance(b, ast.Name) and b.id == "Snapshots" for b in cls.bases):
                continue
            for node in cls.body:
                if isinstance(node, ast.AsyncFunctionDef) and node.name == "take":
                    body = node.body[1:] if ast.get_docstring(node) else node.body
                    if not (len(body) == 1 and isinstance(body[0], ast.Raise)):
                        found.add(module.parent.name)
    return found


def test_snapshot_backends_are_listed_once_and_right() -> None:
    with_snapshots = _backends_with_snapshots()
    assert "docker" in with_snapshots and "cloudflare" not in with_snapshots
    section = _section((DOCS / "workspaces.md").read_text(), "## Snapshots")
    listed = set(re.findall(r"^- ([a-z0-9_]+): ", section, re.M))
    assert listed == with_snapshots, "docs/workspaces.md, Snapshots"
    for path in _documents():
        if path.name != "workspaces.md":
            # A list of them elsewhere drifts: say "where the provider has snapshots".
            text = path.read_text()
            assert not re.search(r"snapshots?\W+\((?:[a-z]+, )+[a-z]+", text), path.name


def test_readme_points_at_the_system_packages_script() -> None:
    readme = (ROOT / "README.md").read_text()
    assert "scripts/system-deps.sh" in readme
    assert (ROOT / "scripts" / "system-deps.sh").is_file()
