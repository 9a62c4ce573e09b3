"""The `sandbox` command line: `run`, `shell`, `backends`, `demo` and `mcp`.

`main` is the console script's entry point (`sandbox = "sandbox.cli:main"`); the modules:
`app` (the parser and the dispatch), `run` (`sandbox run`), `terminal` (`sandbox shell`),
`demo`, `backends_report` (`sandbox backends`), `options` (the backend flags every
subcommand that opens a session shares, `sandbox mcp` included), `session` (opening a
session for a command) and `exit_codes`. `sandbox mcp` itself lives in `sandbox.mcp`.
"""

from __future__ import annotations

from .app import main

__all__ = ["main"]
