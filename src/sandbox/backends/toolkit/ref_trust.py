"""What even a sealed ref may not decide, one rule for every remote backend.

A ref is sealed (`sandbox.durable.seal`), but it can still be replayed or made against
another deployment, so at resume (docs/durable-sessions.md, "What a ref and a lease may
decide"):

- only an allow-list of options is taken from it (`taken_from_ref`): never an
  endpoint, a credential, a class or anything that loads code;
- the endpoint comes from the caller or the environment; a ref made against another
  one is refused unless the caller names it (`refuse_other_endpoint`), so credentials
  from the environment go only where the environment points;
- a sandbox the resumed close would delete must carry our mark, `SESSION_MARK` with the
  ref's session id, as the provider reports it (`check_mark`).
"""

from __future__ import annotations

from collections.abc import Mapping

from ...durable.refs import SessionRef
from ...errors import InvalidArgumentError, RefNotTrustedError

# The label, tag or metadata key of the sandboxes (containers, pods) a session creates.
SESSION_MARK = "sandbox.session"

# The base session's options a ref keeps (`durable.ops.base_options`): bounds only.
BASE_TAKEN_FROM_REF = frozenset(
    {
        "max_processes",
        "output_limit_bytes",
        "teardown_concurrency",
        "read_limit_bytes",
        "exec_output_limit_bytes",
    }
)


def taken_from_ref(*names: str) -> frozenset[str]:
    """The options a backend's resume takes from a ref: the base bounds and `names`."""
    return BASE_TAKEN_FROM_REF | frozenset(names)


def refuse_other_endpoint(backend: str, option: str, recorded: object, used: str) -> None:
    """Raise when the ref was made against another endpoint than the one this client
    would use (its credentials go there only, never to the one a ref names)."""
    if recorded is None or recorded == used:
        return
    raise InvalidArgumentError(
        f"the {backend} ref was made against {recorded!r}; this client would use {used!r}; "
        f"pass {option}={recorded!r} to resume it there"
    )


def check_mark(
    ref: SessionRef,
    marks: object,
    *,
    backend: str,
    what: str,
    kind: str = "label",
    ending: str = "deletes",
    keep_hint: bool = True,
) -> None:
    """Refuse to take on ending `what` (a sandbox, a pod) unless the provider shows our
    mark with the ref's session id among its `marks` (labels, tags, metadata)."""
    found = marks.get(SESSION_MARK) if isinstance(marks, Mapping) else None
    if found == ref.session_id:
        return
    claim = (
        "says its session created"
        if ref.sandbox.get("created", True) is True
        else f"says the close {ending} (the session attached to it)"
    )
    hint = "; to resume it and leave it running, pass keep=True" if keep_hint else ""
    raise RefNotTrustedError(
        f"the {backend} ref {claim} {what}, but the provider shows no {SESSION_MARK} "
        f"{kind} of session {ref.session_id} on it: the library did not make it, so it is "
        f"not resumed (and nothing is {ending.removesuffix('s')}d){hint}"
    )
