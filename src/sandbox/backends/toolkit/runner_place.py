"""What every backend that puts the runner into a sandbox shares (docs/runner.md,
"Delivery"): the runner's content-named file, the bounds on what the sandbox answers
about it, the sandbox environment read back from a shell's `/proc/$$/environ`, and the
rules of the `runner` option (auto's reasons, and the errors that send it to the
per-exec path).

Everything here reads what a sandbox wrote, so it is checked and bounded before it
decides anything: a digest is 64 lowercase hex digits or none, a folder an absolute
path of at most 4096 bytes without a newline, an environment at most `MAX_SANDBOX_ENV`
variables.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any, cast

from ...errors import ProviderError, UnsupportedOperationError
from ...runner import RunnerBinary, RunnerClient, RunnerError
from .shell import TAG_VARIABLE

NAME_PREFIX = ".sandbox-runner-"
# A runner is a few MiB: a larger packaged file is refused before any byte is sent.
MAX_RUNNER_BYTES = 16 * 1024 * 1024
# What the link's stderr may hold for an error message (the rest is dropped).
MAX_STDERR_BYTES = 4096
# A unix socket's path is at most 107 bytes (sun_path is 108 with its NUL).
MAX_SOCKET_PATH = 107
# How long the runner has to answer HELLO through a fresh link (its first start in the
# sandbox included: a static binary, it is up in milliseconds).
HELLO_TIMEOUT_S = 10.0
# Variables of the sandbox's environment taken as the base of every environment.
MAX_SANDBOX_ENV = 4096
# The shell's own variables in `/proc/$$/environ` that describe the exec, not the
# sandbox (the runner sets each process's folder itself), and the tag of a wrapped exec
# (a process through the runner must not carry the tag a kill script looks for).
SHELL_OWN = frozenset({"PWD", "OLDPWD", "SHLVL", "_", TAG_VARIABLE})
# The longest folder a sandbox may name for the runner or its workspace.
MAX_FOLDER = 4096

# Why a session has no runner when it was opened with `runner=False`.
RUNNER_OFF = "runner=False"
# What a failed delivery or start raises that sends a session in auto mode
# (`runner=None`) to the per-exec path instead of failing its start: the provider's
# refusals (a read-only folder, a sandbox gone), a runner that cannot run there (noexec,
# another architecture: it never answers HELLO), a socket path too long, a link that
# did not open in time.
FALLBACK_ERRORS = (ProviderError, UnsupportedOperationError, OSError, TimeoutError)


def runner_name(binary: RunnerBinary) -> str:
    """The runner's file name in its folder: named by its content."""
    return f"{NAME_PREFIX}{binary.sha256[:16]}"


def checked_digest(raw: bytes) -> str | None:
    """A sha256 the sandbox reported (64 lowercase hex digits), or None for anything
    else ("-": nothing of ours there)."""
    digest = raw.decode("ascii", "replace")
    ok = len(digest) == 64 and all(c in "0123456789abcdef" for c in digest)
    return digest if ok else None


def checked_folder(raw: bytes, what: str, where: str) -> str:
    """A folder the sandbox named (`what` in `where`): absolute, one line, bounded;
    `ProviderError` otherwise."""
    path = raw.decode("utf-8", "surrogateescape")
    if not path.startswith("/") or "\n" in path or len(path) > MAX_FOLDER:
        raise ProviderError(f"{where} gave no usable {what}: {path[:100]!r}")
    return path


def sandbox_environment(items: list[bytes]) -> dict[str, str]:
    """The sandbox's environment from `NAME=VALUE` pieces (a shell's `/proc/$$/environ`
    split at NUL, without the piece after the last NUL: cut short, or empty), at most
    `MAX_SANDBOX_ENV`, without the shell's own variables."""
    env: dict[str, str] = {}
    for item in items[:MAX_SANDBOX_ENV]:
        key, sep, value = item.decode("utf-8", "surrogateescape").partition("=")
        if sep and key and key not in SHELL_OWN:
            env[key] = value
    return env


def fallen_back(backend: str, where: str, exc: BaseException) -> str:
    """Auto mode's reason for the per-exec path after a failed delivery or start, logged
    as a warning on the backend's logger (`sandbox.<backend>`): this install has the
    runner, so the per-exec path is a surprise."""
    reason = f"runner: could not be started in the {where} ({exc})"
    logging.getLogger(f"sandbox.{backend}").warning(
        "%s session: %s; processes go by exec (per-exec path)", backend, reason
    )
    return reason


async def hello_through(
    reader: asyncio.StreamReader,
    writer: Any,
    *,
    stderr: Callable[[], str],
    close: Callable[[], Awaitable[None]],
    where: str,
) -> RunnerClient:
    """The client of a link just opened to the runner in `where` ("the pod"): its HELLO
    answered within `HELLO_TIMEOUT_S`. A runner that does not answer is a
    `ProviderError` carrying the end of what the bridge said on stderr (`stderr()`); the
    link is closed (`close()`) before any error leaves, a cancellation included."""
    try:
        return await RunnerClient.open(
            reader, cast(asyncio.StreamWriter, writer), timeout=HELLO_TIMEOUT_S
        )
    except RunnerError as exc:
        said = stderr().strip()
        detail = f": {said[-300:]}" if said else ""
        await close()
        raise ProviderError(
            f"the runner in {where} did not answer ({exc}){detail}", retryable=False
        ) from None
    except BaseException:
        with contextlib.suppress(Exception):
            await asyncio.shield(close())
        raise
