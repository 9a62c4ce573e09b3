"""The unix_local session's options: their defaults and checks (`check_options`, which
`UnixLocalSession.__init__` calls before anything is made), and what they say once
checked (`LocalOptions`). A bad option raises `InvalidArgumentError` naming it (or
`UnsupportedOperationError` for a limit the runner cannot enforce), when the session is
opened: it must not surface later as a raw TypeError in a teardown.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ...backend import check_env, check_seconds
from ...errors import InvalidArgumentError, UnsupportedOperationError
from . import cgroup_limits

CONTAINMENTS = ("auto", "cgroup", "tag")


@dataclass(frozen=True, slots=True)
class LocalOptions:
    """A unix_local session's checked options.

    Options: `workdir` (a directory; default a temporary one removed on close), `env`
    (variables added to every command), `inherit_env` (start from this process's
    environment; default True, but False when confined), `terminate_grace_s` (time
    between the polite signals and SIGKILL when terminating, default 1 s), plus the base
    session's options.

    Confinement (Linux, needs bubblewrap; see `backends.unix_local.confine`): `confine=True` runs
    every process in a jail where the workspace (same path as on the host, and HOME) is
    the only writable host directory, the system is read-only and everything else is
    hidden; `network=True` keeps the host's network inside it (off by default);
    `readonly_paths` shows more host paths read-only (e.g. a toolchain in your home).
    Without bubblewrap, `start()` raises `BackendUnavailableError`: it never runs
    unconfined instead. Unconfined sessions ignore `network` and `readonly_paths`.

    Containment and limits (see `backends.unix_local.cgroup_limits`): `containment`
    (one of `CONTAINMENTS`: "cgroup" requires a session cgroup, "tag" finds the
    session's processes by their tag only, "auto" a cgroup where one can be made),
    `memory_limit_bytes`, `process_limit`, `cpu_limit` (cores, a float).

    `runner=True` (a detachable session): processes and one-shot commands are started
    by this user's local runner daemon (docs/runner.md; started on first use, found
    again through its private socket), with the same argv, environment, cwd and jail
    as without it. They outlive this client: `detach()` leaves them running and
    `resume_session` reattaches them with what they printed meanwhile
    (`keeps_processes`). The close ends them as usual. The runner contains each tree
    itself, so `containment` stays "auto" and the cgroup limits are refused.

    `env` is a dict (empty when not given); `inherit_env` is resolved (None: not
    `confine`); `readonly_paths` are the paths asked for, as str.
    """

    env: dict[str, str]
    inherit_env: bool
    terminate_grace_s: float
    confine: bool
    network: bool
    readonly_paths: tuple[str, ...]
    containment: str
    limits: cgroup_limits.Limits
    runner: bool


def check_options(
    *,
    workdir: object,
    env: Mapping[str, str] | None,
    inherit_env: bool | None,
    terminate_grace_s: float,
    confine: bool,
    network: bool,
    readonly_paths: Sequence[str | os.PathLike[str]],
    containment: str,
    memory_limit_bytes: int | None,
    process_limit: int | None,
    cpu_limit: float | None,
    runner: bool,
) -> LocalOptions:
    """The checked options of `UnixLocalSession(...)` (see `LocalOptions`), in the order
    the session always checked them."""
    if workdir is not None:
        check_workdir_option(workdir)
    for name, flag in (
        ("inherit_env", inherit_env),
        ("confine", confine),
        ("network", network),
        ("runner", runner),
    ):
        if not isinstance(flag, bool) and not (name == "inherit_env" and flag is None):
            raise InvalidArgumentError(f"{name} must be a bool, not {flag!r}")
    if isinstance(readonly_paths, str | bytes) or not all(
        isinstance(p, str | os.PathLike) for p in readonly_paths
    ):
        raise InvalidArgumentError("readonly_paths must be a list of paths")
    checked_env = check_env(env) or {}
    grace = check_seconds("terminate_grace_s", terminate_grace_s, allow_zero=True)
    assert grace is not None
    if containment not in CONTAINMENTS:
        raise InvalidArgumentError(
            f"containment must be one of {', '.join(CONTAINMENTS)}, not {containment!r}"
        )
    limits = cgroup_limits.check_limit_options(memory_limit_bytes, process_limit, cpu_limit)
    if runner:
        check_runner_options(containment, limits)
    return LocalOptions(
        env=checked_env,
        # A jail that hides ~/.aws but hands over AWS_SECRET_ACCESS_KEY would be
        # theatre: confined sessions start from a small allow-list unless told otherwise.
        inherit_env=(not confine) if inherit_env is None else inherit_env,
        terminate_grace_s=grace,
        confine=confine,
        network=network,
        readonly_paths=tuple(os.fspath(p) for p in readonly_paths),
        containment=containment,
        limits=limits,
        runner=runner,
    )


def check_runner_options(containment: str, limits: cgroup_limits.Limits) -> None:
    """Refuse what the runner cannot honour (never dropped silently): the session's
    cgroup limits, and a containment chosen by hand (the runner contains each process
    tree itself)."""
    wanted = [
        name
        for name, value in (
            ("memory_limit_bytes", limits.memory_bytes),
            ("process_limit", limits.processes),
            ("cpu_limit", limits.cpus),
        )
        if value is not None
    ]
    if wanted:
        raise UnsupportedOperationError(
            f"runner=True cannot enforce {', '.join(wanted)}: the runner's processes are "
            "not in the session's cgroup (open the session without runner=True)"
        )
    if containment != "auto":
        raise InvalidArgumentError(
            f"runner=True with containment={containment!r}: the runner contains every "
            "process tree itself (leave containment at 'auto')"
        )


def check_workdir_option(workdir: object) -> None:
    """`workdir` must be a path whose existing part is a directory (it is created at
    start): a file there would only fail later, with a raw OSError."""
    if not isinstance(workdir, str | os.PathLike):
        raise InvalidArgumentError(f"workdir must be a path, not {type(workdir).__name__}")
    path = os.fspath(workdir)
    if not isinstance(path, str) or not path or "\x00" in path:
        raise InvalidArgumentError(f"workdir must be a non-empty str path, not {path!r}")
    probe = os.path.abspath(path)
    while not os.path.lexists(probe):
        probe = os.path.dirname(probe)
    if not os.path.isdir(probe):
        what = (
            "exists and is not" if probe == os.path.abspath(path) else f"is inside {probe!r}, not"
        )
        raise InvalidArgumentError(f"workdir {path!r} {what} a directory")
