"""The host's environment as a `dict`, copied cheaply at every spawn.

`dict(os.environ)` decodes every name and value in Python (a mapping view over bytes),
which cost a local start about 50 us for 35 variables: more than all the rest of the
environment's handling. The decoded copy is kept and reused for as long as the bytes
beneath `os.environ` are unchanged, which a C-level comparison of two small dicts tells
in under a microsecond; any change to `os.environ` (or an interpreter without that
mapping of bytes) decodes afresh, so a spawn always sees the environment of its moment.
"""

from __future__ import annotations

import os
import sys

_ENCODING = sys.getfilesystemencoding()

_seen: dict[bytes, bytes] = {}  # the raw variables `_decoded` was made from
_decoded: dict[str, str] = {}


def host_environment() -> dict[str, str]:
    """A fresh copy of `os.environ` (the caller may change it)."""
    global _seen, _decoded
    # What `os.environ` keeps on POSIX: its variables as bytes, which it updates (and
    # `putenv`s) on every change. Looked up each time: `os.environ` may be replaced.
    raw = getattr(os.environ, "_data", None)
    if type(raw) is not dict:
        return dict(os.environ)
    if raw != _seen:
        # Decoded from one snapshot (as `os.environ` decodes), so a thread changing the
        # environment meanwhile cannot leave the cache out of step with `_seen`.
        snapshot: dict[bytes, bytes] = dict(raw)
        _decoded = {
            key.decode(_ENCODING, "surrogateescape"): value.decode(_ENCODING, "surrogateescape")
            for key, value in snapshot.items()
        }
        _seen = snapshot
    return dict(_decoded)
