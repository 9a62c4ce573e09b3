"""The `modal` backend: Modal sandboxes through the SDK's async (`.aio`) calls.

`session` holds `ModalSession` (the hooks); see its module docstring for how processes
are run, signalled and torn down, and `options` for the options it takes.
"""

from __future__ import annotations

from .session import ModalSession

__all__ = ["ModalSession"]
