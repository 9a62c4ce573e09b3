"""The two public faces: `sandbox` for users, `sandbox.backend` for backend authors."""

from __future__ import annotations

import re
import warnings

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


@pytest.mark.parametrize("name", ["PtyEntry", "CommandSpec", "ProcessSpec"])
def test_old_spellings_still_work_with_a_warning(name: str) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        value = getattr(sandbox, name)
    assert value is getattr(sandbox.backend, name)
    assert any(issubclass(w.category, DeprecationWarning) for w in caught)


def test_an_entry_without_its_handle_says_so() -> None:
    from sandbox.backend import CommandSpec, ProcessSpec, PtyEntry

    command = CommandSpec(argv=("true",), shell_command="true", display="true", shell=False)
    entry: PtyEntry[int] = PtyEntry(1234, ProcessSpec(command=command, tty=False, rows=24, cols=80))
    with pytest.raises(RuntimeError, match="1234"):
        entry.require_handle()
    entry.handle = 7
    assert entry.require_handle() == 7
