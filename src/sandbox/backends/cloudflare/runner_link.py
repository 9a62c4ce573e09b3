"""The runner inside a Cloudflare sandbox (docs/runner.md): put there once through the
Worker's file API, checked by content, reached over a terminal of the bridge's own
(`toolkit.TerminalLink`), the only two-way stream into the container.

Delivery: one control exec (`RUNNER_PREPARE_SCRIPT`, toolkit `runner_delivery`) says
where the runner goes (`$SANDBOX_RUNNER_DIR`, else `$TMPDIR`, else /tmp: a container's
/tmp is its own), the container's machine (`uname -m`), the sha256 of the file at each
packaged runner's content-named path, and the exec's environment (`/proc/$$/environ`:
every process through the runner starts from it). When the digest for the machine is
not ours, a `PUT .../file/workspace/<temporary>` writes the bytes (the file route is
binary-safe: routes.ts reads the body as an ArrayBuffer and hands it to the container
base64-encoded, 32 MiB at most) at a private name in /workspace, the only place it
writes, and a second control exec (`RUNNER_INSTALL_SCRIPT`) checks their size and
sha256, makes them executable and moves them over the runner's path. The PUT is a task
of our own: an upload that fails or is cancelled waits for its answer (a Worker that
got the body writes it whether or not the client still listens), then removes the
temporary file.

The link: the session's own spawn of a terminal process (`processes.spawn_terminal`:
a bridge session of its own, its PTY socket, the typed and trapped line) runs
`connect --text --start --ready TOKEN`, which starts the runner once (detached, its
own session: it outlives the terminal and this client) and carries the protocol as
base64 lines. Its end (`TerminalLink.close`) types the end line, then kills the
bridge session's tree and deletes the session; the runner and its processes stay.
`CloudflareRunner` is the session's end of it: the client, the link, and the
environment and folder every process starts with.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import Awaitable, Callable

from ...errors import ProviderError, SandboxError
from ...runner import RunnerBinary
from ..toolkit import (
    RUNNER_INSTALL_SCRIPT,
    RUNNER_PREPARE_SCRIPT,
    LinkedRunner,
    LinkSink,
    SandboxPlace,
    TerminalLink,
    check_runner_installed,
    checked_folder,
    close_then_release,
    packaged_bytes,
    parse_prepare,
    place_runner,
)
from .client import WorkerClient
from .files import WORKSPACE
from .terminal import PtyHandle

# How long the cleanup of a temporary upload may take (it runs while a caller is being
# cancelled).
CLEANUP_TIMEOUT_S = 5.0

# The session's spawn of a terminal process for the link (`processes.spawn_terminal`
# with the session's options).
SpawnTerminal = Callable[[LinkSink[PtyHandle]], Awaitable[None]]


class Prepared:
    """What the prepare exec found: the place (`SandboxPlace`) and the exec's folder,
    where every process through the runner starts unless told otherwise (an exec's
    folder is /workspace, config.ts `DEFAULT_CWD`; the runner itself runs in /)."""

    def __init__(self) -> None:
        self.home = WORKSPACE

    async def __call__(self, client: WorkerClient, names: list[str]) -> SandboxPlace:
        """Run the prepare script behind the exec's folder (NUL-ended), both parsed and
        checked: the folder, the machine, the digests, the environment."""
        what = "find the runner's folder in the sandbox"
        script = 'printf "%s\\0" "$(pwd)"; ' + RUNNER_PREPARE_SCRIPT
        argv = ["sh", "-c", script, "sandbox-runner-prepare", *names]
        code, stdout = await client.control(argv, what)
        if code != 0:
            raise ProviderError(f"could not {what} (exit {code})")
        home, _, rest = stdout.partition(b"\0")
        self.home = checked_folder(home, "working folder", "the sandbox")
        return parse_prepare(rest, names)


async def upload(client: WorkerClient, binary: RunnerBinary, path: str) -> None:
    """PUT the runner's bytes at a private temporary name in /workspace, then
    `RUNNER_INSTALL_SCRIPT`: checked by size and sha256, made executable, moved over
    `path`. The temporary name is removed if anything fails or is cancelled."""
    data = await packaged_bytes(binary)
    # Relative to the exec's folder, /workspace (config.ts `DEFAULT_CWD`).
    temporary = f".sandbox-runner-{secrets.token_hex(6)}.tmp"
    what = "put the runner into the sandbox"
    installed = False
    # The PUT is our own task: a cancelled caller waits for its answer (bounded by the
    # request timeout) before the temporary file is removed, since a Worker that got
    # the body writes it whether or not we still listen.
    put = asyncio.ensure_future(client.call("PUT", client.file_url(temporary), what, data=data))
    try:
        await asyncio.shield(put)
        argv = ["sh", "-c", RUNNER_INSTALL_SCRIPT, "sandbox-runner-install"]
        argv += [temporary, path, binary.sha256, str(len(data))]
        code, stdout = await client.control(argv, what)
        installed = True  # the script removed the temporary file whatever it found
        check_runner_installed(binary, code, stdout.decode("ascii", "replace"), "")
    finally:
        if not installed:
            await asyncio.wait({put})
            if not put.cancelled():
                put.exception()  # raised above, or superseded by the cancellation
            if client.http is not None:
                await _discard(client, temporary)


async def _discard(client: WorkerClient, temporary: str) -> None:
    """Remove a temporary upload (best effort, bounded, never cancelled half-way)."""
    remove = client.control(["rm", "-f", "--", temporary], "remove a temporary file")
    with contextlib.suppress(SandboxError, TimeoutError):
        async with asyncio.timeout(CLEANUP_TIMEOUT_S):
            await asyncio.shield(remove)


class CloudflareRunner(LinkedRunner[TerminalLink[PtyHandle]]):
    """The session's connection to the runner in its sandbox (`LinkedRunner`): processes
    start in the exec's folder (/workspace) unless told otherwise."""

    @classmethod
    async def start(
        cls, worker: WorkerClient, spawn: SpawnTerminal, *, required: bool
    ) -> CloudflareRunner | None:
        """Deliver the runner (unless the same bytes are there), open the link (which
        starts it, or finds it running) and say HELLO. Where this install has no runner
        for the sandbox's machine: `UnsupportedOperationError` when `required`, else
        None (the session keeps its own terminals)."""
        prepare = Prepared()
        placed = await place_runner(
            lambda names: prepare(worker, names),
            lambda binary, path: upload(worker, binary, path),
            required=required,
        )
        if placed is None:
            return None
        link: TerminalLink[PtyHandle] = TerminalLink(spawn)
        client = await cls.say_hello(placed, link, where="the sandbox")
        return cls(client, link, placed.env, prepare.home)


async def connect(
    worker: WorkerClient, spawn: SpawnTerminal, option: bool | None
) -> CloudflareRunner | None:
    """The session's runner as its `runner` option asks: none for False; else
    `CloudflareRunner.start`, `required` for True (`None` keeps the bridge's terminals
    where this install has no runner for the sandbox's machine)."""
    if option is False:
        return None
    return await CloudflareRunner.start(worker, spawn, required=bool(option))


async def shut_down(runner: CloudflareRunner | None) -> None:
    """Close the runner's link, if any (the runner lives on in a kept sandbox; the
    sandbox's deletion ends it)."""
    await close_then_release(runner)
