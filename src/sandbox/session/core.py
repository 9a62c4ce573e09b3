"""`SessionCore`: everything the base session owns, in one object.

A `BaseSandboxSession` holds exactly one thing of its own: its core (`session._core`, a
read-only property over a name-mangled slot), so a backend subclass's namespace holds
only its hooks and its own state and can never clash with the base's machinery (the
base refuses, at class creation, a subclass that redefines one of its names). Each
field below is one collaborator that owns one part of the session's state; the
invariant it keeps is written beside it. They share nothing but the `Lifecycle`, which
they ask "may this call run?" (`Admission`) and "did a close begin?".
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Generic

from ..durable.state import DurableState
from ..errors import UnsupportedOperationError
from ..process_entry import H
from .capabilities import Capabilities
from .file_calls import FileCalls
from .options import SessionOptions
from .ownership import OwnedTasks
from .pty_calls import PtyCalls
from .recordings import Recordings
from .registry import ProcessRegistry
from .workspace_calls import WorkspaceCalls

if TYPE_CHECKING:
    from .hooks import SessionHooks
    from .lifecycle import Lifecycle


class SessionCore(Generic[H]):
    """The registry, the owned tasks, the lifecycle and the calls of one session.

    Built once by `BaseSandboxSession.__init__` (after its options were checked: a bad
    option fails when it is given, before anything is made) and never replaced; its
    `lifecycle` is made by the session (it is typed by what it uses of the session).
    """

    def __init__(
        self,
        session: SessionHooks[H],
        lifecycle: Lifecycle,
        options: SessionOptions,
        *,
        record_dir: str | os.PathLike[str] | None,
        ref_file: str | os.PathLike[str] | None,
    ) -> None:
        # Checked and frozen: read by the calls, never changed after the constructor.
        self.options = options
        # The one state machine: NEW -> STARTING -> RUNNING -> CLOSING -> CLOSED. Every
        # public call is admitted by it first (`admit`); only its start and close tasks
        # move the state.
        self.lifecycle = lifecycle
        # Every process id and who owns each entry: an entry is in exactly one of
        # starting / registered / taken (by one caller, who tears it down), and only the
        # registry's methods move it (`registry.py` states the rule).
        self.processes: ProcessRegistry[H] = ProcessRegistry(
            session.backend_name,
            max_processes=options.max_processes,
            output_limit_bytes=options.output_limit_bytes,
        )
        # Every task the session runs on a caller's behalf (start, spawns, one-shots) and
        # every teardown batch: the close cancels the first and awaits the second, so
        # nothing the session made outlives it.
        self.owned: OwnedTasks[H] = OwnedTasks(
            self.processes,
            # Looked up at each teardown: a test's `HookGate` may park either later.
            lambda entry: session._terminate_pty_entry(entry),
            admission=self.lifecycle,
            concurrency=options.teardown_concurrency,
            release=lambda entry: self.capabilities.durability.release(entry),
            changed=self.lifecycle.changed,
        )
        # `record_dir` and its fd: opened by the start (before the sandbox runs
        # anything), closed by a failed start or the close, never both open twice.
        self.recordings = Recordings(record_dir)
        if ref_file is not None and type(session)._durability is None:
            raise UnsupportedOperationError(
                f"ref_file: the {session.backend_name} backend cannot detach or resume sessions"
            )
        # Refs, the lease and the ref file (`sandbox.durable`): the session id is fixed
        # once the session is made or resumed; the lease is held while `shared`.
        self.durable = DurableState(ref_file)
        # One object per capability, built once (the refusing one where the backend has
        # none): a call reaches the backend's files, workspace, ports, snapshots and
        # durability only through these.
        self.capabilities = Capabilities.of(session)
        # The calls: argument checks, admission, then one capability or hook each.
        self.files = FileCalls(
            self.capabilities.files, read_limit=options.read_limit_bytes, admission=self.lifecycle
        )
        self.workspace = WorkspaceCalls(
            self.capabilities, read_limit=options.read_limit_bytes, admission=self.lifecycle
        )
        self.pty: PtyCalls[H] = PtyCalls(
            session, self.processes, self.owned, self.recordings, admission=self.lifecycle
        )
