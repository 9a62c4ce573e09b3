"""The hooks contract, checked for every backend in `BACKENDS`.

A backend class defines nothing of `BaseSandboxSession` except the hooks declared in
`SessionHooks` (the base refuses such a class when it is made), and the base keeps its
state in one name-mangled object (`SessionCore`) behind read-only properties, so a
backend's own state can never break the registry, the owned tasks or the lifecycle by
a clash: no source scan is needed.
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

import sandbox.backends
from sandbox.backends import BACKENDS, load_backend
from sandbox.errors import BackendUnavailableError
from sandbox.session import BaseSandboxSession, SessionHooks
from sandbox.session.core import SessionCore


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


HOOKS = frozenset(name for name in vars(SessionHooks) if _private(name))
CAPABILITIES = frozenset(
    {"_file_access", "_workspace_access", "_ports", "_snapshots", "_durability"}
)


def _own_classes(cls: type) -> list[type]:
    """The classes between `cls` and the base session (the backend's own)."""
    return [
        k
        for k in cls.__mro__
        if issubclass(k, BaseSandboxSession) and k not in (BaseSandboxSession, SessionHooks)
    ]


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
    # Everything the base owns is in one object, out of a subclass's namespace.
    session = BaseSandboxSession()
    assert set(vars(session)) == {"_BaseSandboxSession__core"}
    assert isinstance(session._core, SessionCore)


@pytest.mark.parametrize("name", sorted(BACKENDS))
def test_a_backend_defines_only_hooks_and_its_own_names(name: str) -> None:
    # Made at import: a clash would have raised TypeError there (`__init_subclass__`).
    cls = _backend(name)
    base_names = set(dir(BaseSandboxSession)) - set(vars(SessionHooks))
    for k in _own_classes(cls):
        defined = {n for n in vars(k) if not (n.startswith("__") and n.endswith("__"))}
        assert defined & base_names == set(), f"{k.__name__} redefines the base's names"


def test_a_backend_that_redefines_the_base_is_refused_when_its_class_is_made() -> None:
    with pytest.raises(TypeError, match=r"redefines _core, exec of BaseSandboxSession"):

        class Clashing(BaseSandboxSession[None]):
            backend_name = "clashing"
            _core = None

            async def exec(self, *command: str) -> None:  # type: ignore[override]
                """Would bypass the base's checks."""

            async def _spawn_process(self, entry: object) -> None:  # type: ignore[override]
                """A hook: fine."""

    class Fine(BaseSandboxSession[None]):
        backend_name = "fine"

        def __init__(self) -> None:
            super().__init__()
            self._client: object = None  # its own state: fine

    assert Fine()._client is None


def test_a_backend_cannot_replace_the_base_state_by_assigning_it() -> None:
    session = BaseSandboxSession()
    for name in ("_core", "output_limit_bytes", "read_limit_bytes", "exec_output_limit_bytes"):
        with pytest.raises(AttributeError):
            setattr(session, name, None)
    assert session.output_limit_bytes > 0


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
