"""What a backend author needs, in one place (the user API is `sandbox` itself).

A backend is a `BaseSandboxSession` subclass that implements the hooks documented at the
bottom of `sandbox.session` (see AGENTS.md, "Adding a backend"). Its reader feeds a
`PtyEntry`; its one-shot commands append to an `ExecCapture`; every teardown it writes
is awaited by the base session through `settle` (never by the backend itself). For a
provider that hands over a shell, `ShellTrap` carries a command's exit status in-band
and `CommandCheck` checks its `cwd` and program first. `LocalProcess` drives a real
local child without threads (the unix_local backend and the stand-ins in
`sandbox.testing` use it), and `Secret` holds a credential so that it never reaches a
message, log or repr. `_start_exec` returns a `OneShotProcess` (any object with
`wait`, `kill` and `release`); `wait_for_verdict` ends a `_spawn_process` that runs its
command behind a `CommandCheck`; `regular_file` asks a provider's stat (answering
`RemoteEntry`) whether a path is a regular file before a file call, and `under_a_file`
is the error for a write below a file; `check_env`, `check_seconds` and `check_str`
check a backend's own options the way the base session checks its own.
docs/architecture.md walks through a whole backend written with these names only.
"""

from .arguments import check_env, check_seconds, check_str
from .backends.unix_local.local_process import LocalProcess
from .command_check import CommandCheck, wait_for_verdict
from .credentials import Secret, require_credential
from .exec_output import ExecCapture, OneShotProcess
from .process_entry import CommandSpec, ProcessSpec, PtyEntry
from .remote_files import Entry as RemoteEntry
from .remote_files import regular_file, under_a_file
from .session import BaseSandboxSession, SessionState
from .settle import settle, settle_each
from .shell_trap import ShellTrap
from .tasks import cancel_and_wait, first_failure

__all__ = [
    "BaseSandboxSession",
    "CommandCheck",
    "CommandSpec",
    "ExecCapture",
    "LocalProcess",
    "OneShotProcess",
    "ProcessSpec",
    "PtyEntry",
    "RemoteEntry",
    "Secret",
    "SessionState",
    "ShellTrap",
    "cancel_and_wait",
    "check_env",
    "check_seconds",
    "check_str",
    "first_failure",
    "regular_file",
    "require_credential",
    "settle",
    "settle_each",
    "under_a_file",
    "wait_for_verdict",
]
