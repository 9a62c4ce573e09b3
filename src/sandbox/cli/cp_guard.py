"""`sandbox cp` into a sandbox that would be gone when the copy ends is refused.

Without `--session`, `cp` opens a session for the copy and closes it after: a sandbox
made for it is deleted then, with what was copied in. Copying into one is refused
(exit 2) unless an option names something that outlives the command: a host workspace
(unix_local), a running container, pod or sandbox to attach to, or a `keep` option.
Copying out of a fresh one stays allowed: a file of an image can be read that way.
"""

from __future__ import annotations

from typing import Any

from ..errors import InvalidArgumentError

# Options naming what is there before the session and after it (unix_local's `workdir`
# too: a host folder; elsewhere it is a folder in the sandbox, gone with it).
ATTACHING = ("container", "pod", "sandbox_id")
# The option that leaves a created sandbox running after the close.
KEEPING = ("keep",)

# What else makes a copy into the sandbox last, for the backends that have it.
_ALTERNATIVE = {
    "unix_local": "or pass --workdir DIR (a host folder that stays)",
    "docker": "or pass --container NAME (a running container) or --opt keep=true",
    "kubernetes": "or pass --opt pod=NAME (a running pod) or --opt keep=true",
}


def refuse_throwaway_target(backend: str, options: dict[str, Any], session: str | None) -> None:
    """Raise `InvalidArgumentError` when a copy into the sandbox would land in one
    deleted as soon as the command ends."""
    if session is not None or any(options.get(name) for name in (*ATTACHING, *KEEPING)):
        return
    if backend == "unix_local" and options.get("workdir"):
        return
    other = _ALTERNATIVE.get(backend, "or pass --sandbox-id ID (a sandbox that stays)")
    raise InvalidArgumentError(
        "cp into a sandbox needs one that outlives the command (without --session the "
        "sandbox is deleted as soon as the copy ends): run `sandbox open > ref.json`, "
        f"then `sandbox cp --session ref.json SRC :DST`; {other}"
    )
