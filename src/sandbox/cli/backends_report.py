"""The table printed by `sandbox backends`: each backend, whether its extra is installed
and whether its credentials were found. Only presence is reported, never a value."""

from __future__ import annotations

import importlib
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
        limits = importlib.import_module("sandbox.backends.unix_local.cgroup_limits")
    except ImportError:
        return ""
    ok, reason = cgroups.availability()
    note = "; containment: cgroup" if ok else f"; containment: tag (no cgroup: {reason})"
    support = limits.support()
    enforced = [f"{name} ({how})" for name, how in support.items() if how is not None]
    return note + ("; limits: " + ", ".join(enforced) if enforced else "; no limits")


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
            notes += _confinement_note() + _containment_note()
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
