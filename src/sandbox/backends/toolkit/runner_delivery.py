"""Putting the runner into a sandbox (docs/runner.md, Delivery), in what does not depend
on the provider: the content-named path, the prepare script that says where the runner
goes and what is there already, and the choice of the build for the sandbox's machine.

A backend runs `RUNNER_PREPARE_SCRIPT` once (however its provider runs a command), hands its
stdout to `parse_prepare`, asks `choose_binary` for the build, writes the bytes (its
provider's way) unless `SandboxPlace.digests` says they are there, and connects.
Nothing here imports a provider SDK.
"""

from __future__ import annotations

import asyncio
import hashlib
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from ...errors import ProviderError, UnsupportedOperationError
from ...runner import RunnerBinary, runner_binary, unavailable_reason
from .runner_place import (
    MAX_RUNNER_BYTES,
    MAX_SOCKET_PATH,
    checked_digest,
    checked_folder,
    runner_name,
    sandbox_environment,
)

# The architectures a runner may be built for (`sandbox.runner.binary`'s spellings).
ARCHES = ("x86_64", "aarch64")

# `sh -c RUNNER_PREPARE_SCRIPT sandbox-runner-prepare NAME...`: DIR NUL MACHINE NUL, then per
# NAME its DIGEST-or-"-" NUL, then "--" NUL and the shell's environment (NUL-separated):
# the sandbox's, which every command starts from (the runner spawns with exactly the
# environment it is given). DIR: `$SANDBOX_RUNNER_DIR`, else `$TMPDIR`, else /tmp.
# A file is hashed (so trusted with the name, never uploaded again) only when it is a
# regular file that the user running this (`-O`) or root owns and that neither its group
# nor others may write (`ls -ln`'s mode): another uid's could be rewritten between this
# check and the link's exec as this user. Without `ls` only the user's own counts.
RUNNER_PREPARE_SCRIPT = (
    'd=${SANDBOX_RUNNER_DIR:-${TMPDIR:-/tmp}}; printf "%s\\0%s\\0" "$d" "$(uname -m)"; '
    'for n in "$@"; do f="$d/$n"; h=-; '
    'if [ -f "$f" ] && [ ! -L "$f" ]; then t=; set -f; set -- $(ls -ln -- "$f" 2>/dev/null); '
    "set +f; case ${1:-} in ?????w*|????????w*) ;; "
    '*) if [ -O "$f" ] || [ "${3:-}" = 0 ]; then t=1; fi;; esac; '
    'if [ -n "$t" ]; then h=$(sha256sum -- "$f" 2>/dev/null) && h=${h%% *} || h=-; fi; fi; '
    'printf "%s\\0" "$h"; done; printf -- "--\\0"; cat /proc/$$/environ 2>/dev/null; exit 0'
)

# `sh -c RUNNER_INSTALL_SCRIPT sandbox-runner-install TEMP PATH SHA256 SIZE`: the bytes a
# file API wrote to TEMP become PATH only when they are SIZE bytes and their sha256 is
# SHA256 (printed, where `sha256sum` exists; without it the size is what is checked),
# made executable and renamed over PATH; TEMP is removed whatever happens.
RUNNER_INSTALL_SCRIPT = (
    't=$1; f=$2; n=$(($(wc -c < "$t" 2>/dev/null || echo -1))); if [ "$n" -ne "$4" ]; then '
    'rm -f -- "$t"; echo "received $n of $4 bytes" >&2; exit 1; fi; '
    'if h=$(sha256sum -- "$t" 2>/dev/null); then h=${h%% *}; printf "%s" "$h"; '
    'if [ "$h" != "$3" ]; then rm -f -- "$t"; exit 1; fi; fi; '
    'chmod 755 -- "$t" && mv -f -- "$t" "$f" || { rm -f -- "$t"; exit 1; }'
)


def packaged_runners() -> dict[str, RunnerBinary]:
    """The runner builds this install has, by architecture (usually one: the host's)."""
    found = {arch: runner_binary(arch) for arch in ARCHES}
    return {arch: binary for arch, binary in found.items() if binary is not None}


@dataclass(frozen=True)
class SandboxPlace:
    """What the prepare script found: the runner's folder, the sandbox's machine, the
    digest at each packaged runner's path (None: nothing of ours there), the sandbox's
    environment."""

    folder: str
    machine: str
    digests: dict[str, str | None]
    env: dict[str, str]


def parse_prepare(output: bytes, names: list[str]) -> SandboxPlace:
    """The prepare script's stdout (`RUNNER_PREPARE_SCRIPT`), checked (it is the sandbox's)."""
    parts = output.split(b"\0")
    if len(parts) < 3 + len(names) or parts[2 + len(names)] != b"--":
        raise ProviderError("the sandbox's answer about the runner's folder was cut short")
    folder = checked_folder(parts[0], "runner folder", "the sandbox")
    machine = parts[1].decode("utf-8", "surrogateescape")
    digests = {
        name: checked_digest(raw)
        for name, raw in zip(names, parts[2 : 2 + len(names)], strict=True)
    }
    # The last piece is what followed the final NUL: cut short, or empty.
    env = sandbox_environment(parts[3 + len(names) : -1])
    return SandboxPlace(folder.rstrip("/") or "/", machine.strip(), digests, env)


def no_runner_built(required: bool) -> None:
    """Where this install has no runner at all: `UnsupportedOperationError` when the
    session asked for it (`runner=True`), else nothing (the caller falls back)."""
    if required:
        raise UnsupportedOperationError(
            f"runner=True, but {unavailable_reason() or 'the runner is not built'}"
        )


def choose_binary(place: SandboxPlace, *, required: bool) -> RunnerBinary | None:
    """The build for the sandbox's machine (`uname -m`; no answer: no guess, the host's
    machine may not be the sandbox's). None where there is none and the runner was not
    required; `UnsupportedOperationError` where it was."""
    binary = runner_binary(place.machine) if place.machine else None
    if binary is None and required:
        raise UnsupportedOperationError(
            f"runner=True, but this install has no runner for the sandbox's machine "
            f"({place.machine[:40]!r}): {unavailable_reason(place.machine) or ''}"
        )
    return binary


def runner_paths(place: SandboxPlace, binary: RunnerBinary) -> tuple[str, str]:
    """The runner's path in the sandbox and its socket's; a socket path longer than a
    unix socket's is `UnsupportedOperationError` (saying which variable shortens it)."""
    path = f"{place.folder}/{runner_name(binary)}"
    sock = f"{path}.sock"
    if len(sock.encode()) > MAX_SOCKET_PATH:
        raise UnsupportedOperationError(
            f"the runner's socket path in the sandbox would be longer than a unix "
            f"socket's ({sock[:60]}...): set a shorter $SANDBOX_RUNNER_DIR or $TMPDIR"
        )
    return path, sock


def check_runner_installed(binary: RunnerBinary, code: int, stdout: str, stderr: str) -> None:
    """The verdict of `RUNNER_INSTALL_SCRIPT`: the digest the sandbox computed must be ours, and
    the script must have succeeded."""
    digest = stdout.strip()
    if digest and digest != binary.sha256:
        raise ProviderError(
            "the runner put into the sandbox reads back as other bytes "
            f"(sha256 {digest[:16]}..., expected {binary.sha256[:16]}...)"
        )
    if code != 0:
        said = stderr.strip()[:300]
        raise ProviderError(
            f"could not put the runner into the sandbox (exit {code}): {said}", retryable=False
        )


@dataclass(frozen=True)
class PlacedRunner:
    """The runner in the sandbox, ready to be started: its build, path and socket, and
    the sandbox's environment (every process's base)."""

    binary: RunnerBinary
    path: str
    sock: str
    env: dict[str, str]


async def place_runner(
    prepare: Callable[[list[str]], Awaitable[SandboxPlace]],
    upload: Callable[[RunnerBinary, str], Awaitable[None]],
    *,
    required: bool,
) -> PlacedRunner | None:
    """Deliver the runner through a provider's two calls: `prepare(names)` runs
    `RUNNER_PREPARE_SCRIPT` and parses it (`parse_prepare`), `upload(binary, path)` puts
    the bytes there; the upload is skipped when the sandbox reports the same sha256 at
    the runner's content-named path. None where this install has no runner for the
    sandbox's machine and `required` is False (`UnsupportedOperationError` when True)."""
    builds = packaged_runners()
    if not builds:
        no_runner_built(required)
        return None
    place = await prepare([runner_name(binary) for binary in builds.values()])
    binary = choose_binary(place, required=required)
    if binary is None:
        return None
    path, sock = runner_paths(place, binary)
    if place.digests.get(runner_name(binary)) != binary.sha256:
        await upload(binary, path)
    return PlacedRunner(binary, path, sock, dict(place.env))


def read_packaged(binary: RunnerBinary) -> bytes:
    """The packaged runner's bytes (blocking: in a worker thread), refused when larger
    than any runner can be or when they are no longer the bytes it was found with (a
    build replaced under a running install: retryable)."""
    if binary.size > MAX_RUNNER_BYTES:
        raise ProviderError("the packaged runner is larger than any runner can be")
    data = binary.path.read_bytes()
    if hashlib.sha256(data).hexdigest() != binary.sha256:
        raise ProviderError("the packaged runner changed while in use", retryable=True)
    return data


async def packaged_bytes(binary: RunnerBinary) -> bytes:
    """`read_packaged`, off the event loop."""
    return await asyncio.to_thread(read_packaged, binary)


async def write_then_install(
    binary: RunnerBinary,
    path: str,
    write: Callable[[str, bytes], Awaitable[object]],
    run: Callable[[list[str]], Awaitable[tuple[int, str, str]]],
) -> None:
    """Put the runner at `path` through a provider's file API: `write(temporary, data)`
    at a private name beside it, then `run(argv)` of `RUNNER_INSTALL_SCRIPT` (exit code,
    stdout, stderr), which checks size and sha256, makes the file executable and renames
    it over `path` (removing the temporary name whatever it found)."""
    data = await packaged_bytes(binary)
    temporary = f"{path}.{secrets.token_hex(6)}.tmp"
    await write(temporary, data)
    argv = ["sh", "-c", RUNNER_INSTALL_SCRIPT, "sandbox-runner-install"]
    argv += [temporary, path, binary.sha256, str(len(data))]
    code, stdout, stderr = await run(argv)
    check_runner_installed(binary, code, stdout, stderr)


class StderrTail:
    """What a link's bridge printed on stderr, kept up to `limit` characters (the rest
    dropped), for an error message."""

    def __init__(self, limit: int = 4096) -> None:
        self._limit = limit
        self._parts: list[str] = []
        self._size = 0

    def keep(self, chunk: str) -> None:
        """Keep what fits of `chunk`."""
        room = self._limit - self._size
        if room > 0:
            self._parts.append(chunk[:room])
            self._size += len(chunk[:room])

    @property
    def text(self) -> str:
        """What was kept."""
        return "".join(self._parts)
