"""The runner inside a Modal sandbox (docs/runner.md): put there once, checked by content,
reached by an exec whose stdin and stdout carry the protocol's bytes.

One control exec (`toolkit.RUNNER_PREPARE_SCRIPT`) says where the runner goes
(`$SANDBOX_RUNNER_DIR`, else the sandbox's `$TMPDIR`, else /tmp: a sandbox's /tmp is its
own, so two sandboxes
never share a runner), the sandbox's machine (`uname -m`: the client may be another
architecture, a laptop's arm64, say), the sha256 of the file at each packaged runner's
content-named path (`sha256sum`), and the exec's own environment (`/proc/$$/environ`:
the sandbox's, which every exec starts from; the runner spawns with exactly the
environment it is given). When the digest for the sandbox's machine is not ours (no
file, another build, a file someone changed), a second exec (`UPLOAD_SCRIPT`) takes the
binary's bytes on its stdin (`text=False`, ended by `write_eof`), writes them to a
private temporary file, hashes it back and renames it over the path only when its size
and digest are right (an upload cut short leaves nothing there).

The link is one exec of `PATH connect --start --socket PATH.sock` (the binary itself, no
shell, no terminal, `text=False`): it starts the runner once (`serve --detach`: its own
session in the sandbox, so it outlives the exec and this client) and bridges its
stdin/stdout to the runner's unix socket; the next client's exec finds the same runner.
A task reads the exec's stdout into an `asyncio.StreamReader`; `StdinWriter` writes to
its stdin with what `RunnerClient` calls on a writer. `SandboxRunner` is the session's
end: the client, the link, and the environment every process starts with.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Mapping
from typing import Any

from ...backend import cancel_and_wait
from ...errors import ProviderError
from ...runner import (
    LinkWriter,
    RunnerBinary,
    RunnerClient,
)
from ..toolkit import (
    MAX_STDERR_BYTES,
    RUNNER_PREPARE_SCRIPT,
    SandboxPlace,
    hello_through,
    packaged_bytes,
    parse_prepare,
    place_runner,
    process_environment,
)
from .commands import read_stream
from .errors import SDK_ERRORS, ModalErrors

# What a control exec may print (the environment is the most of it).
MAX_CONTROL_OUTPUT_BYTES = 1024 * 1024
# A control exec (prepare, upload), over the whole exec: start, output, exit.
CONTROL_TIMEOUT_S = 120.0
# After the link's stdin was ended, how long its bridge has to end its stdout (it exits
# at once) before the reader is cancelled.
CLOSE_WAIT_S = 5.0
# The largest piece handed to the SDK's stdin writer before a drain (its buffer takes
# at most 16 MiB).
WRITE_CHUNK = 1024 * 1024

# `sh -c UPLOAD_SCRIPT sandbox-runner-upload PATH SHA256 SIZE`: copies stdin to its end
# into a private temporary file, prints its sha256 (where `sha256sum` exists), and
# renames it over PATH only when it has SIZE bytes and that digest (an upload cut short,
# whose stdin was ended early, leaves nothing at PATH).
UPLOAD_SCRIPT = (
    'f=$1; t="$f.$$.tmp"; umask 077; mkdir -p -- "${f%/*}" || exit 1; '
    'cat > "$t" || { rm -f -- "$t"; exit 1; }; '
    'n=$(($(wc -c < "$t"))); if [ "$n" -ne "$3" ]; then rm -f -- "$t"; '
    'echo "received $n of $3 bytes" >&2; exit 1; fi; '
    'if h=$(sha256sum -- "$t" 2>/dev/null); then h=${h%% *}; printf "%s" "$h"; '
    'if [ "$h" != "$2" ]; then rm -f -- "$t"; exit 1; fi; fi; '
    'chmod 755 "$t" && mv -f -- "$t" "$f" || { rm -f -- "$t"; exit 1; }'
)


async def _control(
    sandbox: Any,
    errors: ModalErrors,
    argv: list[str],
    what: str,
    *,
    env: Mapping[str, str],
    stdin: bytes | None = None,
) -> tuple[int, bytes, bytes]:
    """One control exec (no terminal, binary streams): its stdin given (else ended at
    once), its exit code and its bounded stdout and stderr."""
    stdout = bytearray()
    stderr = bytearray()

    def keep(into: bytearray) -> Any:
        return lambda data: into.extend(data[: MAX_CONTROL_OUTPUT_BYTES - len(into)])

    process: Any = None
    try:
        async with asyncio.timeout(CONTROL_TIMEOUT_S):
            process = await sandbox.exec.aio(*argv, text=False, env=dict(env))
            try:
                for start in range(0, len(stdin or b""), WRITE_CHUNK):
                    assert stdin is not None
                    process.stdin.write(stdin[start : start + WRITE_CHUNK])
                    await process.stdin.drain.aio()
            finally:
                # Also when cut short: an upload's `cat` must not wait for more forever
                # (its partial file is a temporary one, never renamed into place).
                process.stdin.write_eof()
                await asyncio.shield(_drain_quietly(process))
            readers = [
                asyncio.ensure_future(read_stream(process.stdout, keep(stdout))),
                asyncio.ensure_future(read_stream(process.stderr, keep(stderr))),
            ]
            try:
                await asyncio.gather(*readers)
            finally:
                # One reader failed (or this was cancelled): the other stops too.
                await cancel_and_wait(readers)
            code = await process.wait.aio()
    except TimeoutError:
        raise ProviderError(
            f"could not {what}: the exec did not finish within {CONTROL_TIMEOUT_S:g}s",
            retryable=True,
        ) from None
    except SDK_ERRORS as exc:
        raise errors.map(what, exc) from None
    return int(code), bytes(stdout), bytes(stderr)


async def _drain_quietly(process: Any) -> None:
    """Send what the stdin writer holds (the EOF among it), bounded; a failure here is
    the link's end, reported by what reads it."""
    with contextlib.suppress(*SDK_ERRORS, TimeoutError):
        async with asyncio.timeout(CLOSE_WAIT_S):
            await process.stdin.drain.aio()


async def prepare(
    sandbox: Any, errors: ModalErrors, names: list[str], env: Mapping[str, str]
) -> SandboxPlace:
    """Run the prepare exec (with the session's `env`, as every command)."""
    argv = ["sh", "-c", RUNNER_PREPARE_SCRIPT, "sandbox-runner-prepare", *names]
    what = "find the runner's folder in the sandbox"
    code, stdout, stderr = await _control(sandbox, errors, argv, what, env=env)
    if code != 0:
        said = stderr.decode("utf-8", "replace").strip()[:300]
        raise ProviderError(f"could not {what} (exit {code}): {said}", retryable=False)
    return parse_prepare(stdout, names)


async def upload(
    sandbox: Any, errors: ModalErrors, binary: RunnerBinary, path: str, env: Mapping[str, str]
) -> None:
    """Write the runner's bytes to `path` through an exec's stdin, then check the digest
    the sandbox computed of what it received."""
    data = await packaged_bytes(binary)
    argv = ["sh", "-c", UPLOAD_SCRIPT, "sandbox-runner-upload", path, binary.sha256]
    argv.append(str(len(data)))
    what = "put the runner into the sandbox"
    code, stdout, stderr = await _control(sandbox, errors, argv, what, env=env, stdin=data)
    digest = stdout.decode("ascii", "replace").strip()
    if digest and digest != binary.sha256:
        raise ProviderError(
            "the runner put into the sandbox reads back as other bytes "
            f"(sha256 {digest[:16]}..., expected {binary.sha256[:16]}...)"
        )
    if code != 0:
        said = stderr.decode("utf-8", "replace").strip()[:300]
        raise ProviderError(f"could not {what} (exit {code}): {said}", retryable=False)


class StdinWriter(LinkWriter):
    """The writer half of the link (`LinkWriter`): the exec's stdin, one drain at a time
    (the SDK's writer keeps one buffer and one stream offset); its close ends that stdin
    (the bridge exits; the runner stays)."""

    max_chunk = WRITE_CHUNK

    def __init__(self, link: SandboxLink) -> None:
        super().__init__()
        self._link = link

    async def _send(self, data: bytes) -> None:
        stdin = self._link.process.stdin
        try:
            stdin.write(data)
            await stdin.drain.aio()
        except SDK_ERRORS as exc:  # OSError, ValueError (closed) among them
            raise ConnectionResetError(
                f"writing to the runner's exec failed: {type(exc).__name__}"
            ) from None

    def _ended(self) -> bool:
        return self._link.ended

    async def _end(self) -> None:
        await self._link.end()


class SandboxLink:
    """One connection to the runner through an exec: `reader` gives the runner's bytes
    (the exec's stdout, read by a task), `writer` takes ours (its stdin)."""

    def __init__(self, process: Any) -> None:
        self.process = process
        self.reader = asyncio.StreamReader(limit=2**20)
        self.writer = StdinWriter(self)
        self._stderr = bytearray()
        self._ending: asyncio.Future[None] | None = None
        self._readers = [
            asyncio.ensure_future(self._pump(process.stdout, self.reader.feed_data, True)),
            asyncio.ensure_future(self._pump(process.stderr, self._keep_stderr, False)),
        ]

    @property
    def ended(self) -> bool:
        """True once the exec's stdout ended (the bridge exited, or reading it failed)."""
        return self._readers[0].done()

    @property
    def stderr(self) -> str:
        """What the bridge printed on stderr (bounded), for an error message."""
        return bytes(self._stderr).decode("utf-8", "replace")

    def _keep_stderr(self, data: bytes) -> None:
        room = MAX_STDERR_BYTES - len(self._stderr)
        if room > 0:
            self._stderr += data[:room]

    async def _pump(self, stream: Any, sink: Callable[[bytes], object], output: bool) -> None:
        try:
            await read_stream(stream, sink)
        except SDK_ERRORS:
            pass  # a broken stream ends the link like a closed one: the client is lost
        finally:
            if output and not self.reader.at_eof():
                self.reader.feed_eof()

    async def end(self) -> None:
        """End the exec's stdin (EOF: the bridge exits, the runner and its processes go
        on), let its output end, and stop the readers. Once, whoever asks first (the
        writer's close, the runner's `aclose`); a cancelled caller leaves it going."""
        if self._ending is None:
            self._ending = asyncio.ensure_future(self._end())
        await asyncio.shield(self._ending)

    async def _end(self) -> None:
        try:
            if not self.ended:
                stdin = self.process.stdin
                with contextlib.suppress(*SDK_ERRORS, TimeoutError):
                    async with asyncio.timeout(CLOSE_WAIT_S):
                        stdin.write_eof()
                        await stdin.drain.aio()
                        await asyncio.wait(self._readers)
        finally:
            for task in self._readers:
                task.cancel()
            await asyncio.gather(*self._readers, return_exceptions=True)
            if not self.reader.at_eof():
                self.reader.feed_eof()


async def open_link(sandbox: Any, errors: ModalErrors, path: str, sock: str) -> SandboxLink:
    """Start the bridge exec (stdin open, no terminal, binary streams) and read it."""
    process = await errors.call(
        "connect to the runner",
        sandbox.exec.aio,
        path,
        "connect",
        "--start",
        "--socket",
        sock,
        text=False,
    )
    return SandboxLink(process)


class SandboxRunner:
    """The session's connection to the runner in its sandbox: the client, the exec that
    carries it, and the environment every process starts with (`term`: the TERM of a
    terminal, the session's option)."""

    def __init__(
        self, client: RunnerClient, link: SandboxLink, base_env: dict[str, str], term: str
    ) -> None:
        self.client = client
        self.link = link
        self.base_env = base_env
        self.term = term

    @classmethod
    async def start(
        cls,
        sandbox: Any,
        errors: ModalErrors,
        env: Mapping[str, str],
        term: str,
        *,
        wanted: bool | None,
    ) -> SandboxRunner | None:
        """The runner the session's `runner` option asks for (`wanted`): None for False.
        Else deliver the runner (unless the same bytes are there), start it or find it
        running, and connect. Where this install has no runner for the sandbox's
        machine: `UnsupportedOperationError` for True, else None (`runner=None`: the
        session keeps its per-exec path)."""
        if wanted is False:
            return None
        required = wanted is True
        placed = await place_runner(
            lambda names: prepare(sandbox, errors, names, env),
            lambda binary, path: upload(sandbox, errors, binary, path, env),
            required=required,
        )
        if placed is None:
            return None
        link = await open_link(sandbox, errors, placed.path, placed.sock)
        client = await hello_through(
            link.reader,
            link.writer,
            stderr=lambda: link.stderr,
            close=link.end,
            where="the sandbox",
        )
        return cls(client, link, {**placed.env, **env}, term)

    def environment(self, extra: Mapping[str, str] | None, *, tty: bool) -> dict[str, str]:
        """The whole environment of one process: the sandbox's, the session's, the
        command's, and TERM (`term`) for a terminal."""
        return process_environment(self.base_env, extra, tty=tty, term=self.term)

    async def aclose(self) -> None:
        """Close the connection (the runner and any process it keeps live on)."""
        try:
            await self.client.aclose()
        finally:
            # Through the writer: its close waits for a drain in flight first.
            self.link.writer.close()
            await self.link.writer.wait_closed()
