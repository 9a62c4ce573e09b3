"""The layers of `src/sandbox`, checked from the source: no import cycle, backends
through the faces only, and faces that load nothing heavy.

The graph counts every import the source spells: top-level, under `TYPE_CHECKING` and
inside functions. A cycle that only a lazy or type-only import closes still fails here,
because it is still a layering knot a reader has to untie. Importing a package's
submodule counts as an edge to that submodule, not to the package's `__init__`.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import sandbox

PACKAGE_DIR = Path(sandbox.__file__).parent

# What a backend may import from the core (AGENTS.md, "Layout").
# `sandbox.runner` is a face too: the runner's client, which a backend holds to reach
# the runner inside its sandbox (docs/runner.md).
BACKEND_FACES = frozenset(
    {
        "sandbox",
        "sandbox.backend",
        "sandbox.errors",
        "sandbox.types",
        "sandbox.backends.toolkit",
        "sandbox.runner",
    }
)
# unix_local is the local backend itself: it drives `sandbox.local` (the child, its /proc
# tree, its cgroup) directly, as the stand-ins in `sandbox.testing` do.
LOCAL_LAYER = "sandbox.local"

SDKS = ("docker", "e2b", "daytona", "modal", "blaxel", "mcp", "agents", "openai", "pyte")


def module_files(root: Path = PACKAGE_DIR) -> dict[str, tuple[Path, bool]]:
    """Every module under `root`: dotted name -> (file, is a package)."""
    found: dict[str, tuple[Path, bool]] = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        if is_package:
            parts.pop()
        found[".".join(parts)] = (path, is_package)
    return found


def imports_of(
    name: str, path: Path, is_package: bool, known: set[str]
) -> Iterator[tuple[str, int]]:
    """(imported sandbox module, line) for every import statement anywhere in the file."""
    package = name if is_package else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.partition(".")[0] == "sandbox":
                    yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.partition(".")[0] != "sandbox":
                continue
            for alias in node.names:
                submodule = f"{target}.{alias.name}"
                yield (submodule if submodule in known else target), node.lineno


def import_graph(root: Path = PACKAGE_DIR) -> dict[str, dict[str, int]]:
    """module -> {imported module: first line}, for the modules under `root`."""
    files = module_files(root)
    known = set(files)
    graph: dict[str, dict[str, int]] = {}
    for name, (path, is_package) in files.items():
        edges: dict[str, int] = {}
        for target, line in imports_of(name, path, is_package, known):
            if target in known and target != name:
                edges.setdefault(target, line)
        graph[name] = edges
    return graph


def find_cycle(graph: dict[str, dict[str, int]]) -> list[str] | None:
    """One cycle as a path [a, b, ..., a], or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for target in sorted(graph[node]):
            if state.get(target) == 1:
                return [*path[path.index(target) :], target]
            if target not in state and (cycle := visit(target)) is not None:
                return cycle
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (cycle := visit(start)) is not None:
            return cycle
    return None


def backend_violations(graph: dict[str, dict[str, int]]) -> list[str]:
    """Imports from a backend package into the core past the faces."""
    wrong = []
    for name, edges in graph.items():
        parts = name.split(".")
        if len(parts) < 3 or parts[1] != "backends" or parts[2] == "toolkit":
            continue
        own = ".".join(parts[:3])
        for target, line in sorted(edges.items()):
            if target == own or target.startswith(own + ".") or target in BACKEND_FACES:
                continue
            in_local = target == LOCAL_LAYER or target.startswith(LOCAL_LAYER + ".")
            if parts[2] == "unix_local" and in_local:
                continue
            wrong.append(f"{name}:{line} imports {target}")
    return wrong


def test_the_graph_sees_type_only_and_function_local_imports() -> None:
    graph = import_graph()
    # `PtyEntry` imports the screen under TYPE_CHECKING and inside `__post_init__`.
    assert "sandbox.terminal.screen" in graph["sandbox.process_entry"]
    # The registry imports the session for its annotations only.
    assert "sandbox.session" in graph["sandbox.backends"]
    # The backend flags import the command line's limit flags inside a function.
    assert "sandbox.cli.limit_flags" in graph["sandbox.backends.toolkit.options"]


def test_find_cycle_reports_a_planted_cycle(tmp_path: Path) -> None:
    package = tmp_path / "sandbox"
    (package / "inner").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "inner" / "__init__.py").write_text("")
    (package / "a.py").write_text("from .inner import b\n")
    (package / "inner" / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .. import c\n"
    )
    (package / "c.py").write_text("def f():\n    import sandbox.a\n")
    graph = import_graph(package)
    assert find_cycle(graph) == ["sandbox.a", "sandbox.inner.b", "sandbox.c", "sandbox.a"]
    (package / "c.py").write_text("")
    assert find_cycle(import_graph(package)) is None


def test_no_import_cycle_between_modules() -> None:
    cycle = find_cycle(import_graph())
    assert cycle is None, " -> ".join(cycle or [])


def test_backends_import_the_core_only_through_the_faces() -> None:
    graph = import_graph()
    backends = [name for name in graph if name.startswith("sandbox.backends.")]
    assert any(name.startswith("sandbox.backends.docker.") for name in backends)
    assert backend_violations(graph) == []


def test_a_backend_reaching_past_the_faces_is_reported() -> None:
    graph = {
        "sandbox.backends.docker.session": {"sandbox.backend": 1, "sandbox.settle": 3},
        "sandbox.backends.unix_local.session": {"sandbox.local.tree": 2},
        "sandbox.backends.e2b.session": {"sandbox.local.process": 4},
    }
    assert backend_violations(graph) == [
        "sandbox.backends.docker.session:3 imports sandbox.settle",
        "sandbox.backends.e2b.session:4 imports sandbox.local.process",
    ]


@pytest.mark.parametrize("face", ["sandbox", "sandbox.backend"])
def test_a_face_loads_no_sdk_no_pyte_and_no_backend_package(face: str) -> None:
    # A fresh interpreter: this one has imported everything already.
    code = f"import json, sys, {face}; print(json.dumps(sorted(sys.modules)))"
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    loaded = json.loads(done.stdout)
    heavy = [name for name in loaded if name.partition(".")[0] in SDKS]
    backend_packages = [
        name
        for name in loaded
        if name.startswith("sandbox.backends.") and name.split(".")[2] != "toolkit"
    ]
    assert heavy == []
    assert backend_packages == []
    assert face in loaded
