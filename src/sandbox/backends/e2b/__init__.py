"""The `e2b` backend: E2B cloud sandboxes through the `e2b` SDK's async surface.

`session` holds `E2BSession` (the lifecycle hooks only); beside it, one idea per module:
`client` is one session's bounded view of its sandbox (process calls, the tag-based
kill), `sandboxes` creates, attaches to, kills and sweeps sandboxes, `processes` starts
commands and holds what is kept about a running one (`E2BProcess`, a process's handle
and its controls; the one-shot `OneShot`), `scripts` builds the shell lines from the
toolkit's wrapper and kill scripts, `files` reads and writes regular files,
`runner_link` puts the runner into the sandbox and carries its protocol over a text
command (`runner=True`, docs/runner.md), and `errors` maps the SDK's exceptions onto
ours by the toolkit's policy.
Only the registry imports this package (lazily), so importing `sandbox` never imports
the e2b SDK.
"""

from __future__ import annotations

from .session import E2BSession

__all__ = ["E2BSession"]
