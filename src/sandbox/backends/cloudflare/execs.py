"""One-shot commands: one `exec` request each, its event stream decoded chunk by chunk
straight into the bounded capture, as a `OneShotProcess` (the base session applies the
timeout, cancels and kills).

The bridge gives the command no abort signal and no timeout (execute-handler.ts; see
docs/providers.md, "Cloudflare"): a client that goes away leaves it running, and
`timeout_ms` has no effect on the streaming path, so none is sent. Every command
therefore runs under the toolkit's wrapper with a random tag in its environment, and one
that did not finish (cancelled, timed out, stream cut) is killed by the toolkit's kill
script in a second exec, which finds the tree through /proc.

The wrapper sweeps its own session at exit when it leads one (the stand-in starts each
exec in a session of its own); if an exec is not a session leader the sweep finds
nothing of its own, and the kill script still finds the tree by tag and descent, so no
process of the Worker's is ever hit.
"""

from __future__ import annotations

import asyncio
import logging
import shlex
from typing import Any

import aiohttp

from ...backend import CommandSpec, ExecCapture, cancel_and_wait
from ...errors import ConnectionLostError, ProviderError, SandboxError
from ..toolkit import CommandCheck, kill_script, new_tag, parse_kill_report, wrapper_argv
from .bounds import MAX_ERROR_BODY
from .client import WorkerClient, decode_base64, read_prefix, stream_events
from .errors import exit_status, json_object, status_error, transport_failure, worker_text
from .sse import SseEvent

logger = logging.getLogger("sandbox.cloudflare")

# Bound on the kill of an unfinished command: it runs while its caller is being
# cancelled, so a stuck Worker must not hold the cancel for a whole request timeout.
KILL_TIMEOUT_S = 5.0


def exec_argv(spec: CommandSpec, check: CommandCheck | None) -> list[str]:
    """The command as the Worker runs it (before the wrapper): behind the command check
    that applies `cwd` (and checks the program for `shell=False`), after `env` is set
    (so the program is looked up in the command's PATH)."""
    argv = list(spec.argv) if check is None else check.argv(spec.argv, announce=False)
    if spec.env:
        argv = ["env", *(f"{key}={value}" for key, value in spec.env.items()), *argv]
    return argv


def pty_command(spec: CommandSpec, check: CommandCheck | None) -> str:
    """The shell string typed (through the trap) into the Worker's terminal; with a
    check, it is what prints the trap's start marker (see `ShellTrap.line`)."""
    argv = list(spec.argv) if check is None else check.argv(spec.argv, announce=True)
    if spec.env:
        return shlex.join(["env", *(f"{k}={v}" for k, v in spec.env.items()), *argv])
    return spec.shell_command if check is None else shlex.join(argv)


async def kill_tagged(client: WorkerClient, tag: str) -> None:
    """Kill every process of the tree tagged `tag` at once (a second exec)."""
    try:
        _, out = await client.control(
            kill_script([tag], ticks=0),
            "stop the command",
            limit=min(KILL_TIMEOUT_S, client.request_timeout_s),
        )
    except SandboxError as exc:
        logger.debug("cloudflare: could not kill a command: %s", exc)
        return
    report = parse_kill_report(out.decode("utf-8", "replace"))
    if report != "done":
        logger.debug("cloudflare: the kill script reported %r", report)


class WorkerExec:
    """A `OneShotProcess`: the exec request and its stream run as a task this object
    owns from `start()` on; `wait` awaits it, `kill` cancels it and, unless the exit
    status arrived, kills the tagged tree."""

    def __init__(self, client: WorkerClient, argv: list[str], capture: ExecCapture) -> None:
        self._client = client
        self._tag = new_tag()
        self.body: dict[str, Any] = {"argv": wrapper_argv(self._tag, argv)}
        self._capture = capture
        # Whether the command may be running without us: from the request on, until
        # its exit status arrived (or the Worker refused the request).
        self._maybe_running = False
        self._killed = False
        self._task: asyncio.Task[int] | None = None

    def start(self) -> WorkerExec:
        """Send the request (the command starts on the Worker)."""
        self._maybe_running = True
        self._task = asyncio.create_task(self._run(), name="cloudflare-exec")
        return self

    async def _run(self) -> int:
        http = self._client.session()
        url = self._client.sandbox_url("exec")
        resp: aiohttp.ClientResponse | None = None
        failure: SandboxError | None = None
        code: int | None = None
        reusable = False
        try:
            try:
                # The answer's headers (and an error's body) within the request timeout:
                # a Worker that accepts and never answers must not hang the command. The
                # stream itself has no deadline (a running command may be silent).
                async with asyncio.timeout(self._client.request_timeout_s) as deadline:
                    resp = await http.post(
                        url, headers=self._client.headers(), json=self.body, allow_redirects=False
                    )
                    if resp.status != 200:
                        self._maybe_running = False  # refused: nothing started
                        body = await read_prefix(resp, MAX_ERROR_BODY)
                        failure = status_error(
                            resp.status, "run the command", body, self._client.key
                        )
                    deadline.reschedule(None)
                if failure is None:
                    code = await self._read(resp)
                    self._maybe_running = False
                    reusable = resp.content.at_eof()
            except TimeoutError:
                failure = transport_failure(None, "run the command", timed_out=True)
            except aiohttp.ClientError as exc:
                if resp is not None and resp.status == 200:
                    failure = ConnectionLostError(
                        "the command's output stream broke before its exit status "
                        f"arrived ({type(exc).__name__})"
                    )
                else:
                    failure = transport_failure(exc, "run the command")
        finally:
            if resp is not None:
                if reusable:
                    resp.release()
                else:
                    resp.close()
        if failure is not None:
            raise failure  # outside the except block: the aiohttp error is not chained
        assert code is not None
        return code

    async def _read(self, resp: aiohttp.ClientResponse) -> int:
        async for event in stream_events(resp):
            code = self._event(event)
            if code is not None:
                return code
        raise ConnectionLostError(
            "the command's output stream ended without an exit status (transport error)"
        )

    def _event(self, event: SseEvent) -> int | None:
        if event.event in ("stdout", "stderr"):
            data = decode_base64(event)
            capture = self._capture
            (capture.add_stdout if event.event == "stdout" else capture.add_stderr)(data)
            return None
        if event.event == "exit":
            payload = json_object(event.data)
            raw = payload.get("exit_code", payload.get("exitCode", payload.get("code")))
            code = exit_status(raw)
            if code is None:
                raise ProviderError(
                    "the Worker sent an exit event without an exit code", retryable=False
                )
            return code
        if event.event == "error":
            payload = json_object(event.data)
            message = payload.get("error", payload.get("message", event.data))
            message = worker_text(message, self._client.key)
            raise ProviderError(f"the Worker could not run the command: {message}", retryable=False)
        return None  # keep-alives and events we do not know

    async def wait(self) -> int:
        """The command's exit status (the wrapper's 128+N for a death by signal N), its
        output appended to the capture."""
        assert self._task is not None
        return await self._task

    async def kill(self) -> None:
        """Cancel the request; kill the tagged tree unless its exit status arrived."""
        if self._killed:
            return
        self._killed = True
        task = self._task
        if task is not None:
            # Its failure, if any, is superseded by the kill (consumed and logged).
            await cancel_and_wait([task])
        if self._maybe_running and self._client.http is not None:
            await kill_tagged(self._client, self._tag)

    async def release(self) -> None:
        """Nothing is left once the exit status arrived: the response was released and
        the wrapper swept the command's leftovers."""
        if self._task is not None:
            await asyncio.wait([self._task])
