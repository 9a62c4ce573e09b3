"""What a backend author needs, in one place (the user API is `sandbox` itself).

A backend is a `BaseSandboxSession` subclass that implements the hooks of
`SessionHooks` (`sandbox.session.hooks`, each docstring its contract; see AGENTS.md,
"Adding a backend"). In-tree backends import
the core only through this module, `sandbox`, `sandbox.errors`, `sandbox.types` and
`sandbox.backends.toolkit` (tests/meta/test_layering.py checks it).

- The session: `BaseSandboxSession`, `SessionState`. Its hooks get a process as an
  `OutputSink` (what to start, a `ProcessSpec`, whose command is a `CommandSpec`; where
  the backend keeps its handle; what its reader may report), never the session's own
  record (`PtyEntry`, exported for test doubles that build one); after an exit the
  session waits `EXIT_DRAIN_GRACE_S` for the last output. A spawn stores its handle
  there: a `Process` (`sandbox.process_handle`) takes the writes, resizes, interrupts,
  end of input and last drains itself, so the backend writes no hook for them, and its
  `_terminate_pty_entry` is `kill_handle(entry)`. Its one-shot commands append to an
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
- Workspaces (docs/workspaces.md): a `stat`/`list_dir` answers `FileInfo` (its `kind` a
  `FileKind`; `kind_of_mode` reads a stat mode, `child_path` names an entry);
  `ShellFileOps` does the file operations through a POSIX sh in the sandbox, and
  `ShellWorkspace` is the `WorkspaceAccess` made of them (its session defines
  `_shell_ops`); `Ports.expose` answers an `ExposedPort` (`http_url`,
  `exposed_from_url`) and `Snapshots.take` a `SnapshotRef`. A backend with its own
  archive API streams through the pax pieces: `walk_tar` (a tree into a tar),
  `exact_chunks`, `dir_header`, `file_header`, `symlink_header`, `tar_padding`,
  `TAR_END`; reads one with `TarStream` and extracts under the safe extractor's rules
  with `extract_archive` (or `extract_archive_batched` for a sink that queues its
  operations). A tree a sandbox made on this host is removed with `remove_tree` /
  `remove_tree_at` (iterative, following no symlink, however deep).

- Capabilities (`sandbox.session.capabilities`): a backend names one type per
  attribute, each made with the session (`Capability`): `_file_access` (`FileAccess`),
  `_workspace_access` (`WorkspaceAccess`), `_ports` (`Ports`), `_snapshots`
  (`Snapshots`), `_durability` (`Durability`); None where the provider has none.
- Durable sessions (docs/durable-sessions.md): a `Durability` returns and reads a
  `SessionRef` (with a `ProcessRef` per process); its `reattach` raises
  `ProcessNotReattached` for a process the provider lost; `HostLease` is the lease kept
  in a host folder for a backend whose sandbox is on this host (unix_local);
  `durable_session_id` is the id a backend names its lease and marks with.

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
from .files.remove_tree import remove_tree, remove_tree_at
from .local.process import LocalProcess
from .process_entry import EXIT_DRAIN_GRACE_S, CommandSpec, OutputSink, ProcessSpec, PtyEntry
from .process_handle import Process, kill_handle
from .session import BaseSandboxSession, SessionHooks, SessionState, durable_session_id
from .session.capabilities import (
    Capability,
    Durability,
    FileAccess,
    Ports,
    Snapshots,
    WorkspaceAccess,
)
from .settle import settle, settle_each
from .tasks import cancel_and_wait, first_failure
from .workspace.extract import extract as extract_archive
from .workspace.extract import extract_batched as extract_archive_batched
from .workspace.info import FileInfo, FileKind, child_path, kind_of_mode
from .workspace.persist import exact as exact_chunks
from .workspace.persist import walk_tar
from .workspace.ports import ExposedPort, exposed_from_url, http_url
from .workspace.shell_ops import ShellFileOps, ShellWorkspace
from .workspace.snapshots import SnapshotRef
from .workspace.tar_reader import TarStream
from .workspace.tar_reader import parse_header as parse_tar_header
from .workspace.tar_writer import END as TAR_END
from .workspace.tar_writer import dir_header, file_header, symlink_header
from .workspace.tar_writer import padding as tar_padding

__all__ = [
    "DIRECTORY_FLAGS",
    "EXIT_DRAIN_GRACE_S",
    "TAR_END",
    "BaseSandboxSession",
    "Capability",
    "CommandCheck",
    "CommandSpec",
    "Durability",
    "ExecCapture",
    "ExposedPort",
    "FileAccess",
    "FileInfo",
    "FileKind",
    "HostLease",
    "LocalProcess",
    "OneShotProcess",
    "OutputSink",
    "Ports",
    "Process",
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
    "ShellFileOps",
    "ShellTrap",
    "ShellWorkspace",
    "SnapshotRef",
    "Snapshots",
    "TarStream",
    "WorkspaceAccess",
    "cancel_and_wait",
    "check_env",
    "check_seconds",
    "check_str",
    "child_path",
    "dir_header",
    "durable_session_id",
    "exact_chunks",
    "explain_write_failure",
    "exposed_from_url",
    "extract_archive",
    "extract_archive_batched",
    "file_header",
    "file_kind",
    "first_failure",
    "go_file_mode_kind",
    "http_url",
    "kill_handle",
    "kind_of_mode",
    "parse_tar_header",
    "read_at_most",
    "regular_file",
    "remove_tree",
    "remove_tree_at",
    "require_credential",
    "settle",
    "settle_each",
    "symlink_header",
    "tar_padding",
    "under_a_file",
    "wait_for_verdict",
    "walk_tar",
]
