"""The public faces: `sandbox` for users, `sandbox.backend` and `sandbox.backends.toolkit`
for backend authors, the `sandbox.testing` modules for tests; each `__all__` checked."""

from __future__ import annotations

import ast
import dataclasses
import importlib
import importlib.util
import inspect
import pkgutil
import re
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

import sandbox
import sandbox.backend

BACKEND_INTERNALS = {"PtyEntry", "CommandSpec", "ProcessSpec", "settle", "settle_each"}


def test_user_face_has_no_backend_internals_but_has_until_pattern() -> None:
    assert BACKEND_INTERNALS.isdisjoint(sandbox.__all__)
    assert "UntilPattern" in sandbox.__all__
    assert set(sandbox.UntilPattern.__args__) == {str, re.Pattern[str]}  # type: ignore[attr-defined]
    for name in sandbox.__all__:
        assert getattr(sandbox, name) is not None


def test_backend_face_has_what_an_author_needs() -> None:
    needed = BACKEND_INTERNALS | {
        "BaseSandboxSession",
        "ShellTrap",
        "LocalProcess",
        "Secret",
        "ExecCapture",
    }
    assert needed <= set(sandbox.backend.__all__)
    for name in sandbox.backend.__all__:
        assert getattr(sandbox.backend, name) is not None


@pytest.mark.parametrize("name", sorted(BACKEND_INTERNALS))
def test_backend_internals_are_not_reachable_from_the_user_face(name: str) -> None:
    # No alias kept for earlier callers (CHANGELOG.md): `sandbox.backend` has them.
    bound = getattr(sandbox, name, None)
    assert bound is None or isinstance(bound, ModuleType), bound


def test_a_submodule_import_binds_the_module() -> None:
    # `import sandbox.settle as m` takes the attribute `settle` of `sandbox`: a function
    # re-exported under a submodule's name would be bound instead.
    import sandbox.settle as m

    assert isinstance(m, ModuleType) and m.__name__ == "sandbox.settle"
    assert m.settle is sandbox.backend.settle


@pytest.mark.parametrize(
    "package",
    [
        sandbox.__name__,
        *sorted(i.name for i in pkgutil.walk_packages(sandbox.__path__, "sandbox.") if i.ispkg),
    ],
)
def test_no_package_shadows_a_submodule(package: str) -> None:
    try:
        module = importlib.import_module(package)
    except ImportError as exc:  # a backend whose SDK is not installed
        pytest.skip(str(exc))
    for info in pkgutil.iter_modules(module.__path__):
        bound = module.__dict__.get(info.name)
        assert bound is None or isinstance(bound, ModuleType), f"{package}.{info.name}: {bound!r}"


def test_an_entry_without_its_handle_says_so() -> None:
    from sandbox.backend import CommandSpec, ProcessSpec, PtyEntry

    command = CommandSpec(argv=("true",), shell_command="true", display="true", shell=False)
    entry: PtyEntry[int] = PtyEntry(1234, ProcessSpec(command=command, tty=False, rows=24, cols=80))
    with pytest.raises(RuntimeError, match="1234"):
        entry.require_handle()
    entry.handle = 7
    assert entry.require_handle() == 7


# ---- every public face: `__all__` sorted, complete, documented -------------------------
# (httpx's tests/test_exported_members.py and anyio's tests/test_all_attributes.py)

FACES = ["sandbox", "sandbox.backend", "sandbox.backends.toolkit"]
TESTING = sorted(
    f"sandbox.testing.{info.name}"
    for info in pkgutil.iter_modules([str(Path(sandbox.__file__).parent / "testing")])
)
# Bound in a face but not part of it, each for a stated reason.
NOT_EXPORTED: dict[str, set[str]] = {}


def _source(module: ModuleType) -> ast.Module:
    assert module.__file__ is not None
    return ast.parse(Path(module.__file__).read_text())


def _top_level(tree: ast.Module) -> Iterator[ast.stmt]:
    # Module level, including the blocks of a top-level `if TYPE_CHECKING:`.
    for node in tree.body:
        if isinstance(node, ast.If):
            yield from node.body
        else:
            yield node


def _public_names(module: ModuleType, *, imported: bool) -> set[str]:
    """Names the module defines at its top level; with `imported`, also those it imports
    from `sandbox` itself (a face defines little and re-exports the rest)."""
    names: set[str] = set()
    for node in _top_level(_source(module)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif imported and isinstance(node, ast.ImportFrom):
            if node.level or (node.module or "").partition(".")[0] == "sandbox":
                names.update(alias.asname or alias.name for alias in node.names)
    submodules = {info.name for info in pkgutil.iter_modules(getattr(module, "__path__", []))}
    return {n for n in names if not n.startswith("_") and n not in submodules}


def _documented(module: ModuleType, name: str) -> bool:
    """A class or function has its own docstring; any other value is named in the
    module's docstring or has a comment over its block of assignments (or after it)."""
    value = getattr(module, name)
    if inspect.isclass(value) or inspect.isfunction(value):
        doc = value.__dict__.get("__doc__") if inspect.isclass(value) else value.__doc__
        # A dataclass without a docstring gets its signature as one.
        return bool(doc and doc.strip()) and not doc.startswith(f"{value.__name__}(")
    if f"`{name}`" in (module.__doc__ or ""):
        return True
    for candidate in {module, *_defining_modules(module, name)}:
        assert candidate.__file__ is not None
        lines = Path(candidate.__file__).read_text().splitlines()
        for index, line in enumerate(lines):
            if line.startswith((f"{name} =", f"{name}: ")):
                # A comment heads the block of assignments it stands in, or trails it.
                above = index
                while above and lines[above - 1].strip():
                    above -= 1
                    if lines[above].lstrip().startswith("#"):
                        return True
                if "  # " in line:
                    return True
                if f"`{name}`" in (candidate.__doc__ or ""):
                    return True
    return False


def _defining_modules(module: ModuleType, name: str) -> list[ModuleType]:
    # Where a face got `name` from, following relative and `sandbox.` imports.
    found = []
    package = module.__name__ if hasattr(module, "__path__") else module.__name__.rpartition(".")[0]
    for node in _top_level(_source(module)):
        if isinstance(node, ast.ImportFrom) and any(
            (a.asname or a.name) == name for a in node.names
        ):
            target = importlib.util.resolve_name("." * node.level + (node.module or ""), package)
            found.append(importlib.import_module(target))
    return found


def _module(name: str) -> ModuleType:
    return importlib.import_module(name)


@pytest.mark.parametrize("name", FACES + TESTING)
def test_all_is_sorted(name: str) -> None:
    exported = list(_module(name).__all__)

    # isort style, as ruff's RUF022 keeps it: CONSTANTS, then Classes, then functions.
    def style(item: str) -> tuple[int, str]:
        return (0 if item.isupper() else 1 if item[0].isupper() else 2, item)

    assert exported == sorted(exported, key=style)
    assert len(set(exported)) == len(exported)


@pytest.mark.parametrize("name", FACES + TESTING)
def test_all_is_complete(name: str) -> None:
    module = _module(name)
    public = _public_names(module, imported=name in FACES) - NOT_EXPORTED.get(name, set())
    assert set(module.__all__) == public
    for item in module.__all__:
        assert hasattr(module, item)


@pytest.mark.parametrize("name", FACES + TESTING)
def test_every_exported_name_is_documented(name: str) -> None:
    module = _module(name)
    assert (module.__doc__ or "").strip()
    undocumented = [item for item in module.__all__ if not _documented(module, item)]
    assert undocumented == []


def test_the_completeness_check_sees_a_missing_name() -> None:
    import sandbox.testing.special_files as special

    assert _public_names(special, imported=False) == {"wait_forever_on_special_file"}
    assert "ShellTrap" in _public_names(sandbox.backend, imported=True)
    # A dataclass without its own docstring is not documented by its signature.
    bare = ModuleType("bare")
    bare.Bare = dataclasses.make_dataclass("Bare", [("x", int)])  # type: ignore[attr-defined]
    assert not _documented(bare, "Bare")
