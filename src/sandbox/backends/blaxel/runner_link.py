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

import secrets
from collections.abc import Awaitable, Callable
from typing import cast

from ...backend import OutputSink
from ...errors import ProviderError, UnsupportedOperationError
from ...runner import RunnerBinary
from ..toolkit import (
    RUNNER_PREPARE_SCRIPT,
    LinkedRunner,
    LinkSink,
    RunnerProcess,
    SandboxPlace,
    TerminalLink,
    close_then_release,
    command_line,
    parse_prepare,
    place_runner,
    write_then_install,
)
from .client import BlaxelClient
from .files import url_path
from .process import Terminal
from .terminal import TerminalOptions, text_to_bytes

# The bound on each short exec of the delivery (the prepare, the install), in the
# server's whole seconds.
SCRIPT_TIMEOUT_S = 60
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
    `path` (`write_then_install`). The server makes the file's missing parents (the
    runner's folder, the first time) and takes an absolute path as it is (`files`)."""
    what = "put the runner into the sandbox"
    instance = client.sandbox()

    async def write(temporary: str, data: bytes) -> None:
        await client.call(what, lambda: instance.fs.write_binary(url_path(temporary), data))

    async def run(argv: list[str]) -> tuple[int, str, str]:
        code, stdout, stderr = await _run(client, argv, what)
        return code, stdout.decode("utf-8", "replace"), stderr

    await write_then_install(binary, path, write, run)


class BlaxelRunner(LinkedRunner[TerminalLink[Terminal]]):
    """The session's connection to the runner in its sandbox (`LinkedRunner`; a
    process's folder is the one the session gives it)."""

    @classmethod
    async def start(
        cls,
        blaxel: BlaxelClient,
        spawn: Callable[[LinkSink[Terminal]], Awaitable[None]],
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
        client = await cls.say_hello(placed, link, where="the Blaxel sandbox")
        return cls(client, link, placed.env)


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
    return await BlaxelRunner.start(blaxel, spawn, required=bool(option))


async def close_stdin(handle: object) -> None:
    """End a process's open stdin: only the runner's processes have one
    (`RunnerProcess.close_stdin`); any other handle is `UnsupportedOperationError`."""
    if not isinstance(handle, RunnerProcess):
        raise UnsupportedOperationError(NO_OPEN_STDIN)
    await handle.close_stdin()


async def shut_down(runner: BlaxelRunner | None, release: Callable[[], Awaitable[None]]) -> None:
    """Close the runner's link (the runner lives on in a kept sandbox; a deleted one
    ends it), then `release` the sandbox whatever became of the link."""
    await close_then_release(runner, release)
