"""The `daytona` backend: Daytona sandboxes through the SDK's async surface (`daytona`).

`session` holds `DaytonaSession` (the lifecycle hooks only); beside it, one idea per
module: `client` (the SDK client and the sandbox: create or attach, prepare, delete;
bounded, mapped calls), `commands` (pipes and one-shot commands, one session command
each: `PipeState`), `terminal` (PTY sessions with `ShellTrap` in exec mode:
`PtyState`), `handles` (`DaytonaHandle`, the `Process` both are: the base session's
hooks write, resize, interrupt and kill through it), `files` (`fs` with a stat first),
`scripts` (the `sh` run beside a command: pid files, group kills), `runner_link` (the
runner in the sandbox with `runner=True`: delivery and the `connect --text` session
command) and `errors` (the SDK's exceptions by the toolkit's policy). Only the registry
imports this package (lazily), so importing `sandbox` never imports the daytona SDK.
"""

from __future__ import annotations

from .session import DaytonaSession

__all__ = ["DaytonaSession"]
