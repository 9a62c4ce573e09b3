"""The runner inside an E2B sandbox (docs/runner.md): put there once through the files
API, checked by content, reached by a background command whose text stdin and stdout
carry the protocol as base64 lines (`connect --text`).

Why text: the SDK decodes a command's stdout as UTF-8 with errors="replace"
(e2b/sandbox_async/commands/command_handle.py, `_iterate_events`), so the protocol's
binary frames cannot ride it; base64 lines are ASCII and arrive whole
(`sandbox.runner.text_link`).

One command (`RUNNER_PREPARE_SCRIPT`, toolkit `runner_delivery`) says where the runner
goes (`$SANDBOX_RUNNER_DIR`, else `$TMPDIR`, else /tmp: a sandbox's /tmp is its own),
the sandbox's machine (`uname -m`), the sha256 of the file at each packaged runner's
content-named path, and the sandbox's environment (`/proc/$$/environ` of envd's shell:
every process through the runner starts from it). When the digest for the sandbox's
machine is not ours, `files.write` puts the bytes at a private temporary name and one
command (`RUNNER_INSTALL_SCRIPT`) checks their size and sha256, makes them executable
and renames them over the path.

The link is one background command, `exec PATH connect --text --start --socket
PATH.sock` with `stdin=True`: it starts the runner once (`serve --detach`: its own
session, so it outlives the command and this client) and bridges to its socket; its
stdout callback feeds the decoder, `commands.send_stdin` takes our lines (one send at a
time: they must arrive in order), `commands.close_stdin` ends the bridge (the runner
stays). `E2BRunner` is the session's end of it: the client, the link, the environment
and the home every process starts with. The session starts it with `connect` (its
`runner` option decides) and stops it with `shut_down`, which releases the sandbox
after the link whatever became of the link.
"""

from __future__ import annotations

import asyncio
import contextlib
import shlex
from collections.abc import Awaitable, Callable
from typing import Any

from e2b import CommandExitException

from ...backend import cancel_and_wait
from ...errors import ProviderError
from ...runner import RunnerBinary, TextLink
from ..toolkit import (
    RUNNER_PREPARE_SCRIPT,
    LinkedRunner,
    SandboxPlace,
    StderrTail,
    close_then_release,
    parse_prepare,
    place_runner,
    write_then_install,
)
from . import files
from .client import E2BClient

# After the link's stdin was closed, how long its bridge has to end before it is killed.
CLOSE_WAIT_S = 5.0


async def _run(client: E2BClient, argv: list[str], what: str) -> tuple[int, str, str]:
    """One short foreground command (no stdin): its exit code, stdout and stderr."""
    line = shlex.join(argv)
    try:
        result = await client.bounded(
            client.sandbox.commands.run(line, timeout=client.start_timeout, **client.request()),
            client.start_timeout,
        )
    except CommandExitException as exc:
        return int(exc.exit_code), exc.stdout or "", exc.stderr or ""
    except TimeoutError:
        raise client.errors.no_answer(what, client.start_timeout) from None
    except Exception as exc:
        client.errors.fail(exc, what)
    return int(result.exit_code), result.stdout or "", result.stderr or ""


async def prepare(client: E2BClient, names: list[str]) -> SandboxPlace:
    """Run the prepare script: the folder, the machine, the digests, the environment."""
    what = "find the runner's folder in the sandbox"
    argv = ["sh", "-c", RUNNER_PREPARE_SCRIPT, "sandbox-runner-prepare", *names]
    code, stdout, stderr = await _run(client, argv, what)
    if code != 0:
        raise ProviderError(f"could not {what} (exit {code}): {stderr.strip()[:300]}")
    # Text from the SDK: a variable that was not UTF-8 reads as U+FFFD (see the module
    # docstring of `processes`); the rest is exactly what the sandbox printed.
    return parse_prepare(stdout.encode("utf-8", "surrogateescape"), names)


async def upload(client: E2BClient, binary: RunnerBinary, path: str) -> None:
    """`files.write` of the runner's bytes to a private temporary name, then
    `RUNNER_INSTALL_SCRIPT`: checked by size and sha256, made executable, renamed over
    `path` (`write_then_install`)."""
    what = "put the runner into the sandbox"

    async def write(temporary: str, data: bytes) -> None:
        try:
            await client.timed(
                client.sandbox.files.write(temporary, data, **client.request()), what
            )
        except ProviderError:
            raise
        except Exception as exc:
            client.errors.fail(exc, what)

    await write_then_install(binary, path, write, lambda argv: _run(client, argv, what))


class E2BLink:
    """The background command that carries the link: its `TextLink` (reader and
    writer), the SDK handle, and a task that ends the reader when the command ends."""

    def __init__(self, client: E2BClient) -> None:
        self.client = client
        self.pid: int | None = None
        self.handle: Any = None
        self.text = TextLink(self._send, self._close_input, close_wait_s=CLOSE_WAIT_S)
        self.stderr = StderrTail()
        self._watcher: asyncio.Task[None] | None = None

    def said(self) -> str:
        """What explains a link that never came up: its error, or the bridge's stderr."""
        return self.text.error or self.stderr.text

    async def _send(self, text: str) -> None:
        client = self.client
        assert self.pid is not None
        await client.timed(
            client.sandbox.commands.send_stdin(self.pid, text, **client.request()),
            "write to the runner's link",
        )

    async def _close_input(self) -> None:
        if self.pid is not None and not self.text.ended:
            client = self.client
            await client.bounded(
                client.sandbox.commands.close_stdin(self.pid, **client.request()), CLOSE_WAIT_S
            )

    async def start(self, path: str, sock: str) -> None:
        """Start the bridge command (stdin open, output into the decoder)."""
        client = self.client
        line = f"exec {shlex.join([path, 'connect', '--text', '--start', '--socket', sock])}"
        run = client.sandbox.commands.run(
            line,
            background=True,
            stdin=True,
            on_stdout=self.text.feed_text,
            on_stderr=self.stderr.keep,
            timeout=client.process_timeout,
            retain_output=False,
            **client.request(),
        )
        try:
            self.handle = await client.bounded(run, client.start_timeout)
        except TimeoutError:
            raise client.errors.no_answer("connect to the runner", client.start_timeout) from None
        except Exception as exc:
            client.errors.fail(exc, "connect to the runner")
        self.pid = int(self.handle.pid)
        self._watcher = asyncio.ensure_future(self._watch())

    async def _watch(self) -> None:
        """The command's end (however it came) is the end of the runner's stream."""
        try:
            await self.handle.wait()
        except Exception as exc:  # a non-zero exit or a cut stream: the link is over
            if isinstance(exc, CommandExitException) and exc.exit_code not in (0, None):
                said = self.stderr.text.strip()[-300:]
                if said:
                    self.text.error = said
        finally:
            self.text.feed_eof()

    async def close(self) -> None:
        """End the bridge's stdin and wait for its end (bounded); kill it if it lingers;
        then stop the SDK's reader. The runner and its processes go on."""
        self.text.writer.close()
        await self.text.writer.wait_closed()
        watcher = self._watcher
        try:
            if watcher is not None and not watcher.done():
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(CLOSE_WAIT_S):
                        await asyncio.shield(watcher)
                if not watcher.done() and self.pid is not None:
                    client = self.client
                    with contextlib.suppress(Exception):
                        await client.bounded(
                            client.sandbox.commands.kill(self.pid, **client.request()),
                            client.kill_timeout,
                        )
        finally:
            if watcher is not None:
                await cancel_and_wait([watcher])
            if self.handle is not None:
                await self.client.disconnect(self.handle)
            if not self.text.ended:
                self.text.feed_eof()


class E2BRunner(LinkedRunner[E2BLink]):
    """The session's connection to the runner in its sandbox (`LinkedRunner`): processes
    start in the sandbox user's home unless told otherwise, as envd's do."""

    @classmethod
    async def start(cls, e2b: E2BClient, home: str, *, required: bool) -> E2BRunner | None:
        """Deliver the runner (unless the same bytes are there), start it or find it
        running, and connect. Where this install has no runner for the sandbox's
        machine: `UnsupportedOperationError` when `required`, else None (the session
        keeps its own path)."""
        placed = await place_runner(
            lambda names: prepare(e2b, names),
            lambda binary, path: upload(e2b, binary, path),
            required=required,
        )
        if placed is None:
            return None
        link = E2BLink(e2b)
        client = await cls.say_hello(placed, link, where="the sandbox")
        return cls(client, link, placed.env, home)


async def connect(e2b: E2BClient, option: bool | None) -> E2BRunner | None:
    """The session's runner as its `runner` option asks: none for False; else learn the
    sandbox's home and `E2BRunner.start`, `required` for True (`None` keeps envd's
    processes where this install has no runner for the sandbox's machine)."""
    if option is False:
        return None
    await files.in_workspace(e2b, ".")  # learns the home, once
    assert e2b.home is not None
    return await E2BRunner.start(e2b, e2b.home, required=bool(option))


async def shut_down(runner: E2BRunner | None, release: Callable[[], Awaitable[None]]) -> None:
    """Close the runner's link (the runner lives on in a kept sandbox; a killed one ends
    it), then `release` the sandbox whatever became of the link."""
    await close_then_release(runner, release)
