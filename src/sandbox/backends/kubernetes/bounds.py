"""Every byte count the Kubernetes API server (a peer) controls, and every deadline.

A reply that is not a stream is read whole only up to `MAX_API_BODY_BYTES`; a watch
event line up to `MAX_WATCH_LINE_BYTES`; an exec WebSocket message up to
`MAX_FRAME_BYTES` (aiohttp refuses a longer one and closes the socket); the Status an
exec ends with up to `MAX_STATUS_BYTES`; what a control exec (kill script, file
checks) prints up to `MAX_CONTROL_OUTPUT_BYTES`. Output of the user's commands is not
bounded here: it goes straight into the session's bounded buffers.
"""

from __future__ import annotations

MAX_API_BODY_BYTES = 4 * 1024 * 1024
MAX_WATCH_LINE_BYTES = 2 * 1024 * 1024
MAX_FRAME_BYTES = 4 * 1024 * 1024
MAX_STATUS_BYTES = 64 * 1024
MAX_CONTROL_OUTPUT_BYTES = 64 * 1024
# What one stdin frame carries (a write is cut into frames of this size).
STDIN_FRAME_BYTES = 32 * 1024

# A kubeconfig file (the caller's, but parsed before any use): its size, how deeply its
# YAML nests, and how many values it holds (counted through aliases, so a document of
# repeated aliases cannot make the check itself run long).
MAX_KUBECONFIG_BYTES = 4 * 1024 * 1024
MAX_KUBECONFIG_DEPTH = 32
MAX_KUBECONFIG_NODES = 200_000

# A whole API call (connect, send, read the reply) that is not a stream.
DEFAULT_API_TIMEOUT_S = 30.0
# Loading the credentials (an exec credential plugin runs then).
CONFIG_TIMEOUT_S = 120.0
# From the create to a running container; the pod-watch ends there with an error.
DEFAULT_START_TIMEOUT_S = 300.0
# The WebSocket upgrade of one exec (the stream itself has no deadline).
EXEC_CONNECT_TIMEOUT_S = 30.0
# A control exec (kill script, interrupt, file checks) from connect to its status.
CONTROL_TIMEOUT_S = 60.0
# After a graceful delete, how much longer than the grace period the pod may take to
# go before it is deleted again with a grace period of 0 (forced).
DELETE_SLACK_S = 10.0
# The pause before a watch the server ended is opened again.
WATCH_RETRY_S = 0.2
