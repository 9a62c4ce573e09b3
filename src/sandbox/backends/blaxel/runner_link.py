"""The runner inside a Blaxel sandbox (docs/runner.md): put there once through the
filesystem API, checked by content, reached by a bridge typed into one of the sandbox's
terminals (`connect --text --ready`, toolkit `runner_terminal`).

Why: the terminal is Blaxel's only two-way stream into a sandbox, and its server turns
each 4096-byte PTY read into text on its own (`string(buf[:n])` through Go's JSON
encoder), a UTF-8 character split between two reads becoming one U+FFFD per byte; the
process API gives no input at all. No client can undo that; an encoder inside the
sandbox can: the runner's bridge puts its terminal in raw mode and carries the
protocol as base64 lines, which are ASCII and arrive whole. Through the runner every
process's output is byte-exact (terminal and pipes), a pipe's stdin stays open until
`pty_close_stdin`, a kill ends the whole tree, and a resume replays what a process
printed while no client was connected.

One waited `process.exec` (`RUNNER_PREPARE_SCRIPT`, toolkit `runner_delivery`) says
where the runner goes (`$SANDBOX_RUNNER_DIR`, else `$TMPDIR`, else /tmp: a sandbox is a
VM of its own), the sandbox's machine (`uname -m`), the sha256 of the file at each
packaged runner's content-named path, and the sandbox's environment (`/proc/$$/environ`
of the exec's shell: every process through the runner starts from it). When the digest
for the sandbox's machine is not ours, `fs.write_binary` puts the bytes at a private
temporary name and one exec (`RUNNER_INSTALL_SCRIPT`) checks their size and sha256,
makes them executable and renames them over the path.

The link is one terminal, spawned as any terminal process (`Terminal`: its own
`sessionId`, the typed and trapped line, the tag its kill script finds), running `env -u
TAG PATH connect --text --start --ready TOKEN --socket PATH.sock`: it starts the runner
once (`serve --detach`: its own session, without the terminal's tag, so it outlives
the terminal, its kill and this client) and bridges to its socket. `BlaxelRunner` is
the session's end of it: the client, the link, the environment every process starts
with and the folder relative `cwd`s start from; `connect` and `shut_down` are what the
session's start and stop do with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import secrets
from collections.abc import Awaitable, Callable, Mapping
from typing import cast

from ...backend import OutputSink
from ...errors import ProviderError, UnsupportedOperationError
from ...runner import RunnerBinary, RunnerClient
from ..toolkit import (
    MAX_RUNNER_BYTES,
    RUNNER_INSTALL_SCRIPT,
    RUNNER_PREPARE_SCRIPT,
    LinkSink,
    RunnerProcess,
    SandboxPlace,
    TerminalLink,
    check_runner_installed,
    command_line,
    hello_through,
    parse_prepare,
    place_runner,
    process_environment,
)
from .client import BlaxelClient
from .files import url_path
from .process import Terminal
from .terminal import TerminalOptions, text_to_bytes

# The bound on each short exec of the delivery (the prepare, the install), in the
# server's whole seconds.
SCRIPT_TIMEOUT_S = 60
# The terminal type a process on a terminal gets when neither its env nor the session's
# sets one (what the sandbox's own terminal sets).
DEFAULT_TERM = "xterm-256color"
# Why a process on pipes cannot keep its stdin open without the runner.
NO_OPEN_STDIN = (
    "stdin=True: the blaxel backend keeps the stdin of a process on pipes open only "
    "through the runner (runner=True); use tty=True to type into a process, or write "
    "the input to a file and redirect it (`sort < input.txt`)"
)


async def _run(client: BlaxelClient, argv: list[str], what: str) -> tuple[int, bytes, str]:
    """One waited `process.exec` of `argv`: its exit code, stdout (as bytes: the
    server's text, encoded back) and stderr."""
    instance = client.sandbox()
    response = await client.call(
        what,
        lambda: instance.process.exec(
            {
                "command": command_line(argv),
                "name": f"runner-{secrets.token_hex(6)}",
                "wait_for_completion": True,
                "timeout": SCRIPT_TIMEOUT_S,
            }
        ),
        timeout=min(client.api_timeout_s, SCRIPT_TIMEOUT_S + 10.0),
    )
    code = response.exit_code
    exit_code = code if isinstance(code, int) and not isinstance(code, bool) else -1
    return exit_code, text_to_bytes(response.stdout or ""), str(response.stderr or "")


async def prepare(client: BlaxelClient, names: list[str]) -> SandboxPlace:
    """Run the prepare script: the folder, the machine, the digests, the environment."""
    what = "find the runner's folder in the sandbox"
    argv = ["sh", "-c", RUNNER_PREPARE_SCRIPT, "sandbox-runner-prepare", *names]
    code, stdout, stderr = await _run(client, argv, what)
    if code != 0:
        raise ProviderError(f"could not {what} (exit {code}): {stderr.strip()[:300]}")
    # The server's text: a variable that was not UTF-8 reads as U+FFFD; the rest is
    # exactly what the sandbox printed.
    return parse_prepare(stdout, names)


async def upload(client: BlaxelClient, binary: RunnerBinary, path: str) -> None:
    """`fs.write_binary` of the runner's bytes to a private temporary name, then
    `RUNNER_INSTALL_SCRIPT`: checked by size and sha256, made executable, renamed over
    `path`."""
    if binary.size > MAX_RUNNER_BYTES:
        raise ProviderError("the packaged runner is larger than any runner can be")
    data = await asyncio.to_thread(binary.path.read_bytes)
    if hashlib.sha256(data).hexdigest() != binary.sha256:
        raise ProviderError("the packaged runner changed while in use", retryable=True)
    temporary = f"{path}.{secrets.token_hex(6)}.tmp"
    what = "put the runner into the sandbox"
    instance = client.sandbox()
    # The server makes the file's missing parents (the runner's folder, the first
    # time) and takes an absolute path as it is (`files`).
    await client.call(what, lambda: instance.fs.write_binary(url_path(temporary), data))
    argv = [
        "sh", "-c", RUNNER_INSTALL_SCRIPT, "sandbox-runner-install",
        temporary, path, binary.sha256, str(len(data)),
    ]  # fmt: skip
    code, stdout, stderr = await _run(client, argv, what)
    check_runner_installed(binary, code, stdout.decode("utf-8", "replace"), stderr)


class BlaxelRunner:
    """The session's connection to the runner in its sandbox: the client, the terminal
    link that carries it, the environment every process starts with and the folder
    relative `cwd`s start from (the session's `workdir`)."""

    def __init__(
        self,
        client: RunnerClient,
        link: TerminalLink[Terminal],
        base_env: dict[str, str],
        workdir: str,
    ) -> None:
        self.client = client
        self.link = link
        self.base_env = base_env
        self.workdir = workdir

    @classmethod
    async def start(
        cls,
        blaxel: BlaxelClient,
        spawn: Callable[[LinkSink[Terminal]], Awaitable[None]],
        workdir: str,
        *,
        required: bool,
    ) -> BlaxelRunner | None:
        """Deliver the runner (unless the same bytes are there), start it or find it
        running through a terminal `spawn`ed as the session spawns any (`link_spawner`),
        and connect. Where this install has no runner for the sandbox's machine:
        `UnsupportedOperationError` when `required`, else None (the session keeps its
        own terminals)."""
        placed = await place_runner(
            lambda names: prepare(blaxel, names),
            lambda binary, path: upload(blaxel, binary, path),
            required=required,
        )
        if placed is None:
            return None
        link: TerminalLink[Terminal] = TerminalLink(spawn)
        try:
            await link.start(placed.path, placed.sock)
        except BaseException:
            with contextlib.suppress(Exception):
                await asyncio.shield(link.close())
            raise
        client = await hello_through(
            link.text.reader,
            link.text.writer,
            stderr=link.stderr,
            close=link.close,
            where="the Blaxel sandbox",
        )
        return cls(client, link, placed.env, workdir)

    def environment(
        self, extra: Mapping[str, str] | None, *, tty: bool, term: str = DEFAULT_TERM
    ) -> dict[str, str]:
        """The whole environment of one process: the sandbox's, the command's, and TERM
        for a terminal."""
        return process_environment(self.base_env, extra, tty=tty, term=term)

    async def aclose(self) -> None:
        """Close the connection and end the bridge (the runner and any process it keeps
        live on)."""
        try:
            await self.client.aclose()
        finally:
            await self.link.close()


def link_spawner(
    blaxel: BlaxelClient, options: TerminalOptions, workdir: str, sandbox_name: str
) -> Callable[[LinkSink[Terminal]], Awaitable[None]]:
    """The spawn of the link's terminal: a `Terminal` for the sink, stored at once (a
    cancelled spawn leaves the link a handle to kill), typed into in `workdir`. Its
    close (`TerminalLink.close`) kills it remotely unless the bridge ended, whether the
    sandbox is kept or not (`keep=True`: the kill is never skipped)."""

    async def spawn(sink: LinkSink[Terminal]) -> None:
        entry = cast(OutputSink[Terminal], sink)
        term = Terminal(entry, blaxel, options, keep=True)
        sink.handle = term
        await term.start(workdir, workdir, sandbox_name)

    return spawn


async def connect(
    blaxel: BlaxelClient,
    option: bool | None,
    options: TerminalOptions,
    workdir: str,
    sandbox_name: str,
) -> BlaxelRunner | None:
    """The session's runner as its `runner` option asks: none for False; for None, none
    where this install has no runner for the sandbox's machine (Blaxel's own terminals
    stay); for True, that is `UnsupportedOperationError` (`BlaxelRunner.start`). The
    link's terminal is one of the sandbox's (with the session's terminal `options`),
    started in the session's `workdir`."""
    if option is False:
        return None
    spawn = link_spawner(blaxel, options, workdir, sandbox_name)
    return await BlaxelRunner.start(blaxel, spawn, workdir, required=bool(option))


async def close_stdin(handle: object) -> None:
    """End a process's open stdin: only the runner's processes have one
    (`RunnerProcess.close_stdin`); any other handle is `UnsupportedOperationError`."""
    if not isinstance(handle, RunnerProcess):
        raise UnsupportedOperationError(NO_OPEN_STDIN)
    await handle.close_stdin()


async def shut_down(runner: BlaxelRunner | None, release: Callable[[], Awaitable[None]]) -> None:
    """Close the runner's link (the runner lives on in a kept sandbox; a deleted one
    ends it), then `release` the sandbox whatever became of the link."""
    try:
        if runner is not None:
            await runner.aclose()
    finally:
        await release()
