"""The lease: one owner of a sandbox across clients.

A lease is one short text per session (keyed by `SessionRef.session_id`) kept where
every client reaches it: in the sandbox, or where the provider keeps an owner. Its value
is one of

- absent: nobody resumed the session; its first client owns it;
- `owner <token>`: the client whose random token this is owns it (a resume wrote it);
- `closing <token>`: that client is closing it (deleting the sandbox);
- `closed`: it was closed.

A backend provides two primitives (`LeaseStore`): `read()` and `swap(expected, new)`,
an atomic compare-and-set that returns the value it found (the swap happened when that
equals `expected`). Everything else is decided here, so each rule holds on every
backend:

- `take_over` (a resume) replaces any owner by its own token; a session closing or
  closed is gone (`SessionGoneError`);
- `holds` says whether a client is still the owner (absent counts as the first client's);
- `claim_close` turns its own ownership into `closing` before anything is torn down; if
  another client owns the lease, it answers False and the caller leaves everything alone.

So a resume racing a close is decided by the lease: exactly one of the two swaps lands.
"""

from __future__ import annotations

import secrets
from typing import Protocol

from ..errors import SessionGoneError

CLOSED = "closed"
# Bounds a compare-and-set loop: every failed swap means another client changed the
# lease, so this many in a row is a fight no caller can win.
MAX_SWAPS = 32


class LeaseStore(Protocol):
    """Where one session's lease lives (a backend's primitives)."""

    async def read(self) -> str | None:
        """The lease's value, None when there is none."""
        ...

    async def swap(self, expected: str | None, new: str) -> str | None:
        """Atomically: if the lease is `expected`, make it `new`. Return what it was."""
        ...


def new_token() -> str:
    """A fresh owner token (random: two clients never share one)."""
    return secrets.token_hex(12)


def owner_value(token: str) -> str:
    """The lease value saying `token` owns the session."""
    return f"owner {token}"


def _closing(value: str | None) -> bool:
    return value is not None and (value == CLOSED or value.startswith("closing "))


def holds(value: str | None, token: str) -> bool:
    """Whether the client with `token` owns the session, by the lease's `value`."""
    return value is None or value == owner_value(token) or value == f"closing {token}"


async def take_over(store: LeaseStore, token: str, what: str) -> None:
    """Make `token` the owner, whoever owned it (`what` names the sandbox in errors)."""
    current = await store.read()
    for _ in range(MAX_SWAPS):
        if _closing(current):
            raise SessionGoneError(f"{what} was closed by its owner")
        found = await store.swap(current, owner_value(token))
        if found == current:
            return
        current = found
    raise SessionGoneError(f"{what}: its lease keeps changing; another client is taking it")


async def still_holds(store: LeaseStore, token: str) -> bool:
    """Whether `token` still owns the session (one read)."""
    return holds(await store.read(), token)


async def claim_close(store: LeaseStore, token: str) -> bool:
    """Before a close tears anything down: mark the lease `closing <token>`. False when
    another client owns the session (then nothing may be torn down)."""
    current = await store.read()
    for _ in range(MAX_SWAPS):
        if not holds(current, token):
            return False
        found = await store.swap(current, f"closing {token}")
        if found == current:
            return True
        current = found
    return False


async def mark_closed(store: LeaseStore, token: str) -> None:
    """After the close: the session is gone (a later resume raises `SessionGoneError`)."""
    await store.swap(f"closing {token}", CLOSED)
