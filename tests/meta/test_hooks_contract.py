"""The hooks contract, checked for every backend in `BACKENDS`.

A backend class overrides no underscore name of `BaseSandboxSession` except the hooks
declared in `SessionHooks`, and sets no attribute (anywhere in its methods) that the
base session already has: its own state goes in its own names, so it can never break
the registry, the owned tasks or the lifecycle by a clash. Read statically (the
class's source), so a backend whose constructor needs credentials is checked too.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from pathlib import Path

import pytest

import sandbox.backends
from sandbox.backends import BACKENDS, load_backend
from sandbox.errors import BackendUnavailableError
from sandbox.session import BaseSandboxSession, SessionHooks


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


HOOKS = frozenset(name for name in vars(SessionHooks) if _private(name))
CAPABILITIES = frozenset(
    {"_file_access", "_workspace_access", "_ports", "_snapshots", "_durability"}
)
BASE_PRIVATE = frozenset(name for name in dir(BaseSandboxSession) if _private(name))
# What a constructed base session holds, plus every name its class defines.
BASE_ATTRIBUTES = frozenset(vars(BaseSandboxSession())) | frozenset(
    name for name in dir(BaseSandboxSession) if not name.startswith("__")
)


def _own_classes(cls: type) -> list[type]:
    """The classes between `cls` and the base session (the backend's own)."""
    return [
        k
        for k in cls.__mro__
        if issubclass(k, BaseSandboxSession) and k not in (BaseSandboxSession, SessionHooks)
    ]


def overridden_internals(cls: type) -> set[str]:
    """Underscore names of the base that `cls` redefines and that are not hooks."""
    defined = {name for k in _own_classes(cls) for name in vars(k) if _private(name)}
    return (defined & BASE_PRIVATE) - HOOKS


def assigned_attributes(cls: type) -> set[str]:
    """Every `self.<name>` the backend's own classes assign, in any method."""
    names: set[str] = set()
    for k in _own_classes(cls):
        tree = ast.parse(textwrap.dedent(inspect.getsource(k)))
        for node in ast.walk(tree):
            targets: list[ast.expr] = []
            if isinstance(node, ast.Assign):
                targets = list(node.targets)
            elif isinstance(node, ast.AnnAssign | ast.AugAssign):
                targets = [node.target]
            for target in targets:
                for sub in ast.walk(target):
                    if (
                        isinstance(sub, ast.Attribute)
                        and isinstance(sub.value, ast.Name)
                        and sub.value.id == "self"
                    ):
                        names.add(sub.attr)
    return names


def _backend(name: str) -> type[BaseSandboxSession]:
    try:
        return load_backend(name)
    except BackendUnavailableError as exc:
        pytest.skip(f"the {name} backend's extra is not installed: {exc}")


def test_the_hooks_are_the_backend_contract() -> None:
    # The hooks named in docs/architecture.md; `_exec` is no longer one.
    assert HOOKS == {
        "_start_backend",
        "_stop_backend",
        "_start_exec",
        "_spawn_process",
        "_write_stdin",
        "_close_stdin",
        "_resize",
        "_interrupt",
        "_terminate_pty_entry",
        "_abandon",
        "_final_drain",
        # capabilities: one attribute each (session/capabilities.py)
        "_file_access",
        "_workspace_access",
        "_ports",
        "_snapshots",
        "_durability",
        # a flag: whether the backend's `Process` handles can keep stdin open
        "_stdin_stays_open",
    }
    for name in (
        HOOKS - CAPABILITIES - {"_stdin_stays_open"}
    ):  # capability types, described by their comment
        assert inspect.getdoc(getattr(SessionHooks, name)), f"{name} has no contract docstring"
    # The base session's internals live in its collaborators, not beside the hooks.
    assert {"_processes", "_owned", "_lifecycle", "_session_options"} <= BASE_ATTRIBUTES
    assert (
        not {
            "_registry",
            "_starting",
            "_lock",
            "_execs",
            "_teardowns",
            "_state",
            "_closing",
        }
        & BASE_ATTRIBUTES
    )


@pytest.mark.parametrize("name", sorted(BACKENDS))
def test_a_backend_overrides_only_hooks(name: str) -> None:
    cls = _backend(name)
    assert overridden_internals(cls) == set(), (
        f"{cls.__name__} redefines internals of the base session"
    )


@pytest.mark.parametrize("name", sorted(BACKENDS))
def test_a_backends_attributes_never_clash_with_the_base(name: str) -> None:
    cls = _backend(name)
    assert assigned_attributes(cls) & BASE_ATTRIBUTES == set(), (
        f"{cls.__name__} sets attributes the base session owns"
    )


class _Clashing(BaseSandboxSession[None]):
    """What the checks must catch: an internal redefined, the base's state assigned."""

    backend_name = "clashing"

    def __init__(self) -> None:
        super().__init__()
        self._processes = None  # would replace the registry
        self._client: object = None  # its own: fine

    def _lookup(self, process_id: int) -> None:  # type: ignore[override]
        """Not a hook."""

    async def _spawn_process(self, entry: object) -> None:  # type: ignore[override]
        """A hook: fine."""


def test_the_checks_catch_a_clashing_backend() -> None:
    assert overridden_internals(_Clashing) == {"_lookup"}
    assert assigned_attributes(_Clashing) & BASE_ATTRIBUTES == {"_processes"}


def _names_used(path: Path) -> set[str]:
    """Every identifier a module names: imports, names and attribute names."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Name):
            names.add(node.id)
        elif isinstance(node, ast.Attribute):
            names.add(node.attr)
        elif isinstance(node, ast.alias):
            names.add(node.name.rsplit(".", 1)[-1])
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            names.update(node.value.replace("[", " ").replace("]", " ").split())
    return names


def test_backends_see_a_process_only_as_an_output_sink() -> None:
    """No backend module names the session's record: hooks and capabilities take an
    `OutputSink`, so mypy strict stops a backend from reaching the record's locks,
    tasks or windows."""
    root = Path(sandbox.backends.__file__).parent
    modules = sorted(root.rglob("*.py"))
    assert len(modules) > 30  # the walk found the backends
    naming = [str(p.relative_to(root)) for p in modules if "PtyEntry" in _names_used(p)]
    assert naming == []
    assert "OutputSink" in _names_used(root / "docker" / "session.py")
