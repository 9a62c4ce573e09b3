"""The `blaxel` backend: a Blaxel sandbox, driven by the Blaxel SDK and its terminal.

- `session`: `BlaxelSession`, the hooks only;
- `client`: credentials (in `Secret`s), SDK calls, the sandbox instance, terminal URL;
- `sdk`: the SDK imported without touching logging, its process-wide client;
- `errors`: Blaxel's error codes over the toolkit's HTTP policy (`BlaxelAPIError`,
  `AnswerTooLargeError`);
- `bounds`: the bounds on what the peer sends (API answers, terminal messages);
- `limits`: the portable resource limits as Blaxel's create takes them;
- `options`: the session's options, checked when it is made;
- `execs`: one-shot commands (`process.exec`) as a `OneShotProcess`;
- `files`: files through the sandbox API, regular files only;
- `terminal`: processes on the terminal WebSocket (its facts, frames, typed lines);
- `process`: `Terminal`, one such process's handle (a `Process`: write, resize,
  interrupt, kill with the toolkit's script) and its reader;
- `runner_link`: with `runner=True`, the runner in the sandbox (docs/runner.md): put
  in through the filesystem API, reached by a bridge typed into one of its terminals
  (the toolkit's `TerminalLink`); every process and one-shot command goes through it;
- `durable`: detach and resume: refs by sandbox name, terminal sessions reattached by
  id with their replayed output (or the runner's processes, through it), the lease in
  the sandbox.
- `workspace`: exposed ports (private previews and their tokens) and snapshots
  (`snapshots.create`, polled until ready; forks of them).
"""

from __future__ import annotations

from .errors import AnswerTooLargeError, BlaxelAPIError, is_retryable
from .sdk import configure_sdk
from .session import BlaxelSession
from .terminal import parse_terminal_frame

__all__ = [
    "AnswerTooLargeError",
    "BlaxelAPIError",
    "BlaxelSession",
    "configure_sdk",
    "is_retryable",
    "parse_terminal_frame",
]
