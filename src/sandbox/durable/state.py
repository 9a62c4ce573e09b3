"""`DurableState`: what one session knows about its refs, lease and ref file.

The base session holds one (`_durable`); the functions in `sandbox.durable.ops` read and
change it. Kept apart from the session's registry: a session that never hands out a
ref pays nothing here (no lease is read, no file written).
"""

from __future__ import annotations

import asyncio
import os
import secrets

from .lease import Holder, LeaseStore, new_token
from .ref_file import RefFile
from .refs import SessionRef


class DurableState:
    """Per-session durable bookkeeping.

    `session_id` names the session across its clients (new, or the ref's at resume);
    `token` this client's lease token; `shared` becomes True once a ref exists outside
    this client (`ref()`, a ref file, a resume), from when on the lease is checked;
    `resume_ref` is the ref a `resume_session` attaches to; `taken_over` is set when another
    client's resume was seen; `detached` holds the ref `detach()` made.

    The lease check's cache (`sandbox.durable.ops.guard`): `holder` is this client's part
    in the lease (made with the store); a call before `valid_until` (event-loop time)
    reads nothing; `last_read` is when the read that set it began, `last_use` when the
    last call checked; `renewer` the task that reads again while calls keep coming;
    `forged_seen` whether a forged lease value was reported (once per session).
    """

    def __init__(self, ref_file: str | os.PathLike[str] | None) -> None:
        self.session_id = secrets.token_hex(8)
        self.token = new_token()
        self.ref_file = None if ref_file is None else RefFile(ref_file)
        self.shared = self.ref_file is not None
        self.resume_ref: SessionRef | None = None
        self.taken_over = False
        self.detached: SessionRef | None = None
        self.store: LeaseStore | None = None  # the backend's, asked for once
        self.holder: Holder | None = None
        self.valid_until = 0.0
        self.last_read = 0.0
        self.last_use = 0.0
        self.renewer: asyncio.Task[None] | None = None
        # Set when the close or detach begins: no renewer starts after it.
        self.renewing_stopped = False
        self.forged_seen = False

    def begin_resume(self, ref: SessionRef) -> None:
        """Make this (unstarted) session attach to `ref`'s sandbox when started."""
        self.resume_ref = ref
        self.session_id = ref.session_id
        self.shared = True

    @property
    def resuming(self) -> bool:
        """Whether `start()` attaches to an existing sandbox rather than making one."""
        return self.resume_ref is not None
