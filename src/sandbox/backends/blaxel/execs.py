"""One-shot commands: one `process.exec` waiting for completion, as a `OneShotProcess`
(the base session applies the timeout, cancels and kills).

- The command runs under the toolkit's `sh` wrapper (`wrapper_argv`, its tag in the
  exec's environment): the server reports a death by signal as -1 (Go's `ExitCode()`),
  the wrapper exits with 128+N without the shell's "Killed" notice.
- The SDK returns the whole output at once (no stream to read it from as it comes):
  only what is kept of it is bounded.
- The edge in front of the sandbox cuts a request silent for about 60 s with a 504
  while the command keeps running: the process is then followed (`process.wait`) until
  it ends; the base session's deadline still applies.
- The server's own timeout (whole seconds) answers 422 "process timed out" (408 from
  older gateways) and does not kill: that is a timeout of ours, and we kill.
- A kill is the provider's `process.kill` by name; what the command printed by then is
  read back (at most the last 64 KB of each stream) for the `ExecTimeoutError`.

With the runner, `start_on_runner` is the twin: the runner's one-shot, stdout and stderr
apart and byte-exact.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import secrets
from collections.abc import Mapping, Sequence
from typing import Any

from ...backend import CommandSpec, ExecCapture, OneShotProcess
from ...errors import ConnectionLostError, SandboxError
from ...runner import RunnerClient
from ..toolkit import (
    command_line,
    new_tag,
    normalize_exit,
    start_one_shot,
    tag_environment,
    wrapper_argv,
)
from .bounds import answer_limit
from .client import BlaxelClient
from .errors import BlaxelAPIError, is_server_timeout, map_error
from .terminal import append_text, text_to_bytes

# Statuses of a kill that find the process already gone (or never started).
_GONE = frozenset({400, 404, 409})
# Bound on reading back what a killed command printed.
PARTIAL_OUTPUT_TIMEOUT_S = 5.0


def exec_request(argv: Sequence[str], env: dict[str, str] | None, workdir: str) -> dict[str, Any]:
    """The `process.exec` request for `argv`: under the wrapper, tagged, in `workdir`."""
    tag = new_tag()
    return {
        "command": command_line(wrapper_argv(tag, argv, set_tag=False)),
        "name": f"exec-{secrets.token_hex(6)}",
        "working_dir": workdir,
        "wait_for_completion": True,
        "env": {**(env or {}), **tag_environment(tag)},
    }


async def start_on_runner(
    client: RunnerClient,
    spec: CommandSpec,
    capture: ExecCapture,
    env: Mapping[str, str],
    cwd: str,
) -> OneShotProcess:
    """The one-shot of `spec` through the runner `client` reaches, stdout and stderr
    apart and byte-exact, in `cwd` with exactly `env` (`BlaxelRunner.environment`)."""
    return await start_one_shot(client, spec, capture, env=env, cwd=cwd)


class BlaxelOneShot:
    """A `OneShotProcess`: the exec request runs as a task this object owns from
    `start` on; `wait` awaits it, `kill` cancels it and kills the process by name."""

    def __init__(
        self, client: BlaxelClient, request: dict[str, Any], display: str, capture: ExecCapture
    ) -> None:
        self._client = client
        self._request = request
        self.name: str = request["name"]
        self._display = display
        self._capture = capture
        self._what = f"run {display[:80]!r} in the Blaxel sandbox"
        self._killed = False
        self._lost = False
        self._call: asyncio.Task[Any] | None = None

    def start(self) -> BlaxelOneShot:
        """Send the request (the command starts on the server)."""
        self._call = asyncio.create_task(self._run(), name=f"blaxel-{self.name}")
        return self

    async def _run(self) -> Any:
        instance = self._client.sandbox()
        self._client.apply_sdk_config()
        try:
            # No deadline of its own: the command may run long (the base session's
            # timeout applies); its answer is bounded like any other.
            with answer_limit(self._client.max_response_bytes):
                return await instance.process.exec(self._request)
        except Exception as exc:
            error = map_error(exc, self._what, self._client.secrets)
        if isinstance(error, BlaxelAPIError) and error.status == 504:
            # The edge cut a silent request; the command is still running.
            return await self._follow()
        raise error

    async def _follow(self) -> Any:
        """The process's final state and full logs, once it ended (after a 504)."""
        client, name, what = self._client, self.name, self._what
        process = client.sandbox().process
        await client.call(
            what, lambda: process.wait(name, max_wait=-1, interval=1000), timeout=math.inf
        )
        final = await client.call(what, lambda: process.get(name))
        final.stdout = await client.call(what, lambda: process.logs(name, "stdout"))
        final.stderr = await client.call(what, lambda: process.logs(name, "stderr"))
        return final

    async def wait(self) -> int:
        """The command's exit status, its output appended to the capture."""
        assert self._call is not None
        try:
            response = await self._call
        except ConnectionLostError:
            # The connection failed mid-call: the command may be running without us.
            self._lost = True
            raise
        except BlaxelAPIError as error:
            if not is_server_timeout(error):
                raise
            # The server's own timeout left the command running: the base session kills
            # it (reading back what it printed) and reports the timeout.
            raise self._capture.timeout_error(self._display, None) from None
        stdout = response.stdout or ""
        stderr = response.stderr or ""
        if not stdout and not stderr and response.logs:
            stdout = response.logs  # older sandbox APIs only return combined logs
        append_text(self._capture.add_stdout, stdout)
        append_text(self._capture.add_stderr, stderr)
        return normalize_exit(response.exit_code)

    async def kill(self) -> None:
        """Cancel the request, kill the process by name, read back what it printed."""
        if self._killed:
            return
        self._killed = True
        await self.release()
        process = self._client.sandbox().process
        try:
            await self._client.call(
                f"kill the process {self.name!r}",
                lambda: process.kill(self.name),
                timeout=min(self._client.api_timeout_s, 30.0),
            )
        except SandboxError as exc:
            if self._lost:
                return  # the connection was already gone: best effort only
            if not isinstance(exc, BlaxelAPIError) or exc.status not in _GONE:
                raise
        await self._partial_output()

    async def release(self) -> None:
        """Cancel and await the request task (nothing else is held)."""
        call = self._call
        if call is not None and not call.done():
            call.cancel()
        if call is not None:
            await asyncio.wait({call})
            if not call.cancelled():
                call.exception()  # retrieved: it was raised from `wait` already

    async def _partial_output(self) -> None:
        if self._capture.stdout.total or self._capture.stderr.total:
            return
        process = self._client.sandbox().process
        with contextlib.suppress(SandboxError):
            state = await self._client.call(
                f"read the output of {self.name!r}",
                lambda: process.get(self.name),
                timeout=PARTIAL_OUTPUT_TIMEOUT_S,
            )
            self._capture.add_stdout(text_to_bytes(state.stdout or ""))
            self._capture.add_stderr(text_to_bytes(state.stderr or ""))
