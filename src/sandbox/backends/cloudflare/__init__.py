"""The `cloudflare` backend: a user-deployed Cloudflare Sandbox Worker (the bridge of
cloudflare/sandbox-sdk), over HTTP and WebSocket with aiohttp.

- `session`: `CloudflareSession`, the hooks only;
- `sandboxes`: creating and attaching to a sandbox;
- `runner_link`: the runner (`runner=True`), delivered by the file route and reached
  over a terminal of its own;
- `client`: the Worker's HTTP API (URLs, requests, control execs), the key in a `Secret`;
- `errors`: the Worker's answers by the toolkit's error policy, exits by `normalize_exit`;
- `execs`: one-shot commands as a `OneShotProcess`, under the toolkit's wrapper;
- `terminal`: PTY sessions, their WebSocket and reader; `PtyHandle`, a process's
  handle, is a `Process`;
- `processes`: the spawn of a process (its own bridge session, the typed line);
- `files`: files under /workspace, stat'ed first;
- `scripts`: the terminal's session kill and the stat, beside the toolkit's scripts;
- `sse`: the incremental server-sent-event decoder of the exec stream;
- `durable`: detach and resume (terminal sessions reattached by id, the container mark,
  the lease in the sandbox);
- `bounds`: every byte count and deadline applied to what the Worker sends.
"""

from __future__ import annotations

from .errors import API_KEY_ENV, exit_status
from .session import WORKER_URL_ENV, CloudflareSession
from .terminal import TerminalEvent, WorkerTerminal

__all__ = [
    "API_KEY_ENV",
    "WORKER_URL_ENV",
    "CloudflareSession",
    "TerminalEvent",
    "WorkerTerminal",
    "exit_status",
]
