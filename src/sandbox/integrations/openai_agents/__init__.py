"""Run OpenAI Agents SDK agents on sandbox sessions (extra `openai-agents`).

`SandboxClient` is a `BaseSandboxClient` of the SDK: give it to `SandboxRunConfig` with
`SandboxClientOptions(backend="docker", backend_options={...})` and the SDK's tools
(`exec_command`, `write_stdin`, file editing, ...) run on any backend in
`sandbox.BACKENDS`. `Terminal` is a capability adding what the SDK's tools lack:
screens, resize, interrupt, terminate, and `until` on starting and writing.

Importing this package imports the SDK; `import sandbox` does not.
"""

from __future__ import annotations

try:
    import agents.sandbox  # noqa: F401
except ImportError as error:  # pragma: no cover - depends on the environment
    raise ImportError(
        "sandbox.integrations.openai_agents needs the OpenAI Agents SDK: "
        "pip install 'agent-sandbox-pty[openai-agents]'"
    ) from error

from .client import SandboxClient
from .options import SandboxClientOptions
from .session import AgentsSessionAdapter
from .state import SandboxSessionState
from .terminal import Terminal

__all__ = [
    "AgentsSessionAdapter",
    "SandboxClient",
    "SandboxClientOptions",
    "SandboxSessionState",
    "Terminal",
]
