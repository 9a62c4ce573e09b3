"""Every byte count and deadline the `cloudflare` backend applies to what the Worker
sends, in one place (docs/providers.md, "Cloudflare", says where each number comes
from). Past a bound the call fails with a `ProviderError`; the bounds are per message,
event or body, never per stream, so output streams stay unbounded in total.
"""

from __future__ import annotations

MIB = 1024 * 1024

# JSON answers (create, running, session create/delete, a PUT's `{"ok"}`, error
# bodies): the bridge's largest is a short error object (helpers.ts `errorJson`).
MAX_JSON_BODY = 1 * MIB
# Bytes of an error body worth reading for its explanation.
MAX_ERROR_BODY = 4096
# One line, and one event's `data` lines together, of an exec's event stream: the
# bridge sends one event per output chunk of the process (routes.ts `writeSSE`, base64
# of one `onOutput` string), far below this.
MAX_SSE_LINE = 4 * MIB
MAX_SSE_EVENT = 4 * MIB
# One terminal WebSocket message: the largest the container sends is the replay of its
# 256 KiB output ring (pty.ts `DEFAULT_BUFFER_SIZE`, pty-ws-handler.ts `onOpen`).
MAX_WS_MESSAGE = 4 * MIB
# Output kept from the frames that come before `ready`: that same ring, and little else.
MAX_PRE_READY = 1 * MIB
# Output kept from a control exec (stat, kill, script write): they print a line or none.
MAX_CONTROL_OUTPUT = 64 * 1024
# Longest line typed into a terminal as it is. A new PTY's bash may not be reading with
# readline yet when the line arrives (the container sends `ready` at once), and a tty in
# canonical mode keeps at most 4095 bytes of a line; longer lines are written to a file
# in /tmp by a control exec and sourced.
MAX_TYPED_LINE = 1024
# The script's text goes to that exec as argv strings of at most this many bytes (Linux
# refuses one argv string above 128 KiB), this many per exec (ARG_MAX is 2 MiB at least).
SCRIPT_ARG_BYTES = 64 * 1024
SCRIPT_ARGS_PER_EXEC = 16
# The whole close of a terminal socket (its handshake reads until the Worker's close
# frame; a Worker that keeps sending is dropped then).
WS_CLOSE_TIMEOUT_S = 5.0
