"""The lease: one owner of a sandbox across clients, in records the sandbox cannot forge.

A lease is one short text per session (keyed by `SessionRef.session_id`) kept where
every client reaches it: in the sandbox, or on this host (unix_local). A process in the
sandbox can write it, so every record carries a seal (`sandbox.durable.seal`) under the
session's secret, which never enters the sandbox:

- `owner <token> <epoch> <hold_ms> <seal>`: the client whose random token this is owns
  the session; `epoch` grows at each takeover; `hold_ms` is how long that client may
  act on its last check of the lease without reading it again (0: it let go, a detach);
- `closing <token> <epoch> <seal>`: that client is closing the session;
- `closed <epoch> <seal>`: it was closed.

A value that fails the check (no seal, a wrong one, malformed, oversized), or a sealed
record of an earlier epoch than the reader's own (one the sandbox kept and wrote back),
is *forged*: reported once, and never a takeover. Its owner keeps owning, a resume may
replace it, a close may claim over it. So the worst a process in the sandbox can do to
the lease is what it can do to its sandbox anyway (stop it); it cannot make the owner's
close leave the sandbox running.

A backend provides two primitives (`LeaseStore`): `read()` and `swap(expected, new)`,
an atomic compare-and-set that returns the value it found (the swap happened when that
equals `expected`). Everything else is decided here, so each rule holds on every
backend:

- `check` (an owner's call): whether `Holder` still owns the session; a shared session's
  owner writes its own record at its first check, so "absent" means "never shared";
- `take_over` (a resume) replaces any owner by itself at the next epoch and says how
  long to wait before acting: the hold the previous record announced, after which no
  earlier owner acts on a check it made before the swap;
- `claim_close` turns its own ownership into `closing` before anything is torn down;
  only a sealed record of a later owner makes it answer False (leave everything alone);
- `release` (a detach) rewrites the owner's record with a hold of 0.

So a resume racing a close is decided by the lease: exactly one of the two swaps lands.
"""

from __future__ import annotations

import enum
import re
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Protocol

from ..errors import SessionGoneError
from . import seal

OWNER = "owner"
CLOSING = "closing"
CLOSED = "closed"
# How long an owner acts on one check of the lease without reading it again, and so how
# long a resume that takes over waits before its first call. Long enough that a session
# in use renews it in the background at a small cost (one read per `RENEW_AFTER` of it),
# short enough that a takeover after a crash is not noticeably slow.
HOLD_MS = 1000
# A sealed record is ours, but a resume never waits longer than this on its word.
MAX_HOLD_MS = 60_000
# The share of the hold after which a session in use reads the lease again.
RENEW_AFTER = 0.6
# Every record we write is far shorter; anything longer is not read further.
MAX_RECORD_CHARS = 256
# Bounds a compare-and-set loop: every failed swap means another client (or the
# sandbox) changed the lease, so this many in a row is a fight no caller can win.
MAX_SWAPS = 32

_TOKEN = re.compile(r"[0-9a-f]{24}")
_NUMBER = re.compile(r"[0-9]{1,19}")


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


@dataclass(frozen=True)
class Record:
    """One lease record whose seal matched: `state` is `OWNER`, `CLOSING` or `CLOSED`."""

    state: str
    token: str
    epoch: int
    hold_ms: int = 0

    def body(self) -> str:
        """The sealed text, without its seal."""
        if self.state == OWNER:
            return f"{OWNER} {self.token} {self.epoch} {self.hold_ms}"
        if self.state == CLOSING:
            return f"{CLOSING} {self.token} {self.epoch}"
        return f"{CLOSED} {self.epoch}"

    def sealed(self, key: bytes) -> str:
        """The record as the lease's value, sealed under the session's secret `key`."""
        body = self.body()
        return f"{body} {seal.seal(seal.LEASE_PURPOSE, body.encode(), key)}"


@dataclass(frozen=True)
class Forged:
    """A lease value that failed the check; `reason` says how (never the value)."""

    reason: str


def parse(value: str | None, key: bytes) -> Record | Forged | None:
    """What the lease's `value` says: a `Record`, `Forged`, or None when it is absent."""
    if value is None:
        return None
    if len(value) > MAX_RECORD_CHARS:
        return Forged("the record is oversized")
    body, _, mac = value.strip().rpartition(" ")
    if not seal.is_sealed(seal.LEASE_PURPOSE, body.encode(), mac, key):
        return Forged("its seal does not match")
    fields = body.split(" ")
    shapes = {OWNER: 4, CLOSING: 3, CLOSED: 2}
    if shapes.get(fields[0]) != len(fields) or not all(_NUMBER.fullmatch(f) for f in fields[2:]):
        return Forged("the record is malformed")
    if fields[0] == CLOSED:
        if not _NUMBER.fullmatch(fields[1]):
            return Forged("the record is malformed")
        return Record(CLOSED, "", int(fields[1]))
    if not _TOKEN.fullmatch(fields[1]):
        return Forged("the record is malformed")
    hold = int(fields[3]) if fields[0] == OWNER else 0
    return Record(fields[0], fields[1], int(fields[2]), hold)


class Standing(enum.Enum):
    """A holder's standing by what the lease says."""

    OWNS = "owns"  # its own sealed record
    TAKEN = "taken"  # a sealed record of a later epoch: another client resumed it
    FORGED = "forged"  # no record it can trust: it keeps owning, and says so
    ABSENT = "absent"  # no record at all


class Holder:
    """One client's part in one session's lease: its `token`, its `epoch`, the
    session's secret `key`, and `on_forged(reason)`, called for each forged value met."""

    def __init__(
        self, token: str, key: bytes, on_forged: Callable[[str], None], *, epoch: int = 0
    ) -> None:
        self.token = token
        self.key = key
        self.epoch = epoch
        self.hold_ms = HOLD_MS
        self.on_forged = on_forged
        # Whether this client wrote its own record (then an absent lease was removed).
        self.written = False

    def record(self, state: str = OWNER, hold_ms: int | None = None) -> Record:
        """This holder's record in `state`."""
        hold = self.hold_ms if hold_ms is None else hold_ms
        return Record(state, self.token, self.epoch, hold if state == OWNER else 0)

    def standing(self, found: Record | Forged | None) -> Standing:
        """What `found` (a parsed value) means for this holder; a forged one is reported."""
        if found is None:
            return Standing.ABSENT
        if isinstance(found, Forged):
            self.on_forged(found.reason)
            return Standing.FORGED
        if found.epoch > self.epoch:
            return Standing.TAKEN
        if found.token == self.token and found.epoch == self.epoch and found.state != CLOSED:
            return Standing.OWNS
        # Sealed, but of this epoch or an earlier one and not ours: a record the sandbox
        # kept and wrote back (epochs only grow, and each belongs to one client).
        self.on_forged("an earlier record was written back")
        return Standing.FORGED


async def check(store: LeaseStore, me: Holder) -> bool:
    """Whether `me` still owns the session (one read; one swap more the first time, when
    it writes its own record). False only when a later owner's sealed record is there."""
    current = await store.read()
    standing = me.standing(parse(current, me.key))
    if standing is Standing.ABSENT:
        if me.written:
            me.on_forged("the record was removed")
        found = await store.swap(None, me.record().sealed(me.key))
        if found is None:
            me.written = True
            return True
        standing = me.standing(parse(found, me.key))
    elif standing is Standing.OWNS:
        me.written = True
    return standing is not Standing.TAKEN


def next_epoch(previous: Record | None) -> int:
    """The epoch of a takeover: above the previous record's, and above the clock in
    milliseconds, so a takeover over a record the sandbox erased still outranks the
    owner it hid."""
    after = previous.epoch + 1 if previous is not None else 1
    return max(after, time.time_ns() // 1_000_000)


async def take_over(store: LeaseStore, me: Holder, what: str) -> float:
    """Make `me` the owner at the next epoch, whoever owned it (`what` names the sandbox
    in errors). Returns the seconds to wait before acting: the hold the previous owner
    announced (`HOLD_MS` when it cannot be known)."""
    current = await store.read()
    for _ in range(MAX_SWAPS):
        found = parse(current, me.key)
        if isinstance(found, Forged):
            me.on_forged(found.reason)
        previous = found if isinstance(found, Record) else None
        if previous is not None and previous.state != OWNER:
            raise SessionGoneError(f"{what} was closed by its owner")
        me.epoch = next_epoch(previous)
        hold = min(previous.hold_ms, MAX_HOLD_MS) if previous is not None else HOLD_MS
        got = await store.swap(current, me.record().sealed(me.key))
        if got == current:
            me.written = True
            return hold / 1000
        current = got
    raise SessionGoneError(f"{what}: its lease keeps changing; another client is taking it")


async def claim_close(store: LeaseStore, me: Holder) -> bool:
    """Before a close tears anything down: mark the lease `closing` for `me`. False only
    when a later owner's sealed record is there (then nothing may be torn down)."""
    current = await store.read()
    for _ in range(MAX_SWAPS):
        if me.standing(parse(current, me.key)) is Standing.TAKEN:
            return False
        got = await store.swap(current, me.record(CLOSING).sealed(me.key))
        if got == current:
            return True
        current = got
    # Never a later owner's record, only values changing under every swap: the sandbox
    # fights the close, and losing to it must not leave the sandbox running.
    return True


async def release(store: LeaseStore, me: Holder) -> None:
    """At a detach: rewrite `me`'s record with a hold of 0, so the resume that follows
    need not wait (nothing acts on this client's checks any more). A client that wrote
    no record yet (no call since its first `ref()`) writes its released one now: with
    none, the resume would have to wait out `HOLD_MS` for a client that is gone."""
    released = me.record(hold_ms=0).sealed(me.key)
    if me.written:
        await store.swap(me.record().sealed(me.key), released)
    elif await store.swap(None, released) is None:
        me.written = True


async def mark_closed(store: LeaseStore, me: Holder) -> None:
    """After the close: the session is gone (a later resume raises `SessionGoneError`)."""
    closed = replace(me.record(CLOSING), state=CLOSED, token="")
    await store.swap(me.record(CLOSING).sealed(me.key), closed.sealed(me.key))


async def release_close(store: LeaseStore, me: Holder) -> None:
    """After a close whose teardown failed: turn `me`'s `closing` record back into its
    ownership, so the retried close (a resume of the kept ref) finds an owner to take
    over rather than a session closing."""
    await store.swap(me.record(CLOSING).sealed(me.key), me.record().sealed(me.key))
