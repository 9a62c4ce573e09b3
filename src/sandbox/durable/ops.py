"""What `ref()`, `detach()`, a resume and a close of a shared session do to a session.

Base-session logic kept out of `sandbox.session`: these functions use the session's
collaborators exactly as its close does (every entry changes hands through the
`ProcessRegistry`'s `take*`/`adopt`, every teardown goes through `OwnedTasks`, which
releases instead of ending the entries it is told to let go of), and call the backend's
durability (`sandbox.session.capabilities.Durability`: `ref_sandbox`, `ref_options`,
`ref_process`, `lease_store`, `resume`, `reattach` and `detach`), looked up at each
call (a test parks one on the capability object).

The session is typed as `DurableSession`, the part of `BaseSandboxSession` used here
(the session package imports this module, so this one must not import it back).
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any, Protocol

from ..errors import CleanupError, SandboxError, SessionTakenOverError
from ..process_entry import CommandSpec, ProcessSpec, PtyEntry
from ..settle import settle
from . import lease, seal
from .refs import ProcessNotReattached, ProcessRef, SessionRef
from .state import DurableState

if TYPE_CHECKING:
    from ..session.capabilities import Capabilities
    from ..session.options import SessionOptions
    from ..session.ownership import OwnedTasks
    from ..session.recordings import Recordings
    from ..session.registry import ProcessRegistry

logger = logging.getLogger("sandbox")

DETACH_NOTE = "ended at detach: {backend} processes cannot outlive the client that started them"

__all__ = ["DurableSession", "ProcessNotReattached"]


class DurableCore(Protocol):
    """What these functions use of a session's `SessionCore`."""

    durable: DurableState
    processes: ProcessRegistry[Any]
    owned: OwnedTasks[Any]
    recordings: Recordings
    options: SessionOptions
    capabilities: Capabilities


class DurableSession(Protocol):
    """What these functions use of a `BaseSandboxSession`: its durable state, its
    collaborators and its durability."""

    @property
    def backend_name(self) -> str: ...

    @property
    def output_limit_bytes(self) -> int: ...

    @property
    def _core(self) -> DurableCore: ...

    @property
    def keeps_processes(self) -> bool: ...


def process_ref(
    session: DurableSession, entry: PtyEntry[Any], note: str | None = None
) -> ProcessRef:
    """The ref of one registered process (its provider handle while it runs)."""
    spec = entry.spec
    running = entry.running and note is None
    return ProcessRef(
        process_id=entry.process_id,
        command=spec.command.display,
        tty=spec.tty,
        rows=spec.rows,
        cols=spec.cols,
        stdin=spec.stdin and not entry.stdin_ended,
        started_at=entry.started_at,
        running=running,
        exit_code=entry.exit_code if entry.exited else None,
        note=note if note is not None else entry.lost_reason,
        output_position=entry.output.start_pos,
        handle=(
            session._core.capabilities.durability.ref_process(entry)
            if running and entry.handle is not None
            else {}
        ),
    )


def base_options(session: DurableSession) -> dict[str, Any]:
    """The base session's options a ref keeps: its bounds, none of them a secret."""
    options = session._core.options
    return {
        "max_processes": options.max_processes,
        "output_limit_bytes": options.output_limit_bytes,
        "teardown_concurrency": options.teardown_concurrency,
        "read_limit_bytes": options.read_limit_bytes,
        "exec_output_limit_bytes": options.exec_output_limit_bytes,
    }


def make_ref(session: DurableSession, processes: list[ProcessRef] | None = None) -> SessionRef:
    """The session's ref now (its registered processes, oldest first)."""
    durable = session._core.durable
    if processes is None:
        processes = [process_ref(session, entry) for entry in session._core.processes.registered()]
    return SessionRef(
        backend=session.backend_name,
        session_id=durable.session_id,
        sandbox=session._core.capabilities.durability.ref_sandbox(),
        options=session._core.capabilities.durability.ref_options(base_options(session)),
        processes=tuple(processes),
        keeps_processes=session.keeps_processes,
    )


def changed(session: DurableSession) -> None:
    """Keep the ref file current after a process started or left (failures are logged:
    a full disk must not fail a teardown)."""
    durable = session._core.durable
    if durable.ref_file is None or durable.taken_over or durable.detached is not None:
        return
    try:
        durable.ref_file.write(make_ref(session))
    except (SandboxError, OSError) as exc:
        logger.warning("%s session: the ref file was not updated: %s", session.backend_name, exc)


def _store(session: DurableSession) -> lease.LeaseStore | None:
    """The session's lease store (asked of the backend once, then kept)."""
    durable = session._core.durable
    if durable.store is None:
        durable.store = session._core.capabilities.durability.lease_store()
    return durable.store


def _holder(session: DurableSession) -> lease.Holder:
    """This client's part in the lease (made once the session id is final: the
    session's secret is derived from it)."""
    durable = session._core.durable
    if durable.holder is None:
        key = seal.session_secret(durable.session_id)
        durable.holder = lease.Holder(durable.token, key, lambda reason: _forged(session, reason))
    return durable.holder


def _forged(session: DurableSession, reason: str) -> None:
    """Report, once per session, a lease value that failed the check."""
    durable = session._core.durable
    if durable.forged_seen:
        return
    durable.forged_seen = True
    logger.warning(
        "%s: its lease holds a record this library did not write (%s); a process in the "
        "sandbox may have written it. It is not a takeover: this client keeps the sandbox",
        _what(session),
        reason,
    )


def close_store(session: DurableSession) -> None:
    """Release what the lease store holds (a folder fd), at the end of this client's hold."""
    store, session._core.durable.store = session._core.durable.store, None
    close = getattr(store, "close", None)
    if close is not None:
        close()


def _what(session: DurableSession) -> str:
    return f"the {session.backend_name} session {session._core.durable.session_id}"


def taken_over_error(session: DurableSession) -> SessionTakenOverError:
    """The error every call of a session another client resumed raises."""
    return SessionTakenOverError(
        f"{_what(session)} was resumed by another client, which owns it now; this client "
        "may only close (which leaves the sandbox and its processes to the new owner)"
    )


async def guard(session: DurableSession) -> None:
    """Before a call of a shared session: raise `SessionTakenOverError` if another
    client took it over. Reads the lease only when the last check is older than the
    hold (`lease.HOLD_MS`); while calls keep coming, a task of the session reads it
    again before then (`_renew`), so a session in use pays no read per call."""
    durable = session._core.durable
    if durable.taken_over:
        raise taken_over_error(session)
    if not durable.shared:
        return
    now = asyncio.get_running_loop().time()
    durable.last_use = now
    if now >= durable.valid_until:
        await _refresh(session)
        if durable.taken_over:
            raise taken_over_error(session)
    renewer = durable.renewer
    if (renewer is None or renewer.done()) and not durable.renewing_stopped:
        if durable.holder is not None:  # None: the backend keeps no lease
            durable.renewer = asyncio.ensure_future(_renew(session))


async def _refresh(session: DurableSession) -> None:
    """One check of the lease: extend the deadline from when it began, or flip
    `taken_over`."""
    durable = session._core.durable
    store = _store(session)
    if store is None:
        durable.valid_until = float("inf")
        return
    holder = _holder(session)
    started = asyncio.get_running_loop().time()
    if not await lease.check(store, holder):
        durable.taken_over = True
        return
    # From when the read began: a takeover that landed after it waits out the hold
    # from its own swap, which came later.
    durable.last_read = max(durable.last_read, started)
    durable.valid_until = max(durable.valid_until, started + holder.hold_ms / 1000)


async def _renew(session: DurableSession) -> None:
    """The session's renewer: reads the lease before the deadline runs out while calls
    keep coming; ends when no call came since its last read (an idle session asks the
    sandbox nothing), at a takeover, or when a read fails (the next call reads itself)."""
    durable = session._core.durable
    loop = asyncio.get_running_loop()
    while not durable.taken_over:
        hold_s = _holder(session).hold_ms / 1000
        delay = durable.last_read + hold_s * lease.RENEW_AFTER - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        if durable.taken_over or durable.last_use <= durable.last_read:
            return
        try:
            await _refresh(session)
        except (SandboxError, OSError) as exc:
            logger.debug("%s: renewing the lease check failed: %s", _what(session), exc)
            return


async def stop_renewing(session: DurableSession) -> None:
    """At a close or detach: end the renewer (cancelled and awaited) for good."""
    durable = session._core.durable
    durable.renewing_stopped = True
    renewer, durable.renewer = durable.renewer, None
    if renewer is not None and not renewer.done():
        renewer.cancel()
        await asyncio.wait({renewer})


# ---- resume ----------------------------------------------------------------------------


def _entry_for(session: DurableSession, pref: ProcessRef) -> PtyEntry[Any]:
    command = CommandSpec(
        argv=(), shell_command=pref.command, display=pref.command, shell=True, env=None
    )
    # A pipe process's open stdin goes on being ours to write and close (a ref says so
    # only for a backend that kept it open: refs are sealed).
    spec = ProcessSpec(
        command=command,
        tty=pref.tty,
        rows=pref.rows,
        cols=pref.cols,
        stdin=pref.stdin and not pref.tty,
    )
    entry: PtyEntry[Any] = PtyEntry(
        pref.process_id, spec, output_limit=session.output_limit_bytes, started_at=pref.started_at
    )
    # Positions go on from where the earlier client was, so a later ref's
    # `output_position` still counts from the process's first byte (a backend that
    # replays the provider's log skips up to it).
    entry.output._start = pref.output_position
    return entry


async def resume(session: DurableSession) -> None:
    """`start()` of a resumed session: attach, take the lease over, reattach processes.
    If this fails or is cancelled, `abandon_resume` releases what it attached (the
    sandbox stays: its owner is still the ref)."""
    durable = session._core.durable
    ref = durable.resume_ref
    assert ref is not None
    await session._core.capabilities.durability.resume(ref)
    store = _store(session)
    if store is not None:
        holder = _holder(session)
        wait_s = await lease.take_over(store, holder, _what(session))
        swapped = asyncio.get_running_loop().time()
        # Fencing: an earlier owner may act on a check it made before the swap for up
        # to the hold its record announced; nothing here acts before that ran out.
        if wait_s > 0:
            await asyncio.sleep(wait_s)
        durable.last_read = swapped
        durable.valid_until = swapped + holder.hold_ms / 1000
    for pref in ref.processes:
        entry = _entry_for(session, pref)
        session._core.processes.adopt(entry)  # ours from now: a failure releases it
        if not pref.running:
            entry.report_exit(pref.exit_code if pref.exit_code is not None else -1)
            entry.report_eof()
            if pref.exit_code is None and pref.note:
                entry.feed(f"\n[sandbox: {pref.note}]\n".encode())
            continue
        try:
            await session._core.capabilities.durability.reattach(entry, pref)
        except ProcessNotReattached as gone:
            if gone.exit_code is not None:
                entry.feed(f"\n[sandbox: {gone.note}]\n".encode())
                entry.report_exit(gone.exit_code)
                entry.report_eof()
            else:
                entry.report_lost(gone.note)


async def abandon_resume(session: DurableSession) -> None:
    """Undo a resume that failed or was cancelled: let go of the reattached processes
    (they stay the ref's) and of the backend's clients; the sandbox is left running."""
    entries = session._core.processes.take_all()
    try:
        await session._core.owned.settle_batch(entries, let_go={e.process_id for e in entries})
    finally:
        close_store(session)
        await settle(session._core.capabilities.durability.detach())


# ---- detach and close ------------------------------------------------------------------


async def detach_everything(session: DurableSession) -> SessionRef:
    """The work of `detach()` (run as the session's closing task, settled)."""
    await stop_renewing(session)
    await session._core.owned.cancel_in_flight()
    starting = session._core.processes.take_all_starting()
    registered = sorted(session._core.processes.take_all(), key=lambda e: e.started_at)
    keep = [e for e in registered if session.keeps_processes and e.running and e.handle]
    kept_ids = {e.process_id for e in keep}
    ended = [e for e in registered if e.process_id not in kept_ids]
    # What the ref says of a kept process is read before its reader lets go of it.
    kept_refs = {e.process_id: process_ref(session, e) for e in keep}
    cut_short = {e.process_id for e in ended if e.running}
    errors = await session._core.owned.settle_all(keep + ended + starting, let_go=kept_ids)
    note = DETACH_NOTE.format(backend=session.backend_name)
    processes = [
        kept_refs[e.process_id]
        if e.process_id in kept_ids
        else process_ref(session, e, note if e.process_id in cut_short else None)
        for e in registered
    ]
    ref = make_ref(session, processes)
    session._core.durable.detached = ref
    try:
        await _release_lease(session)
    except Exception as exc:
        errors.append(exc)
    try:
        await session._core.capabilities.durability.detach()
    except Exception as exc:
        errors.append(exc)
    finish_ref_file(session, ref)
    session._core.recordings.close()
    if errors:
        logger.warning(
            "%s session: detaching left errors: %s",
            session.backend_name,
            "; ".join(str(e) for e in errors),
        )
    return ref


def finish_ref_file(session: DurableSession, ref: SessionRef | None, *, keep: bool = False) -> None:
    """At the end of this client's hold: write the final ref (a detach) or remove the
    file (a close that deleted the sandbox); a taken-over session leaves it alone, and
    so does `keep` (a close whose teardown failed: the sandbox may still be there, and
    the file is what a retried close finds it from)."""
    durable = session._core.durable
    close_store(session)
    ref_file, durable.ref_file = durable.ref_file, None
    if ref_file is None:
        return
    try:
        if durable.taken_over or keep:
            return
        if ref is not None:
            ref_file.write(ref)
        else:
            ref_file.remove()
    except (SandboxError, OSError) as exc:
        logger.warning("%s session: the ref file was not updated: %s", session.backend_name, exc)
    finally:
        ref_file.close()


async def release_close(session: DurableSession) -> None:
    """A close whose teardown failed keeps the ref file: the lease it claimed goes back
    to this client, or the retried close (a resume of that file) would find the session
    closing and call it gone. Failures are logged (the close already failed)."""
    durable = session._core.durable
    if not durable.shared or durable.taken_over:
        return
    try:
        store = _store(session)
        if store is not None:
            await lease.release_close(store, _holder(session))
    except (SandboxError, OSError) as exc:
        logger.warning("%s session: the lease was not released: %s", session.backend_name, exc)


async def _release_lease(session: DurableSession) -> None:
    """At a detach: tell the next resume it need not wait for this client's checks
    (shared or not: with no record at all, the resume would wait out `HOLD_MS`)."""
    durable = session._core.durable
    if not durable.taken_over:
        store = _store(session)
        if store is not None:
            await lease.release(store, _holder(session))


async def claim_close(session: DurableSession) -> bool:
    """At the start of a close: whether this client still owns the sandbox (and may
    tear it down). False when another client resumed it: the close then only lets go.
    A lease value that fails the check is no takeover (see `sandbox.durable.lease`)."""
    durable = session._core.durable
    if durable.taken_over:
        return False
    if not durable.shared:
        return True
    store = _store(session)
    if store is None:
        return True
    if not await lease.claim_close(store, _holder(session)):
        durable.taken_over = True
        return False
    return True


async def let_go(
    session: DurableSession, entries: list[PtyEntry[Any]], *, keep_ref_file: bool = False
) -> list[BaseException]:
    """The close of a taken-over session: release every entry (no kill: the new owner
    decides), then the backend's clients. Returns the errors met. `keep_ref_file`: leave
    the ref file holding the last ref (the sandbox stays, and is found again from it)."""
    errors = await session._core.owned.settle_all(entries, let_go={e.process_id for e in entries})
    try:
        await session._core.capabilities.durability.detach()
    except Exception as exc:
        errors.append(exc)
    if keep_ref_file:
        close_store(session)
        ref_file, session._core.durable.ref_file = session._core.durable.ref_file, None
        if ref_file is not None:
            ref_file.close()
    else:
        finish_ref_file(session, None)
    return errors


async def close_or_let_go(session: DurableSession, entries: list[PtyEntry[Any]]) -> bool:
    """In a close, with `entries` taken: whether it may tear the sandbox down. If
    another client took it over, let go of `entries` and the backend's clients instead
    (the failures are logged) and answer False."""
    await stop_renewing(session)
    try:
        owner = await claim_close(session)
    except Exception as exc:
        # Who owns the sandbox cannot be told (the lease read failed): tearing it down
        # could destroy what a new owner holds, so this client only lets go, and says so;
        # the ref file keeps the last ref, to resume or close the sandbox from.
        errors = await let_go(session, entries, keep_ref_file=True)
        session._core.recordings.close()
        raise CleanupError(
            f"closing the {session.backend_name} session: could not check whether another "
            f"client took the sandbox over ({exc}); the sandbox was left running and this "
            "client let go of it",
            [exc, *errors],
        ) from None
    if owner:
        return True
    errors = await let_go(session, entries)
    session._core.recordings.close()
    for error in errors:
        logger.warning("%s session: letting go failed: %s", session.backend_name, error)
    return False
