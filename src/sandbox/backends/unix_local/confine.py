"""Confinement for the `unix_local` backend: the bubblewrap (`bwrap`) jail.

With `confine=True` every process of a session runs inside a jail built here:

- the workspace is bind-mounted read-write AT THE SAME PATH as on the host (so paths in
  compiler errors, tracebacks and files written by tools mean the same inside and out),
  and is the only writable host directory; `/tmp` is a private, empty tmpfs;
- `/usr`, `/etc` and the top-level `/bin`, `/sbin`, `/lib*` (kept as symlinks where the
  host has a merged /usr) are visible read-only; nothing else of the host is: the home
  directory, other projects, `/root`, `/var`, `/run`, other users' files in `/tmp`;
- fresh `/proc` (own PID namespace: only the jail's processes), minimal `/dev`;
- own IPC and UTS namespaces, and a network namespace with only an unconnected loopback
  unless `network=True`;
- no capabilities; `--die-with-parent` kills the jail if the host side dies.

Signals. The jail is spawned like any local process (its own session and process group,
the session's PTY as controlling terminal), so the terminal's Ctrl-C and our group kill
reach everything in that group: the outer `bwrap`, its pid-1 reaper inside the PID
namespace, and the command. The command must react to them, `bwrap` must not (else a
Ctrl-C that a Python REPL would catch kills the whole jail): a host `/bin/sh` makes
HUP/INT/QUIT/TERM ignored before it execs `bwrap`, and `env --default-signal` restores
them inside the jail right before the command. The pid-1 reaper ignores such signals by
kernel rule. When the command dies, `bwrap` exits with its status (128+N for signal N,
as unconfined); the reaper then dies with it, and with it every process left in the PID
namespace, including ones that left the process group (`setsid`). SIGKILL to the group
kills `bwrap` and so the whole namespace.

`--new-session` is NOT used: it would cut the command off the terminal (no Ctrl-C, no
job control). The attack it prevents (TIOCSTI pushing keystrokes into the user's shell)
needs the jail to share the user's terminal; ours never does: its terminal is a PTY the
session created (or none at all, for pipes), and a fresh devpts hides every other PTY.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Iterable, Sequence

from ...errors import BackendUnavailableError, InvalidArgumentError

BWRAP = "bwrap"
INSTALL_HINT = (
    "install bubblewrap (Debian/Ubuntu: apt-get install bubblewrap; "
    "Fedora: dnf install bubblewrap; Arch: pacman -S bubblewrap)"
)

# Signals the outer bwrap ignores and the command gets back at their default.
JAIL_SIGNALS = ("HUP", "INT", "QUIT", "TERM")

# Read-only system directories (bound when present) and the top-level names that are
# symlinks into /usr on merged-/usr systems (recreated as the same symlinks).
SYSTEM_DIRS = ("/usr", "/etc")
TOP_LEVEL_LINKS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")

PROBE_TIMEOUT_S = 10.0

_HOST_SH = "/bin/sh"
_IGNORE_THEN_EXEC = f'trap "" {" ".join(JAIL_SIGNALS)}; exec "$0" "$@"'


def find_bwrap() -> str | None:
    """The absolute path of `bwrap` on this process's PATH, or None."""
    found = shutil.which(BWRAP)
    return os.path.abspath(found) if found else None


def _system_mounts() -> list[str]:
    args: list[str] = []
    for path in TOP_LEVEL_LINKS:
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    for path in SYSTEM_DIRS:
        if os.path.isdir(path):
            args += ["--ro-bind", path, path]
    return args


def _resolver_mounts() -> list[str]:
    # With the network on, DNS needs /etc/resolv.conf; on systemd-resolved hosts it is a
    # symlink into /run, which the jail does not otherwise show.
    real = os.path.realpath("/etc/resolv.conf")
    if os.path.exists(real) and not real.startswith(("/etc/", "/usr/")):
        return ["--ro-bind", real, real]
    return []


def bwrap_arguments(
    *,
    workspace: str,
    cwd: str,
    network: bool = False,
    readonly_paths: Iterable[str] = (),
) -> list[str]:
    """The bwrap options (without the program and the command) of a jail whose only
    writable host directory is `workspace`, starting the command in `cwd`.

    Mounts are applied in order: the private /tmp comes before the workspace so that a
    workspace under /tmp is mounted inside the fresh tmpfs.
    """
    args = [
        "--unshare-user-try",
        "--unshare-pid",
        "--unshare-ipc",
        "--unshare-uts",
        "--unshare-cgroup-try",
        *([] if network else ["--unshare-net"]),
        "--die-with-parent",
        "--cap-drop",
        "ALL",
        *_system_mounts(),
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "--perms",
        "1777",
        "--tmpfs",
        "/tmp",
        "--bind",
        workspace,
        workspace,
    ]
    for path in readonly_paths:
        args += ["--ro-bind", path, path]
    if network:
        args += _resolver_mounts()
    args += ["--chdir", cwd]
    return args


def jail_argv(
    command: Sequence[str],
    *,
    bwrap: str,
    workspace: str,
    cwd: str,
    network: bool = False,
    readonly_paths: Iterable[str] = (),
) -> list[str]:
    """The full argv that runs `command` in the jail (see the module docstring for the
    host `sh` in front and the `env --default-signal` inside)."""
    return [
        _HOST_SH,
        "-c",
        _IGNORE_THEN_EXEC,
        bwrap,
        *bwrap_arguments(
            workspace=workspace, cwd=cwd, network=network, readonly_paths=readonly_paths
        ),
        "--",
        # Absolute: the command's PATH (which may be anything) must not decide this.
        "/usr/bin/env",
        f"--default-signal={','.join(JAIL_SIGNALS)}",
        *command,
    ]


# ---- availability ----------------------------------------------------------------------

_probe_lock = threading.Lock()
_probe_ok: set[str] = set()


def _probe(bwrap: str) -> tuple[bool, str]:
    """Run `true` in a real jail (the same options and wrapper a session uses)."""
    probe_dir = tempfile.mkdtemp(prefix="sandbox-confine-probe-")
    try:
        argv = jail_argv(["true"], bwrap=bwrap, workspace=probe_dir, cwd=probe_dir)
        try:
            done = subprocess.run(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                timeout=PROBE_TIMEOUT_S,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            return False, f"{bwrap} could not be run: {exc}"
    finally:
        shutil.rmtree(probe_dir, ignore_errors=True)
    if done.returncode != 0:
        detail = done.stderr.decode("utf-8", "replace").strip().splitlines()
        first = detail[0][:300] if detail else f"exit status {done.returncode}"
        return False, (
            f"{bwrap} failed to start a test jail ({first}); when that is about "
            "namespaces, unprivileged user namespaces are disabled (sysctl "
            "kernel.unprivileged_userns_clone, kernel.apparmor_restrict_unprivileged_userns)"
            " or a container forbids them"
        )
    return True, f"bubblewrap at {bwrap}"


def _check() -> tuple[str | None, str]:
    """(path of a working bwrap, description) or (None, why not)."""
    bwrap = find_bwrap()
    if bwrap is None:
        return None, f"bwrap was not found on PATH; {INSTALL_HINT}"
    with _probe_lock:
        if bwrap not in _probe_ok:
            ok, reason = _probe(bwrap)
            if not ok:
                return None, reason
            _probe_ok.add(bwrap)
    return bwrap, f"bubblewrap at {bwrap}"


def availability() -> tuple[bool, str]:
    """(True, what is used) when a jail can be created here, else (False, why).

    Looks `bwrap` up on PATH each time; a successful probe of a given `bwrap` is cached
    for the life of the process (failures are probed again: they may be fixed).
    Blocks for the probe (a few milliseconds): call it from a thread in async code.
    """
    bwrap, reason = _check()
    return bwrap is not None, reason


def require_bwrap() -> str:
    """The path of a working `bwrap`, or `BackendUnavailableError` saying what to do.

    Never falls back to running unconfined.
    """
    bwrap, reason = _check()
    if bwrap is None:
        raise BackendUnavailableError(
            f"confine=True needs a working bubblewrap: {reason}. "
            "The session will not run unconfined instead."
        )
    return bwrap


# ---- workspace check ---------------------------------------------------------------------


def _contains(parent: str, child: str) -> bool:
    return child == parent or child.startswith(parent.rstrip(os.sep) + os.sep)


def _homes() -> list[str]:
    homes = {os.path.expanduser("~")}
    with contextlib.suppress(KeyError):
        homes.add(pwd.getpwuid(os.getuid()).pw_dir)
    return [os.path.realpath(h) for h in homes if h and h != "~"]


def check_workspace(workspace: str) -> None:
    """Refuse a workspace whose read-write mount would defeat the jail: the root, one
    that is or contains a system directory, the home directory or /tmp."""
    real = os.path.realpath(workspace)
    guarded = [
        *SYSTEM_DIRS,
        *TOP_LEVEL_LINKS,
        "/proc",
        "/dev",
        "/tmp",
    ]
    for path in guarded:
        if _contains(real, path):
            raise InvalidArgumentError(
                f"confine=True cannot use the workspace {workspace!r}: it is or contains "
                f"{path}, which the jail keeps read-only or private; use a project directory"
            )
    for home in _homes():
        if _contains(real, home):
            raise InvalidArgumentError(
                f"confine=True cannot use the workspace {workspace!r}: it is or contains "
                "your home directory, which the jail hides; use a project directory in it"
            )


def check_readonly_paths(paths: Sequence[str]) -> list[str]:
    """Absolute, existing host paths for `readonly_paths` (`InvalidArgumentError` else)."""
    checked = []
    for path in paths:
        real = os.path.realpath(os.path.expanduser(os.fspath(path)))
        if not os.path.exists(real):
            raise InvalidArgumentError(f"readonly_paths: {path!r} does not exist")
        if real == "/":
            raise InvalidArgumentError("readonly_paths cannot expose the whole file system")
        checked.append(real)
    return checked
