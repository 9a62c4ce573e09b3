"""`resume_session(ref, **options)`: a session attached to the sandbox a ref names.

Used like `open_session`: `async with resume_session(ref) as session:`. Starting it
attaches to the same sandbox (`SessionGoneError` when it no longer exists), takes the
lease over (the client that made the ref, if it still runs, gets
`SessionTakenOverError` from its next call) and registers the ref's processes under
their ids: reattached where the backend keeps processes (`keeps_processes`), else (and
where the provider lost one) ended, with a note saying why.
"""

from __future__ import annotations

import os
from typing import Any

from ..errors import InvalidArgumentError
from ..session.capabilities import Durability
from ..session.options import bad_option_error
from .ref_file import read_ref_file
from .refs import SessionRef


def load_ref(ref: SessionRef | str | bytes | os.PathLike[str]) -> SessionRef:
    """A `SessionRef` from a ref, its JSON text, or a ref file's path (`os.PathLike`)."""
    if isinstance(ref, SessionRef):
        return ref
    if isinstance(ref, os.PathLike):
        return read_ref_file(ref)
    if isinstance(ref, str | bytes):
        return SessionRef.from_json(ref)
    raise InvalidArgumentError(f"not a session ref: {type(ref).__name__}")


# Options whose one value is the narrower: a ref and the caller each may ask for it, and
# neither can take it back from the other (a confined session stays confined).
NARROWER: dict[str, object] = {"confine": True, "network": False, "inherit_env": False}


def merge_options(from_ref: dict[str, Any], given: dict[str, Any]) -> dict[str, Any]:
    """The options of a resumed session: the caller's win over the ref's, except that
    for the options of `NARROWER` the narrower of the two values wins, whichever side
    gave it (a ref never widens what the caller asked for, nor the caller a confinement
    the session was made with)."""
    merged = dict(from_ref)
    merged.update(given)
    for name, narrow in NARROWER.items():
        if from_ref.get(name) == narrow or given.get(name) == narrow:
            merged[name] = narrow
    return merged


def resume_session(ref: SessionRef | str | bytes | os.PathLike[str], **options: Any) -> Any:
    """An unstarted session of `ref.backend` that attaches to `ref`'s sandbox when
    started. `options` add to (and win over, see `merge_options`) the non-secret options
    the ref kept: credentials, `env`, a `ref_file` to keep current. A ref given as JSON
    text or a file must carry this user's seal (`RefNotTrustedError`). Returns a
    `BaseSandboxSession`."""
    from ..backends import load_backend

    ref = load_ref(ref)
    cls = load_backend(ref.backend)
    merged = merge_options((cls._durability or Durability).options_from_ref(ref), options)
    try:
        session = cls(**merged)
    except TypeError as exc:
        raise bad_option_error(ref.backend, cls, merged, exc) from None
    session._core.durable.begin_resume(ref)
    return session
