"""The lease kept as a file in a remote sandbox, swapped by one small `sh` script.

For providers with no owner notion of their own (Docker, E2B, ...): each read or swap
is one command in the sandbox. The swap takes a `mkdir` lock (atomic on every POSIX
file system), compares, writes a new file and renames it over the lease, so readers
never see half a value. A lock left by a command killed half-way is broken after about
4 s, and the swap then goes ahead whatever a process in the sandbox does to the lock,
so neither a crashed client nor the sandbox can wedge a close. The lease file is named
by the session id (`[A-Za-z0-9_-]`, checked by `sandbox.backend.SessionRef`), under /tmp.

The sandbox can write the file: the script only carries text, and the host trusts a
record only when its seal, made under a secret the sandbox never sees, matches
(`sandbox.durable.lease`).

Every reply starts with `=`: a reply without it is a failure, not an empty lease.
"""

from __future__ import annotations

import shlex

from ...errors import ProviderError

LEASE_DIR = "/tmp"
# $1 file, $2 mode (read|swap), $3 expected ("" for none), $4 new.
SCRIPT = r"""
f=$1
if [ "$2" = read ]; then printf '='; cat "$f" 2>/dev/null; exit 0; fi
d="$f.lock"; i=0
until mkdir "$d" 2>/dev/null; do
  i=$((i+1)); if [ "$i" -gt 400 ]; then rm -rf "$d"; mkdir "$d" 2>/dev/null; break; fi
  sleep 0.01 2>/dev/null || sleep 1
done
cur=$(cat "$f" 2>/dev/null)
if [ "$cur" = "$3" ]; then printf '%s\n' "$4" > "$f.new" && mv -f "$f.new" "$f"; fi
rmdir "$d"
printf '=%s' "$cur"
"""


def lease_path(session_id: str) -> str:
    """Where the lease of `session_id` lives in the sandbox."""
    return f"{LEASE_DIR}/.sandbox-lease-{session_id}"


def lease_read_argv(path: str) -> list[str]:
    """The argv that prints the lease."""
    return ["sh", "-c", SCRIPT, "sh", path, "read"]


def lease_swap_argv(path: str, expected: str | None, new: str) -> list[str]:
    """The argv that swaps the lease from `expected` to `new` and prints what it was."""
    return ["sh", "-c", SCRIPT, "sh", path, "swap", expected or "", new]


def lease_line(argv: list[str]) -> str:
    """One shell line for providers that take a string."""
    return shlex.join(argv)


def parse_lease(output: str, exit_code: int | None, backend: str) -> str | None:
    """The lease value from the script's output (None: none)."""
    if not output.startswith("="):
        raise ProviderError(
            f"the {backend} lease check failed in the sandbox (exit {exit_code}): "
            f"{output[-200:] or 'no output'}",
            retryable=False,
        )
    return output[1:].strip() or None
