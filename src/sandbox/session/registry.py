"""`ProcessRegistry`: which processes a session has, and who owns each one right now.

The ownership rule lives here, once: an entry belongs to whoever holds it in the
registry (the session), in `starting` (the `pty_exec_start` call spawning it), or to
the teardown that took it; it changes hands by being popped, in one synchronous step
on the event loop thread (`_hand_over`), so no await can ever see it owned twice or
not at all. An entry taken for teardown keeps its id reserved until `release`.

Slots: at most `max_processes` entries are registered or starting; a reservation
beyond that prunes the least recently used one (an exited one first), never one of
the `PROTECTED_RECENT` most recently used, and remembers why, so a later call with
that id gets a clear error.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Callable
from typing import Generic

from ..errors import InvalidArgumentError, PtyProcessNotFoundError, SandboxError
from ..process_entry import H, ProcessSpec, PtyEntry
from ..types import PtyProcessInfo

logger = logging.getLogger("sandbox")

MAX_PROCESSES = 64
WARN_PROCESSES = 60
PROTECTED_RECENT = 8
ID_RANGE = (1000, 100_000)
# Ids tried for a free `<id>.cast` name in `record_dir` before one is taken anyway (its
# recording is then refused): a folder full of old recordings must not hang a start.
RECORD_NAME_TRIES = 256
PRUNED_MEMORY = 256  # how many pruned ids an error can still explain


class ProcessRegistry(Generic[H]):
    """The entries of one session: registered, starting, or retiring (being torn down).

    `reserve` is the only await (it holds the reservation lock); everything else is
    one synchronous step. Every `take*` hands entries over to the caller for teardown
    (marked `removed`, their ids still reserved until `release`).
    """

    def __init__(
        self,
        backend_name: str,
        *,
        max_processes: int = MAX_PROCESSES,
        output_limit_bytes: int,
    ) -> None:
        self.backend_name = backend_name
        self.max_processes = max_processes
        # Warn a few processes before the pruning starts (60 of the default 64).
        self.warn_processes = max(1, max_processes - (MAX_PROCESSES - WARN_PROCESSES))
        self.output_limit_bytes = output_limit_bytes
        self._live: dict[int, PtyEntry[H]] = {}
        self._starting: dict[int, PtyEntry[H]] = {}
        self._retiring: set[int] = set()
        self._pruned: dict[int, str] = {}  # recent prune victims' ids, oldest first
        self._lock = asyncio.Lock()

    def __len__(self) -> int:
        """How many processes are registered (not counting starting ones)."""
        return len(self._live)

    @property
    def reserved(self) -> set[int]:
        """Every id in use: registered, starting, or being torn down."""
        return {*self._live, *self._starting, *self._retiring}

    # ---- reservation and admission -------------------------------------------------

    async def reserve(
        self,
        spec: ProcessSpec,
        *,
        check_open: Callable[[], None],
        name_taken: Callable[[int], bool] | None = None,
    ) -> tuple[PtyEntry[H], PtyEntry[H] | None]:
        """Take a slot for a new process: a new entry in `starting`, owned by the
        caller, and the prune victim (already taken: the caller's to tear down) when
        the registry was full.

        `check_open` raises if the session can no longer start processes (checked under
        the lock). `name_taken(id)`: ids for which it is true are avoided, up to
        `RECORD_NAME_TRIES` tries (a recording's name already used in `record_dir`).
        """
        async with self._lock:
            check_open()
            victim = None
            if len(self._live) + len(self._starting) >= self.max_processes:
                victim = self._prune()
            process_id = self._free_id(name_taken)
            entry: PtyEntry[H] = PtyEntry(process_id, spec, output_limit=self.output_limit_bytes)
            self._starting[process_id] = entry
            return entry, victim

    def is_starting(self, entry: PtyEntry[H]) -> bool:
        """Whether `entry` is still in `starting` (its spawning call still owns it)."""
        return self._starting.get(entry.process_id) is entry

    def admit(self, entry: PtyEntry[H]) -> bool:
        """Move a started entry from `starting` into the registry (the session owns it
        now). False when it was no longer starting: the close took it over."""
        if self._starting.pop(entry.process_id, None) is not entry:
            return False
        self._live[entry.process_id] = entry
        live = len(self._live) + len(self._starting)
        if live == self.warn_processes:  # once, when the registry crosses the mark
            logger.warning(
                "%s session has %d of %d processes: the least recently used will be pruned",
                self.backend_name,
                live,
                self.max_processes,
            )
        return True

    # ---- hand-over to a teardown ---------------------------------------------------

    def take_starting(self, entry: PtyEntry[H]) -> bool:
        """Take a starting entry for teardown (a failed or cancelled start). False when
        it was no longer starting (the close took it, and tears it down)."""
        return self._hand_over(self._starting, entry.process_id, entry) is not None

    def take(self, process_id: int) -> PtyEntry[H]:
        """Take a registered process for teardown; `PtyProcessNotFoundError` if none."""
        entry = self._hand_over(self._live, process_id)
        if entry is None:
            raise self.not_found(process_id)
        return entry

    def take_entry(self, entry: PtyEntry[H]) -> bool:
        """Take `entry` for teardown if it is still registered (a finished window)."""
        return self._hand_over(self._live, entry.process_id, entry) is not None

    def take_all(self) -> list[PtyEntry[H]]:
        """Take every registered process for teardown (starting ones stay)."""
        return [self._hand_over_known(self._live, pid) for pid in list(self._live)]

    def take_everything(self) -> list[PtyEntry[H]]:
        """Take every starting and registered entry (the close's batch)."""
        return self.take_all_starting() + self.take_all()

    def take_all_starting(self) -> list[PtyEntry[H]]:
        """Take every starting entry for teardown (a detach, after the spawns were
        cancelled)."""
        return [self._hand_over_known(self._starting, pid) for pid in list(self._starting)]

    def adopt(self, entry: PtyEntry[H]) -> None:
        """Register a process this session did not spawn: one a resumed ref lists
        (`sandbox.durable`). The session owns it from now on, as if admitted."""
        if entry.process_id in self.reserved:
            raise InvalidArgumentError(f"process id {entry.process_id} is already in use")
        self._live[entry.process_id] = entry

    def release(self, entry: PtyEntry[H]) -> None:
        """The teardown of a taken entry finished: its id may be reused."""
        self._retiring.discard(entry.process_id)

    def _hand_over(
        self, table: dict[int, PtyEntry[H]], process_id: int, expected: PtyEntry[H] | None = None
    ) -> PtyEntry[H] | None:
        # THE ownership step: popped, marked removed, id kept reserved, with no await.
        entry = table.get(process_id)
        if entry is None or (expected is not None and entry is not expected):
            return None
        return self._hand_over_known(table, process_id)

    def _hand_over_known(self, table: dict[int, PtyEntry[H]], process_id: int) -> PtyEntry[H]:
        entry = table.pop(process_id)
        entry.removed = True
        self._retiring.add(process_id)
        return entry

    # ---- looking processes up ------------------------------------------------------

    def lookup(self, process_id: int) -> PtyEntry[H]:
        """The registered process `process_id`: `InvalidArgumentError` for a non-int,
        `PtyProcessNotFoundError` (saying why, when it was pruned) if there is none."""
        if isinstance(process_id, bool) or not isinstance(process_id, int):
            raise InvalidArgumentError(f"process_id must be an int, not {process_id!r}")
        entry = self._live.get(process_id)
        if entry is None:
            raise self.not_found(process_id)
        return entry

    def registered(self) -> list[PtyEntry[H]]:
        """The registered processes (not taken), oldest first."""
        return sorted(self._live.values(), key=lambda e: e.started_at)

    def entries(self) -> list[PtyEntry[H]]:
        """Every entry still held by the session or a spawning call (not taken)."""
        return [*self._starting.values(), *self._live.values()]

    def spawn_tasks(self) -> list[asyncio.Future[None]]:
        """The spawn tasks of the starting entries (the close cancels them)."""
        return [e.spawn_task for e in self._starting.values() if e.spawn_task is not None]

    def infos(self) -> list[PtyProcessInfo]:
        """The registered processes, oldest first."""
        return [
            PtyProcessInfo(
                process_id=entry.process_id,
                command=entry.spec.command.display,
                tty=entry.tty,
                running=entry.running,
                exit_code=entry.exit_code,
                started_at=entry.started_at,
                last_used=entry.last_used,
                has_screen=entry.screen is not None,
            )
            for entry in sorted(self._live.values(), key=lambda e: e.started_at)
        ]

    def not_found(self, process_id: object) -> PtyProcessNotFoundError:
        """The error for an id that names no registered process."""
        pruned = self._pruned.get(process_id) if isinstance(process_id, int) else None
        if pruned is not None:
            return PtyProcessNotFoundError(f"process {process_id} {pruned}")
        return PtyProcessNotFoundError(
            f"no process with id {process_id!r} (it exited and was collected, was "
            "terminated, or never existed); pty_processes() lists the live ones"
        )

    def gone(self, entry: PtyEntry[H]) -> PtyProcessNotFoundError:
        """The error for a call that finds its process removed while it waited."""
        pruned = self._pruned.get(entry.process_id)
        if pruned is not None:
            return PtyProcessNotFoundError(f"process {entry.process_id} {pruned}")
        return PtyProcessNotFoundError(f"process {entry.process_id} was terminated")

    # ---- the prune rule and ids ----------------------------------------------------

    def prune_victim(self) -> PtyEntry[H] | None:
        """Who goes when the registry is full: the least recently used exited process,
        else the least recently used one, never one of the `PROTECTED_RECENT` most
        recently used (None when every registered one is protected)."""
        by_recency = sorted(self._live.values(), key=lambda e: e.last_used_mono)
        candidates = by_recency[: max(0, len(by_recency) - PROTECTED_RECENT)]
        for entry in candidates:
            if entry.exited:
                return entry
        return candidates[0] if candidates else None

    def _prune(self) -> PtyEntry[H]:
        victim = self.prune_victim()
        if victim is None:
            raise SandboxError(
                f"{self.max_processes} processes are already starting; wait for some to finish",
                retryable=True,
            )
        self._hand_over_known(self._live, victim.process_id)
        reason = (
            f"was pruned: the session was full ({self.max_processes} processes) and "
            f"it was the least recently used {'exited' if victim.exited else 'running'} one"
        )
        self._pruned[victim.process_id] = reason
        while len(self._pruned) > PRUNED_MEMORY:
            del self._pruned[next(iter(self._pruned))]
        victim.feed(f"\n[sandbox: process {victim.process_id} {reason}]\n".encode())
        logger.info("%s session: process %d %s", self.backend_name, victim.process_id, reason)
        return victim

    def _free_id(self, name_taken: Callable[[int], bool] | None) -> int:
        low, high = ID_RANGE
        in_use = self.reserved
        tries = 0
        while True:
            process_id = low + secrets.randbelow(high - low)
            if process_id in in_use:
                continue
            if name_taken is None or tries >= RECORD_NAME_TRIES:
                return process_id
            tries += 1
            if not name_taken(process_id):
                return process_id
