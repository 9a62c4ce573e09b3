"""The table printed by `sandbox backends`: each backend, whether its extra is installed
and whether its credentials were found. Only presence is reported, never a value.

For unix_local what this user can really use is probed, the way a session would use it:
a jail made (bubblewrap), a session cgroup made, each limit put in force on it and
removed again, and whether the native start helper (the C extension built at install
time) is in use; each that cannot be used says why. For the backends that can run their
processes through the runner (docs/runner.md), whether this install has it.
"""

from __future__ import annotations

import importlib
import os
from typing import TextIO

from ..backends import BACKENDS


def _confinement_note() -> str:
    try:
        confine = importlib.import_module("sandbox.backends.unix_local.confine")
    except ImportError:
        return ""
    ok, reason = confine.availability()
    return "; confinement available" if ok else f"; confinement unavailable: {reason}"


def _containment_note() -> str:
    try:
        cgroups = importlib.import_module("sandbox.local.cgroups")
    except ImportError:
        return ""
    ok, reason = cgroups.availability()
    note = "; containment: cgroup" if ok else f"; containment: tag (no cgroup: {reason})"
    return note + "; limits: " + ", ".join(limit_notes())


# What each limit is probed with: well above what the probe's empty cgroup uses.
_PROBES = (
    ("memory_limit_bytes", {"memory_bytes": 1 << 30}),
    ("process_limit", {"processes": 1024}),
    ("cpu_limit", {"cpus": 1.0}),
)


def limit_notes() -> list[str]:
    """For each limit option, how a session here enforces it, or why it cannot: each is
    put in force on a session cgroup made for the probe (or the v1 hierarchy alone, as
    a session without one does), then removed."""
    from ..backends.unix_local import cgroup_limits
    from ..errors import UnsupportedOperationError
    from ..local import cgroups

    notes = []
    for option, asked in _PROBES:
        try:
            session = cgroups.SessionCgroup.create()
        except (cgroups.CgroupUnavailable, OSError):
            session = None
        try:
            applied = cgroup_limits.apply(cgroup_limits.Limits(**asked), session)
        except (UnsupportedOperationError, OSError) as exc:
            notes.append(f"{option} unusable ({_why_not(exc)})")
        else:
            notes.append(f"{option} ({applied.enforced[option]})")
            applied.remove()
        finally:
            if session is not None:
                session.remove()
    return notes


def _why_not(exc: BaseException) -> str:
    why = str(exc).removeprefix("memory_limit_bytes").removeprefix("process_limit")
    why = why.removeprefix("cpu_limit").lstrip(": ").strip() or type(exc).__name__
    if os.geteuid() != 0:
        # The cgroups a non-root user may write are the ones delegated to it.
        why += (
            "; as a non-root user, run in a delegated cgroup (systemd-run --user -p Delegate=yes)"
        )
    return why


def native_notes() -> str:
    """Whether the native extension (the clone3 start helper, `sandbox._native._spawn`)
    is in use, and why not when it is not: `SANDBOX_NO_EXTENSIONS` set, or the install
    did not build it."""
    from ..local import spawn_helper

    why = spawn_helper.reason()
    if not why:
        return "; native extension (clone3 start helper): in use"
    return (
        f"; native extension (clone3 start helper): not in use ({why}):"
        " processes start through the slower Popen path"
    )


# The backends that can run their processes through the runner (docs/runner.md), and how
# a session asks for it.
RUNNER_BACKENDS = {
    "blaxel": "with runner=True (or None: where the sandbox takes it)",
    "cloudflare": "with runner=True (or None: where the sandbox takes it)",
    "daytona": "with runner=True (or None: where the sandbox takes it)",
    "docker": "used by default (runner=False: per-exec)",
    "kubernetes": "used by default (runner=False: per-exec)",
    "e2b": "with runner=True (or None: where the sandbox takes it)",
    "modal": "used by default (runner=False: per-exec)",
    "unix_local": "for `sandbox open` sessions, or runner=True",
}


def runner_note(backend: str) -> str:
    """Whether this install has the runner for `backend`'s sessions, and why not: without
    it they keep today's per-exec path (processes end with their client)."""
    how = RUNNER_BACKENDS.get(backend)
    if how is None:
        return ""
    from ..runner import runner_binary, unavailable_reason

    binary = runner_binary()
    if binary is None:
        why = unavailable_reason() or "runner: not built"
        return f"; {why.removeprefix('runner: ')}: the runner is not available, per-exec path"
    return f"; runner: built ({binary.size // 1024} KiB, sha256 {binary.sha256[:12]}), {how}"


def _kubeconfig_note() -> str:
    """Whether a kubeconfig (and its current context) or a service account was found:
    the file is read, no credential plugin runs."""
    try:
        config = importlib.import_module("sandbox.backends.kubernetes.config")
    except ImportError:
        return "not checked (extra missing)"
    where, context = config.found()
    if where is None:
        return "missing (KUBECONFIG, ~/.kube/config or a service account)"
    if where == "in-cluster":
        return "found (in-cluster service account)"
    return f"found (kubeconfig, context {context})" if context else "found (kubeconfig, no context)"


def backend_rows() -> list[tuple[str, str, str, str]]:
    """(name, installed, credentials, notes) for every registered backend."""
    rows = []
    for info in BACKENDS.values():
        missing = info.missing_modules()
        installed = "yes" if not missing else f"no (pip install 'agent-sandbox-pty[{info.extra}]')"
        found = info.credentials_found()
        if info.name == "kubernetes":
            creds = _kubeconfig_note()
        elif found is None:
            creds = "not needed"
        else:
            names = " + ".join(info.credential_env[0])
            creds = f"found ({names})" if found else f"missing ({names})"
        notes = info.description
        if info.name == "unix_local":
            notes += _confinement_note() + _containment_note() + native_notes()
        notes += runner_note(info.name)
        rows.append((info.name, installed, creds, notes))
    return rows


def print_backends(out: TextIO) -> None:
    """Print the backends table."""
    header = ("backend", "installed", "credentials", "notes")
    rows = [header, *backend_rows()]
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    for row in rows:
        out.write("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row[:3])))
        out.write(f"  {row[3]}\n")
