"""The runner inside a pod (docs/runner.md): put there once, checked by content, reached
by an exec.

One control exec (`PREPARE_SCRIPT`) says where the runner goes (the session's
`runner_dir`, else `$SANDBOX_RUNNER_DIR`, else the container's `$TMPDIR`, else /tmp: a
container's /tmp is its own, so two pods never share a runner), the workspace as the
exec finds it (`pwd -P`: the runner's processes start there), the sha256 of the file at
the runner's content-named path when there is one (`sha256sum`), and the exec's own
environment (`/proc/$$/environ`: the container's, which every process starts from, as
an exec's would; the runner spawns with exactly the environment it is given). When the
digest is not ours (no file, another build, a file someone changed), a second exec
(`UPLOAD_SCRIPT`) takes the binary's bytes as stdin DATA (never keystrokes: no
terminal), writes them to a private temporary file, hashes it back where `sha256sum`
exists, and renames it over the path (a rename also replaces a running impostor's file).

The link is one exec of `PATH connect --start --socket SOCK` (the binary itself, no
shell): it starts the runner once (its own session in the container, so it outlives the
exec and this client) and bridges its stdin/stdout to the runner's unix socket. The
exec's stdout channel feeds an `asyncio.StreamReader`; `ExecLinkWriter` writes to its
stdin channel with what `RunnerClient` calls on a writer. `PodRunner` is the session's
end: it starts one-shot commands and processes through the runner.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import posixpath
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass

from ...backend import CommandSpec, ExecCapture, OneShotProcess, OutputSink
from ...errors import ProviderError, UnsupportedOperationError
from ...runner import (
    LinkWriter,
    RunnerBinary,
    RunnerClient,
    runner_binary,
    unavailable_reason,
)
from ..toolkit import (
    FALLBACK_ERRORS,
    MAX_SOCKET_PATH,
    MAX_STDERR_BYTES,
    RUNNER_OFF,
    RunnerProcess,
    checked_digest,
    checked_folder,
    fallen_back,
    hello_through,
    packaged_bytes,
    process_environment,
    runner_name,
    sandbox_environment,
    spawn_through_runner,
    start_one_shot,
)
from . import bounds, scripts
from .channels import ExecStream
from .client import V5_PROTOCOL, KubeClient
from .execs import DEFAULT_TERM, Target, run_control

UPLOAD_CHUNK_BYTES = 256 * 1024

logger = logging.getLogger("sandbox.kubernetes")

# `sh -c PREPARE_SCRIPT sandbox-runner-prepare DIR NAME` (DIR "" for the default):
# DIR NUL PWD NUL DIGEST-or-"-" NUL, then the exec's environment (NUL-separated).
PREPARE_SCRIPT = (
    'd=${1:-${SANDBOX_RUNNER_DIR:-${TMPDIR:-/tmp}}}; f="$d/$2"; h=-; '
    'if [ -f "$f" ] && [ ! -L "$f" ]; then '
    'h=$(sha256sum -- "$f" 2>/dev/null) && h=${h%% *} || h=-; fi; '
    'printf "%s\\0%s\\0%s\\0" "$d" "$(pwd -P)" "$h"; cat /proc/$$/environ 2>/dev/null; exit 0'
)
# `sh -c UPLOAD_SCRIPT sandbox-runner-upload PATH SIZE`: SIZE is "-" to copy stdin to its
# end (v5 closes stdin), else the byte count `head -c` copies (v4 cannot close it).
# Prints the sha256 of what it wrote where `sha256sum` exists.
UPLOAD_SCRIPT = (
    'f=$1; n=$2; t="$f.$$.tmp"; umask 077; mkdir -p -- "${f%/*}" || exit 1; '
    'if [ "$n" = - ]; then cat > "$t"; else head -c "$n" > "$t"; fi '
    '|| { rm -f -- "$t"; exit 1; }; '
    'h=$(sha256sum -- "$t" 2>/dev/null) && printf "%s" "${h%% *}"; '
    'chmod 755 "$t" && mv -f -- "$t" "$f" || { rm -f -- "$t"; exit 1; }'
)


@dataclass(frozen=True)
class PodPlace:
    """What the prepare exec found: the runner's folder, the workspace as an exec sees
    it, the digest at the runner's path (None: nothing of ours there), the container's
    environment."""

    folder: str
    workdir: str
    digest: str | None
    env: dict[str, str]


def parse_prepare(output: bytes) -> PodPlace:
    """The prepare exec's stdout, checked (bounded by the control exec already)."""
    parts = output.split(b"\0")
    if len(parts) < 4:
        raise ProviderError("the pod's answer about the runner's folder was cut short")
    folder = checked_folder(parts[0], "runner folder for the runner", "the pod")
    workdir = checked_folder(parts[1], "workspace for the runner", "the pod")
    # The last piece is what followed the final NUL: cut short, or empty.
    env = sandbox_environment(parts[3:-1])
    digest = checked_digest(parts[2])
    return PodPlace(posixpath.normpath(folder), posixpath.normpath(workdir), digest, env)


async def prepare(
    client: KubeClient, target: Target, binary: RunnerBinary, runner_dir: str | None
) -> PodPlace:
    """Run the prepare exec in the workspace."""
    stdout = bytearray()

    def keep(data: bytes) -> bool:
        stdout.extend(data[: bounds.MAX_CONTROL_OUTPUT_BYTES - len(stdout)])
        return True

    argv = [
        "sh",
        "-c",
        PREPARE_SCRIPT,
        "sandbox-runner-prepare",
        runner_dir or "",
        runner_name(binary),
    ]
    code, errors = await run_control(
        client,
        target,
        scripts.prelude_argv(argv, cwd=target.cwd),
        "find the runner's folder in the pod",
        on_stdout=keep,
    )
    if code != 0:
        said = errors.decode("utf-8", "replace").strip()[:300]
        raise ProviderError(f"could not find the runner's folder in the pod (exit {code}): {said}")
    return parse_prepare(bytes(stdout))


async def _chunks(data: bytes) -> AsyncIterator[bytes]:
    for start in range(0, len(data), UPLOAD_CHUNK_BYTES):
        yield data[start : start + UPLOAD_CHUNK_BYTES]


async def upload(client: KubeClient, target: Target, binary: RunnerBinary, path: str) -> None:
    """Write the runner's bytes to `path` through an exec's stdin (data, not a terminal),
    then check the digest the pod computed of what it received."""
    data = await packaged_bytes(binary)
    size = "-" if client.agreed == V5_PROTOCOL else str(len(data))
    said = bytearray()

    def keep(chunk: bytes) -> bool:
        said.extend(chunk[: 256 - len(said)])
        return True

    argv = ["sh", "-c", UPLOAD_SCRIPT, "sandbox-runner-upload", path, size]
    code, errors = await run_control(
        client, target, argv, "put the runner into the pod", stdin=_chunks(data), on_stdout=keep
    )
    if code != 0:
        text = errors.decode("utf-8", "replace").strip()[:300]
        raise ProviderError(f"could not put the runner into the pod (exit {code}): {text}")
    digest = bytes(said).decode("ascii", "replace").strip()
    if digest and digest != binary.sha256:
        raise ProviderError(
            "the runner put into the pod reads back as other bytes "
            f"(sha256 {digest[:16]}..., expected {binary.sha256[:16]}...)"
        )


class ExecLinkWriter(LinkWriter):
    """The writer half of the link (`LinkWriter`): the exec's stdin channel; its close
    closes the exec's socket (the bridge exits; the runner stays)."""

    def __init__(self, stream: ExecStream, reader: asyncio.StreamReader) -> None:
        super().__init__()
        self._stream = stream
        self._reader = reader

    async def _send(self, data: bytes) -> None:
        try:
            await self._stream.write(data)
        except ProviderError as exc:  # ConnectionLostError among them
            raise ConnectionResetError(str(exc)) from None

    def _ended(self) -> bool:
        return self._stream.ended

    async def _end(self) -> None:
        try:
            await self._stream.close()
        finally:
            if not self._reader.at_eof():
                self._reader.feed_eof()


class RunnerLink:
    """One connection to the runner through an exec: `reader` gives the runner's bytes,
    `writer` takes ours."""

    def __init__(self) -> None:
        self.reader = asyncio.StreamReader(limit=2**20)
        self._stderr = bytearray()
        self.stream: ExecStream | None = None
        self.writer: ExecLinkWriter | None = None

    @property
    def stderr(self) -> str:
        """What the bridge printed on stderr (bounded), for an error message."""
        return bytes(self._stderr).decode("utf-8", "replace")

    def _on_stderr(self, data: bytes) -> None:
        room = MAX_STDERR_BYTES - len(self._stderr)
        if room > 0:
            self._stderr += data[:room]

    def _on_end(self, outcome: int | BaseException) -> None:
        if not self.reader.at_eof():
            self.reader.feed_eof()

    async def open(self, client: KubeClient, target: Target, path: str, sock: str) -> None:
        """Start the bridge exec (stdin open, no terminal)."""
        ws = await client.exec_socket(
            target.namespace,
            target.pod,
            target.container,
            [path, "connect", "--start", "--socket", sock],
            stdin=True,
            tty=False,
            what="connect to the runner",
        )
        self.stream = ExecStream(
            ws,
            what="connect to the runner",
            on_stdout=self.reader.feed_data,
            on_stderr=self._on_stderr,
            on_end=self._on_end,
        )
        self.writer = ExecLinkWriter(self.stream, self.reader)

    async def aclose(self) -> None:
        """Drop the connection (the runner and its processes go on)."""
        if self.writer is not None:
            self.writer.close()
            await self.writer.wait_closed()
        elif self.stream is not None:
            await self.stream.close()


class PodRunner:
    """The session's connection to the runner in its pod: the client, the exec that
    carries it, where processes start, and the environment they start with."""

    def __init__(self, client: RunnerClient, link: RunnerLink, place: PodPlace) -> None:
        self.client = client
        self.link = link
        self.workdir = place.workdir
        self.base_env = place.env

    @classmethod
    async def start(
        cls, kube: KubeClient, target: Target, runner_dir: str | None, env: Mapping[str, str]
    ) -> PodRunner:
        """Deliver the runner (unless the same bytes are there), start it or find it
        running, and connect; `UnsupportedOperationError` when this install has none."""
        binary = runner_binary()
        if binary is None:
            raise UnsupportedOperationError(
                f"runner=True, but {unavailable_reason() or 'the runner is not built'}"
            )
        return await cls.start_with(binary, kube, target, runner_dir, env)

    @classmethod
    async def start_with(
        cls,
        binary: RunnerBinary,
        kube: KubeClient,
        target: Target,
        runner_dir: str | None,
        env: Mapping[str, str],
    ) -> PodRunner:
        """`start` with this binary (found already)."""
        place = await prepare(kube, target, binary, runner_dir)
        path = f"{place.folder}/{runner_name(binary)}"
        sock = f"{path}.sock"
        if len(sock.encode()) > MAX_SOCKET_PATH:
            raise UnsupportedOperationError(
                f"the runner's socket path in the pod would be longer than a unix socket's "
                f"({sock[:60]}...): pass a shorter runner_dir="
            )
        if place.digest != binary.sha256:
            await upload(kube, target, binary, path)
        link = RunnerLink()
        try:
            async with asyncio.timeout(bounds.EXEC_CONNECT_TIMEOUT_S):
                await link.open(kube, target, path, sock)
        except BaseException:
            with contextlib.suppress(Exception):
                await asyncio.shield(link.aclose())
            raise
        client = await hello_through(
            link.reader,
            link.writer,
            stderr=lambda: link.stderr,
            close=link.aclose,
            where="the pod",
        )
        runner = cls(client, link, place)
        runner.base_env.update(env)
        return runner

    def environment(
        self, extra: Mapping[str, str] | None, *, tty: bool, term: str
    ) -> dict[str, str]:
        """The whole environment of one process: the container's, the session's, the
        command's, and TERM for a terminal."""
        return process_environment(self.base_env, extra, tty=tty, term=term)

    def cwd(self, cwd: str | None, session_workdir: str) -> str:
        """Where a process starts: the workspace as the exec found it, a relative `cwd`
        under it, an absolute one inside the session's workdir mapped there too."""
        if cwd is None:
            return self.workdir
        cwd = posixpath.normpath(cwd)
        if cwd.startswith("/"):
            if cwd == session_workdir:
                return self.workdir
            if cwd.startswith(session_workdir.rstrip("/") + "/"):
                return posixpath.join(self.workdir, cwd[len(session_workdir) :].lstrip("/"))
            return cwd
        return posixpath.normpath(posixpath.join(self.workdir, cwd))

    async def start_command(
        self, spec: CommandSpec, capture: ExecCapture, session_workdir: str
    ) -> OneShotProcess:
        """A one-shot command of the runner, stdout and stderr apart, straight into
        `capture` (`cwd` and `session_workdir` as `cwd` maps them)."""
        return await start_one_shot(
            self.client,
            spec,
            capture,
            env=self.environment(spec.env, tty=False, term=DEFAULT_TERM),
            cwd=self.cwd(spec.cwd, session_workdir),
        )

    async def spawn(
        self, entry: OutputSink[RunnerProcess], session_workdir: str, *, grace_s: float
    ) -> None:
        """Start `entry.spec` as a process of the runner feeding the entry (`grace_s`:
        SIGTERM to SIGKILL when it is killed)."""
        spec = entry.spec
        await spawn_through_runner(
            self.client,
            entry,
            env=self.environment(spec.command.env, tty=spec.tty, term=DEFAULT_TERM),
            cwd=self.cwd(spec.command.cwd, session_workdir),
            grace_s=grace_s,
        )

    async def aclose(self) -> None:
        """Close the connection (the runner and any process it keeps live on)."""
        try:
            await self.client.aclose()
        finally:
            await self.link.aclose()


async def choose_runner(
    kube: KubeClient,
    target: Target,
    runner_dir: str | None,
    env: Mapping[str, str],
    asked: bool | None,
) -> tuple[PodRunner | None, str | None]:
    """The session's runner as its `runner` option asks, and why it has none (None while
    it has one): False, none; True, the runner or the error saying why not; None (auto),
    the runner where this install has one and the pod takes it, else none, with the
    reason (a failed delivery or start is logged as a warning too: the install has the
    runner, so the per-exec path is a surprise there)."""
    if asked is False:
        return None, RUNNER_OFF
    if asked:
        return await PodRunner.start(kube, target, runner_dir, env), None
    binary = runner_binary()
    if binary is None:
        return None, unavailable_reason() or "runner: not built"
    try:
        runner = await PodRunner.start_with(binary, kube, target, runner_dir, env)
    except FALLBACK_ERRORS as exc:
        return None, fallen_back("kubernetes", "pod", exc)
    return runner, None
