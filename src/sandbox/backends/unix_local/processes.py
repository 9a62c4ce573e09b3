"""How unix_local starts a command on this host: its environment (`command_environment`),
the command the jail's check wraps (`checked_command`), the clone itself for a one-shot
command (`start_one_shot`) or a process (`spawn`), and our error when `Popen` could not
start it (`start_error`). Through the runner, see `runner_link`.
"""

from __future__ import annotations

import dataclasses
import errno
import os
from collections.abc import Callable, Mapping
from typing import Any

from ...backend import CommandSpec, ExecCapture, OutputSink, Process
from ...errors import SandboxError
from ...local.host_env import host_environment
from ...local.process import LocalProcess
from ..toolkit import CommandCheck, ShellTrap
from .handle import LocalHandle, LocalOneShot

DEFAULT_TERM = "xterm-256color"


def command_environment(
    spec: CommandSpec,
    *,
    tty: bool,
    inherit_env: bool,
    env: Mapping[str, str],
    confine: bool,
    home: str,
    pwd: str,
) -> dict[str, str]:
    """The environment `spec` runs with: the host's (or, without `inherit_env`, PATH and,
    in the jail, what `is_locale_or_identity` lets through), the session's `env`, HOME
    (the workspace), PWD, TERM on a terminal, then the command's own variables."""
    if inherit_env:
        environment = host_environment()
    else:
        environment = {"PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin")}
        if confine:
            environment.update((k, v) for k, v in os.environ.items() if is_locale_or_identity(k))
    environment.update(env)
    environment["HOME"] = home
    if confine:
        environment["TMPDIR"] = "/tmp"  # the host's TMPDIR is not visible in the jail
    environment["PWD"] = pwd
    if tty:
        environment.setdefault("TERM", DEFAULT_TERM)
    if spec.env:
        environment.update(spec.env)
    return environment


def is_locale_or_identity(name: str) -> bool:
    """Variables a confined session passes on without `inherit_env`: none is a secret."""
    return name in ("LANG", "LANGUAGE", "TZ", "USER", "LOGNAME") or name.startswith("LC_")


def checked_command(
    spec: CommandSpec, *, confine: bool, cwd: str, announce: bool
) -> tuple[CommandSpec, CommandCheck | None]:
    """The command to start, and its check (None: not needed); `cwd` is `spec`'s on
    the host.

    Unconfined, `Popen` itself reports a bad `cwd` or program exactly (see
    `start_error`): no check. In the jail the host cannot tell what exists inside
    it, so the shared check runs there, from the workspace.
    """
    if not confine:
        return spec, None
    check = CommandCheck.needed(spec, cwd=cwd)
    if check is None:
        return spec, None
    argv = tuple(check.argv(spec.argv, announce=announce))
    return dataclasses.replace(spec, argv=argv, cwd=None), check


def start_one_shot(
    spec: CommandSpec,
    capture: ExecCapture,
    *,
    argv: list[str],
    env: dict[str, str],
    cwd: str,
    error_cwd: str,
    placement: Mapping[str, Any],
    note: Callable[[int], bytes],
) -> LocalOneShot:
    """Start a one-shot command (`argv`, checked from `spec`) on pipes read by the event
    loop straight into the bounded capture, placed by `placement` (the session's cgroup,
    hub, tag: `LocalProcess.spawn`'s keywords); `error_cwd` is `spec`'s cwd on the host,
    for `start_error`."""
    try:
        proc = LocalProcess.spawn(
            argv,
            tty=False,
            env=env,
            cwd=cwd,
            on_stdout=capture.add_stdout,
            on_stderr=capture.add_stderr,
            **placement,
        )
    except OSError as exc:
        raise start_error(spec, error_cwd, exc) from None
    return LocalOneShot(proc, capture, note)


def spawn(
    entry: OutputSink[Process],
    trap: ShellTrap | None,
    *,
    argv: list[str],
    env: dict[str, str],
    cwd: str,
    error_cwd: str,
    placement: Mapping[str, Any],
    note: Callable[[int], bytes] | None,
    grace_s: float,
) -> None:
    """Start the entry's command (as `argv`, checked) as its `LocalProcess`, placed by
    `placement` (as in `start_one_shot`), and store its `LocalHandle`. `note` (None: no
    limits in force) gives what a process's exit code adds to its output; `error_cwd`
    is the entry's cwd on the host."""
    spec = entry.spec

    def on_stdout(data: bytes) -> None:
        # Only with a check: the trap strips its start marker (nothing precedes it).
        shown = data if trap is None else trap.feed(data)
        if shown:
            entry.feed(shown)

    def on_exit(code: int) -> None:
        assert note is not None
        added = note(code)
        if added:
            entry.feed(added)
        entry.report_exit(code)

    try:
        process = LocalProcess.spawn(
            argv,
            tty=spec.tty,
            env=env,
            cwd=cwd,
            rows=spec.rows,
            cols=spec.cols,
            stdin=spec.stdin,
            on_stdout=entry.feed if trap is None else on_stdout,
            on_exit=entry.report_exit if note is None else on_exit,
            on_eof=entry.report_eof,
            **placement,
        )
    except OSError as exc:
        raise start_error(spec.command, error_cwd, exc) from None
    entry.handle = LocalHandle(process, entry, grace_s=grace_s)


def start_error(spec: CommandSpec, cwd: str, exc: OSError) -> SandboxError:
    """Our error for `Popen` failing to start `spec` in `cwd` (it names the culprit:
    the directory, or the program it could not execute)."""
    check = CommandCheck(spec, cwd=cwd)
    if exc.filename == cwd:
        kind = {errno.ENOENT: "nocwd", errno.ENOTDIR: "notdir"}.get(exc.errno or 0, "noaccess")
        return check.error(kind)
    if not spec.shell:
        missing = exc.errno in (errno.ENOENT, errno.ENOTDIR)
        return check.error("noprog" if missing else "noexec")
    return SandboxError(f"could not start the command: {exc.strerror or exc}")
