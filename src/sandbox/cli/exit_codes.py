"""The exit codes of the `sandbox` command, shared by the dispatcher and `sandbox run`.

A command that ran to its end exits with its own code; these are the codes `sandbox`
itself chooses.
"""

from __future__ import annotations

EXIT_ERROR = 1
"""Any error other than bad usage: a backend not installed, missing credentials, a
workspace that cannot be used, a provider failure."""

EXIT_USAGE = 2
"""Bad usage: an unknown flag or subcommand, a malformed or rejected option value."""

EXIT_TIMEOUT = 124
"""`--timeout` elapsed and the command was killed (as timeout(1))."""

EXIT_INTERRUPTED = 130
"""Interrupted by Ctrl-C."""

EXIT_BROKEN_PIPE = 141
"""The reader of our output went away (EPIPE, `sandbox run ... | head -1`): 128 + SIGPIPE,
the status a shell reports for a tool that SIGPIPE killed; nothing is printed."""
