"""What a backend author needs, in one place (the user API is `sandbox` itself).

A backend is a `BaseSandboxSession` subclass that implements the hooks of
`SessionHooks` (`sandbox.session.hooks`, each docstring its contract; see AGENTS.md,
"Adding a backend"). In-tree backends import
the core only through this module, `sandbox`, `sandbox.errors`, `sandbox.types` and
`sandbox.backends.toolkit` (tests/meta/test_layering.py checks it).

- The session: `BaseSandboxSession`, `SessionState`. Its reader feeds a `PtyEntry`
  (built from a `ProcessSpec`; a command is a `CommandSpec`); after an exit it waits
  `EXIT_DRAIN_GRACE_S` for the last output. Its one-shot commands append to an
  `ExecCapture`; `_start_exec` returns a `OneShotProcess` (any object with `wait`,
  `kill` and `release`).
- Cleanup: every teardown a backend writes is awaited by the base session through
  `settle` / `settle_each` (never by the backend itself); side-by-side tasks follow
  `first_failure` and end with `cancel_and_wait`.
- Options: `check_seconds`, `check_str` and `check_env`, the same checks and messages
  as the base session's own options.
- A local child: `LocalProcess` drives one without threads (the unix_local backend and
  the stand-ins in `sandbox.testing` use it).
- Shells, credentials: `ShellTrap` carries a command's exit status in-band through a
  provider's shell and `CommandCheck` checks its `cwd` and program first
  (`wait_for_verdict` ends a `_spawn_process` that runs behind one); `Secret` holds a
  credential so that it never reaches a message, log or repr (`require_credential`).
- Remote files: `regular_file` asks a provider's stat (answering `RemoteEntry`, whose
  `kind` is a `RemoteKind`) whether a path is a regular file before a file call;
  `go_file_mode_kind` reads a Go `FileMode`; `under_a_file` and
  `explain_write_failure` give the contract's errors; `read_at_most` is the one bounded
  download read.
- Host files: `DIRECTORY_FLAGS` and `file_kind`, how the host opens and names what it
  walks (the unix_local backend's race-free file access builds on them).

- Durable sessions (docs/durable-sessions.md): the durable hooks return and read a
  `SessionRef` (with a `ProcessRef` per process); `_reattach_process` raises
  `ProcessNotReattached` for a process the provider lost; `HostLease` is the lease kept
  in a host folder for a backend whose sandbox is on this host (unix_local).

docs/architecture.md walks through a whole backend written with these names only.
"""

from .arguments import check_env, check_seconds, check_str
from .backends.toolkit.check import CommandCheck
from .backends.toolkit.credentials import Secret, require_credential
from .backends.toolkit.trap import ShellTrap, wait_for_verdict
from .durable.host_lease import HostLease
from .durable.refs import ProcessNotReattached, ProcessRef, SessionRef
from .exec_output import ExecCapture, OneShotProcess
from .files.host import DIRECTORY_FLAGS, file_kind
from .files.remote import Entry as RemoteEntry
from .files.remote import Kind as RemoteKind
from .files.remote import (
    explain_write_failure,
    go_file_mode_kind,
    read_at_most,
    regular_file,
    under_a_file,
)
from .local.process import LocalProcess
from .process_entry import EXIT_DRAIN_GRACE_S, CommandSpec, ProcessSpec, PtyEntry
from .session import BaseSandboxSession, SessionHooks, SessionState
from .settle import settle, settle_each
from .tasks import cancel_and_wait, first_failure

__all__ = [
    "DIRECTORY_FLAGS",
    "EXIT_DRAIN_GRACE_S",
    "BaseSandboxSession",
    "CommandCheck",
    "CommandSpec",
    "ExecCapture",
    "HostLease",
    "LocalProcess",
    "OneShotProcess",
    "ProcessNotReattached",
    "ProcessRef",
    "ProcessSpec",
    "PtyEntry",
    "RemoteEntry",
    "RemoteKind",
    "Secret",
    "SessionHooks",
    "SessionRef",
    "SessionState",
    "ShellTrap",
    "cancel_and_wait",
    "check_env",
    "check_seconds",
    "check_str",
    "explain_write_failure",
    "file_kind",
    "first_failure",
    "go_file_mode_kind",
    "read_at_most",
    "regular_file",
    "require_credential",
    "settle",
    "settle_each",
    "under_a_file",
    "wait_for_verdict",
]
