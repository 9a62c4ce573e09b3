"""The optional C extension modules, built at install time (setup.py), and the one
switch that turns them off.

Each extension has a pure-Python path that gives the same results; `load` says which
one runs. `SANDBOX_NO_EXTENSIONS=1` (any value but "" and "0") forces the pure path,
as `MULTIDICT_NO_EXTENSIONS` does for multidict. Nothing is compiled at run time: a
module the install could not build (no C compiler, another platform) is simply absent,
and importing it raises `ImportError`.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

SWITCH = "SANDBOX_NO_EXTENSIONS"


def switched_off() -> bool:
    """Whether `SANDBOX_NO_EXTENSIONS` asks for the pure-Python paths."""
    return os.environ.get(SWITCH, "") not in ("", "0")


def load(name: str) -> tuple[ModuleType | None, str]:
    """The extension module `sandbox._native.<name>` and "", or None and why it is not
    used (the switch is set, or the install did not build it)."""
    if switched_off():
        return None, f"{SWITCH} is set"
    try:
        return importlib.import_module(f"{__name__}.{name}"), ""
    except ImportError as exc:
        return None, f"not built at install time: {exc}"
