"""The runner inside a Daytona sandbox (docs/runner.md): put there once through the files
API, checked by content, reached by a session command whose text input and logs carry
the protocol as base64 lines (`connect --text`).

Why text: the SDK hands a session command's logs over as text (each stream decoded as
UTF-8 with errors="replace", `daytona.common.process` demultiplexing) and its input
(`send_session_command_input`) takes a `str`, so the protocol's binary frames cannot
ride either; base64 lines are ASCII and arrive whole (`sandbox.runner.text_link`).

One `process.exec` (`RUNNER_PREPARE_SCRIPT`, toolkit `runner_delivery`) says where the
runner goes (`$SANDBOX_RUNNER_DIR`, else `$TMPDIR`, else /tmp), the sandbox's machine
(`uname -m`), the sha256 of the file at each packaged runner's content-named path, and
the sandbox's environment (`/proc/$$/environ` of the daemon's shell: every process
through the runner starts from it). When the digest for the sandbox's machine is not
ours, `fs.upload_file` puts the bytes at a private temporary name and one exec
(`RUNNER_INSTALL_SCRIPT`) checks their size and sha256, makes them executable and
renames them over the path.

The link is one session (`process.create_session`) running one command with
`run_async=True`: `exec PATH connect --text --start --socket PATH.sock`. It starts the
runner once (`serve --detach`: its own session, so it outlives the command, the daemon
session and this client) and bridges to its socket; `get_session_command_logs_async`
streams its stdout into the decoder, `send_session_command_input` takes our lines (one
send at a time: they must arrive in order). A daemon session's command never sees EOF
on its stdin, so the link ends by deleting its session (which kills the bridge); the
runner and its processes live on. `DaytonaRunner` is the session's end of it: the
client, the link and the environment every process starts with; `connect` and
`shut_down` are what the session's start and stop do with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import shlex

from daytona import DaytonaError, SessionExecuteRequest

from ...backend import cancel_and_wait
from ...errors import ProviderError
from ...runner import RunnerBinary, TextLink
from ..toolkit import (
    RUNNER_INSTALL_SCRIPT,
    RUNNER_PREPARE_SCRIPT,
    LinkedRunner,
    SandboxPlace,
    StderrTail,
    check_runner_installed,
    close_then_release,
    packaged_bytes,
    parse_prepare,
    place_runner,
)
from .client import DaytonaClient

# How long ending the link (deleting its session) may take before it is given up.
CLOSE_WAIT_S = 5.0


async def _exec(client: DaytonaClient, argv: list[str], what: str) -> tuple[int, str]:
    """One short `process.exec` of `argv`: its exit code and output (stdout and stderr
    together: the daemon combines them)."""
    response = await client.call(what, client.process.exec(shlex.join(argv)))
    return int(response.exit_code or 0), response.result or ""


async def prepare(client: DaytonaClient, names: list[str]) -> SandboxPlace:
    """Run the prepare script: the folder, the machine, the digests, the environment."""
    what = "find the runner's folder in the sandbox"
    argv = ["sh", "-c", RUNNER_PREPARE_SCRIPT, "sandbox-runner-prepare", *names]
    code, output = await _exec(client, argv, what)
    if code != 0:
        detail = client.options.api_key.redact(output)[:300]
        raise ProviderError(f"could not {what} (exit {code}): {detail}")
    # Text from the SDK: a variable that was not UTF-8 reads as U+FFFD; the rest is
    # exactly what the sandbox printed (the script sends nothing to stderr).
    return parse_prepare(output.encode("utf-8", "surrogateescape"), names)


async def upload(client: DaytonaClient, binary: RunnerBinary, path: str) -> None:
    """`fs.upload_file` of the runner's bytes to a private temporary name, then
    `RUNNER_INSTALL_SCRIPT`: checked by size and sha256, made executable, renamed over
    `path`."""
    data = await packaged_bytes(binary)
    temporary = f"{path}.{secrets.token_hex(6)}.tmp"
    what = "put the runner into the sandbox"
    await client.call(what, client.fs.upload_file(data, temporary))
    argv = [
        "sh",
        "-c",
        RUNNER_INSTALL_SCRIPT,
        "sandbox-runner-install",
        temporary,
        path,
        binary.sha256,
        str(len(data)),
    ]
    code, output = await _exec(client, argv, what)
    # stdout and stderr come back together: the digest (64 hex digits, no newline) leads
    # when the script got as far as printing it; what follows is an error's text.
    head = output[:64]
    digest = head if len(head) == 64 and all(c in "0123456789abcdef" for c in head) else ""
    check_runner_installed(binary, code, digest, output[len(digest) :])


class DaytonaLink:
    """The session command that carries the link: its `TextLink` (reader and writer), the
    daemon session it runs in, and the task streaming its logs into the decoder."""

    def __init__(self, client: DaytonaClient) -> None:
        self.client = client
        self.session_id = client.new_id("runner")
        self.cmd_id: str | None = None
        self.text = TextLink(self._send, self._end_input, close_wait_s=CLOSE_WAIT_S)
        self._session_made = False
        self.stderr = StderrTail()
        self._logs: asyncio.Task[None] | None = None

    def said(self) -> str:
        """What explains a link that never came up: its error, or the command's stderr."""
        return self.text.error or self.stderr.text

    async def _send(self, text: str) -> None:
        client = self.client
        assert self.cmd_id is not None
        await client.call(
            "write to the runner's link",
            client.process.send_session_command_input(self.session_id, self.cmd_id, text),
        )

    async def _end_input(self) -> None:
        """No EOF reaches a session command's stdin: deleting the session ends the bridge
        (the runner is detached and stays)."""
        if not self._session_made:
            return
        self._session_made = False
        client = self.client
        with contextlib.suppress(DaytonaError, TimeoutError):
            async with asyncio.timeout(CLOSE_WAIT_S):
                await client.process.delete_session(self.session_id)

    async def start(self, path: str, sock: str) -> None:
        """Create the session, start the bridge in it and stream its logs."""
        client = self.client
        self._session_made = True
        await client.call("connect to the runner", client.process.create_session(self.session_id))
        line = f"exec {shlex.join([path, 'connect', '--text', '--start', '--socket', sock])}"
        response = await client.call(
            "connect to the runner",
            client.process.execute_session_command(
                self.session_id, SessionExecuteRequest(command=line, run_async=True)
            ),
        )
        self.cmd_id = str(response.cmd_id)
        self._logs = asyncio.ensure_future(self._follow())

    async def _follow(self) -> None:
        """The log stream's end (however it came) is the end of the runner's stream."""
        client = self.client
        try:
            await client.process.get_session_command_logs_async(
                self.session_id, self.cmd_id, self.text.feed_text, self.stderr.keep
            )
        except Exception as exc:  # a cut stream: the link is over
            said = self.stderr.text.strip()[-300:] or client.describe(exc)
            self.text.error = said
        finally:
            self.text.feed_eof()

    async def close(self) -> None:
        """End the link (its session deleted, bounded), then stop the log reader. The
        runner and its processes go on."""
        try:
            self.text.writer.close()
            await self.text.writer.wait_closed()
            await self._end_input()  # also when the writer never sent anything
            logs = self._logs
            if logs is not None and not logs.done():
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(CLOSE_WAIT_S):
                        await asyncio.shield(logs)
        finally:
            if self._logs is not None:
                await cancel_and_wait([self._logs])
            if not self.text.ended:
                self.text.feed_eof()


class DaytonaRunner(LinkedRunner[DaytonaLink]):
    """The session's connection to the runner in its sandbox (`LinkedRunner`; a
    process's folder is the command's own, the daemon's workdir applied by the
    session)."""

    @classmethod
    async def start(cls, daytona: DaytonaClient, *, required: bool) -> DaytonaRunner | None:
        """Deliver the runner (unless the same bytes are there), start it or find it
        running, and connect. Where this install has no runner for the sandbox's
        machine: `UnsupportedOperationError` when `required`, else None (the session
        keeps the daemon's own processes)."""
        placed = await place_runner(
            lambda names: prepare(daytona, names),
            lambda binary, path: upload(daytona, binary, path),
            required=required,
        )
        if placed is None:
            return None
        link = DaytonaLink(daytona)
        client = await cls.say_hello(placed, link, where="the sandbox")
        return cls(client, link, placed.env)


async def connect(daytona: DaytonaClient, wanted: bool | None) -> DaytonaRunner | None:
    """The session's runner as its `runner` option asks: none for False; for None, none
    where this install has no runner for the sandbox's machine (the daemon's processes
    stay); for True, that is `UnsupportedOperationError` (`DaytonaRunner.start`)."""
    if wanted is False:
        return None
    return await DaytonaRunner.start(daytona, required=bool(wanted))


async def shut_down(runner: DaytonaRunner | None, daytona: DaytonaClient) -> None:
    """Close the runner's link (the runner lives on in a kept sandbox; a deleted one
    ends it), then stop the client: the sandbox deleted unless kept, every call bounded.
    Whatever became of the link, the sandbox is released."""
    await close_then_release(runner, daytona.stop)
