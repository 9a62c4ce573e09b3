"""The `docker` backend: commands and PTYs in a Docker container, via the docker SDK.

A session either creates a fresh container from an `image` (removed on close) or attaches
to a running `container` (left running on close). Every process is an exec; its hijacked
socket is read by the event loop (no thread per process), its exit comes from the
container's event stream, and its tree is killed by a second exec (Docker has no
kill-exec call). The parts live in `sandbox.backends.docker_support`.

The image needs a POSIX `sh`, `grep` and `kill` (busybox is enough); `stty` sets the
initial terminal size of tty processes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import posixpath
import secrets
import tempfile
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

from .. import arguments
from ..command_check import CommandCheck, wait_for_verdict
from ..errors import (
    ConnectionLostError,
    FileTooLargeError,
    InvalidArgumentError,
    NotAFileError,
    ProcessExitedError,
    ProviderError,
    SandboxFileNotFoundError,
)
from ..exec_output import ExecCapture
from ..process_entry import EXIT_DRAIN_GRACE_S, CommandSpec, PtyEntry
from ..session import BaseSandboxSession
from ..settle import settle
from ..shell_trap import ShellTrap
from ..types import ExecResult
from .docker_support.archive import (
    MODE_DIR,
    MODE_NOT_REGULAR,
    MODE_SYMLINK,
    iter_first_file,
    read_first_file,
    stat_path,
    tar_one_file,
    tar_spooled_file,
)
from .docker_support.engine import DEFAULT_API_TIMEOUT_S, Engine
from .docker_support.errors import is_not_found
from .docker_support.execs import DockerExec, ExecOptions, KillBatcher
from .docker_support.stream import StreamClosedError

logger = logging.getLogger("sandbox.docker")

DEFAULT_TERM = "xterm-256color"
DEFAULT_KEEPALIVE = ("sleep", "2147483647")
# Docker always has detach keys on a tty exec (a lone first key is held back until the
# next keystroke): use a sequence nobody types by accident.
DEFAULT_DETACH_KEYS = "ctrl-^,ctrl-@,ctrl-^,ctrl-@"
LABEL_BACKEND = "sandbox.backend"
LABEL_SESSION = "sandbox.session"
READ_CHUNK = 1024 * 1024
TEARDOWN_CONCURRENCY = 64
MAX_SYMLINK_HOPS = 16
EVENT_SYNC_TIMEOUT_S = 5.0
# After an exit, how long a stream held open by a background child may take to close
# once that child was killed (the engine itself gives up after about 2 s).
EOF_AFTER_KILL_S = 3.0

# Run once at start as the session's user: make the working directory, and learn the
# uid/gid that files written through the archive endpoint should belong to.
PROBE_SCRIPT = (
    'if [ -n "$1" ]; then mkdir -p -- "$1" || exit 3; fi; '
    "u=$(id -u 2>/dev/null) || u=-; g=$(id -g 2>/dev/null) || g=-; "
    'echo "sandbox-probe:$u:$g"'
)


class DockerSession(BaseSandboxSession):
    """Runs commands in a Docker container.

    Exactly one of:
    - `image`: create and start a fresh container from this local image (removed on
      close unless `keep_container=True`); `pull=True` pulls it when missing;
    - `container`: attach to this running container (name or id), left running.

    Options: `workdir` (default: the image's working directory, created if missing),
    `user`, `env` (added to every command), `terminate_grace_s` (SIGTERM to SIGKILL,
    default 1 s). For created containers only: `memory` (bytes or "512m"), `cpus`
    (float), `pids_limit`, `network_mode` (default: the engine's default; "none" cuts
    the network) or `network` (bool), `volumes` (the SDK's `binds` format: host paths
    are mounted only when asked), `privileged` (default False), `init` (a tiny init
    reaps orphans, default True), `keepalive_command`, `labels`, `name_prefix`.
    Engine: `base_url` (default: DOCKER_HOST / the local socket), `api_version`,
    `api_timeout`, or a ready `client` (a `docker.APIClient`, not closed here).
    Plus the base session's options.
    """

    backend_name = "docker"

    def __init__(
        self,
        *,
        image: str | None = None,
        container: str | None = None,
        workdir: str | None = None,
        user: str | None = None,
        env: Mapping[str, str] | None = None,
        memory: int | str | None = None,
        cpus: float | None = None,
        pids_limit: int | None = None,
        network_mode: str | None = None,
        network: bool | None = None,
        volumes: Mapping[str, Any] | Sequence[str] | None = None,
        privileged: bool = False,
        init: bool = True,
        pull: bool = False,
        keepalive_command: Sequence[str] = DEFAULT_KEEPALIVE,
        labels: Mapping[str, str] | None = None,
        name_prefix: str = "sandbox",
        keep_container: bool = False,
        base_url: str | None = None,
        api_version: str | None = None,
        api_timeout: float = DEFAULT_API_TIMEOUT_S,
        client: Any = None,
        terminate_grace_s: float = 1.0,
        detach_keys: str = DEFAULT_DETACH_KEYS,
        **options: Any,
    ) -> None:
        # Kills that happen together are merged into one exec (see KillBatcher), so a
        # terminate-all tears every process down at once instead of 8 at a time.
        options.setdefault("teardown_concurrency", TEARDOWN_CONCURRENCY)
        super().__init__(**options)
        if (image is None) == (container is None):
            raise InvalidArgumentError(
                "the docker backend needs exactly one of image= (start a fresh container) "
                "or container= (attach to a running one)"
            )
        for label, value in (("image", image), ("container", container)):
            if value is not None and (not isinstance(value, str) or not value.strip()):
                raise InvalidArgumentError(f"{label} must be a non-empty str")
        if workdir is not None and (not isinstance(workdir, str) or not workdir.startswith("/")):
            raise InvalidArgumentError("workdir must be an absolute path in the container")
        if cpus is not None and (
            isinstance(cpus, bool) or not isinstance(cpus, int | float) or not 0 < cpus < math.inf
        ):
            raise InvalidArgumentError(f"cpus must be a positive number, got {cpus!r}")
        if pids_limit is not None and (
            isinstance(pids_limit, bool) or not isinstance(pids_limit, int) or pids_limit < 1
        ):
            raise InvalidArgumentError(f"pids_limit must be a positive int, got {pids_limit!r}")
        if not keepalive_command or not all(isinstance(a, str) for a in keepalive_command):
            raise InvalidArgumentError("keepalive_command must be a non-empty list of str")
        grace = arguments.check_seconds("terminate_grace_s", terminate_grace_s, allow_zero=True)
        timeout = arguments.check_seconds("api_timeout", api_timeout)
        for name, text in (
            ("user", user or None),  # "" is the image's user, as None
            ("network_mode", network_mode),
            ("base_url", base_url),
            ("api_version", api_version),
            ("detach_keys", detach_keys),
            ("name_prefix", name_prefix),
        ):
            arguments.check_str(name, text)
        env = arguments.check_env(env)
        labels = arguments.check_env(labels, name="labels")
        if memory is not None and (
            isinstance(memory, bool) or not isinstance(memory, int | str) or not memory
        ):
            raise InvalidArgumentError(
                f"memory must be bytes (int) or a str like '512m', got {memory!r}"
            )
        if network_mode is None and network is not None:
            network_mode = None if network else "none"
        self.image = image
        self.container_name = container
        assert grace is not None and timeout is not None
        self.terminate_grace_s = grace
        self._workdir_option = workdir
        self._user = user or ""
        self._env = dict(env or {})
        self._memory = memory
        self._cpus = cpus
        self._pids_limit = pids_limit
        self._network_mode = network_mode
        self._volumes = volumes
        self._privileged = bool(privileged)
        self._init = bool(init)
        self._pull = bool(pull)
        self._keepalive = list(keepalive_command)
        self._labels = dict(labels or {})
        self._name_prefix = name_prefix
        self._keep_container = bool(keep_container)
        self._base_url = base_url
        self._api_version = api_version
        self._api_timeout = timeout
        self._client = client
        self._detach_keys = detach_keys
        self._engine: Engine | None = None
        self._created_name: str | None = None
        self._container_id: str | None = None
        self._workdir = "/"
        self._file_owner = (0, 0)
        self._exec_options: ExecOptions | None = None
        self._killer: KillBatcher | None = None

    @property
    def container_id(self) -> str | None:
        """The id of the session's container (after start)."""
        return self._container_id

    @property
    def workdir(self) -> str:
        """The working directory of commands (after start)."""
        return self._workdir

    # ---- lifecycle -----------------------------------------------------------------

    async def _start_backend(self) -> None:
        """Connect, create or find the container, watch its events, probe it."""
        self._created_name = None
        self._killer = None
        self._engine = engine = Engine(
            base_url=self._base_url,
            api_version=self._api_version,
            api_timeout=self._api_timeout,
            client=self._client,
        )
        await engine.connect()
        if self.image is not None:
            info = await self._create_container(engine, self.image)
        else:
            assert self.container_name is not None
            info = await engine.call(
                f"find the container {self.container_name!r}",
                engine.api.inspect_container,
                self.container_name,
            )
        state = info.get("State") or {}
        if not state.get("Running"):
            raise ProviderError(
                f"the container {info.get('Name', '').lstrip('/') or self.container_name!r} "
                f"is not running (status {state.get('Status', 'unknown')})",
                retryable=False,
            )
        self._container_id = str(info["Id"])
        config = info.get("Config") or {}
        self._workdir = self._workdir_option or config.get("WorkingDir") or "/"
        self._exec_options = ExecOptions(
            container_id=self._container_id,
            user=self._user,
            env=self._env,
            workdir=self._workdir,
            detach_keys=self._detach_keys,
        )
        self._killer = KillBatcher(engine, self._exec_options)
        await engine.watch(self._container_id)
        await self._probe(engine)

    async def _create_container(self, engine: Engine, image: str) -> dict[str, Any]:
        api = engine.api
        name = f"{self._name_prefix}-{secrets.token_hex(6)}"
        labels = {**self._labels, LABEL_BACKEND: "docker", LABEL_SESSION: name}
        host_config = api.create_host_config(
            init=self._init or None,
            network_mode=self._network_mode,
            mem_limit=self._memory,
            nano_cpus=int(self._cpus * 1e9) if self._cpus else None,
            pids_limit=self._pids_limit,
            privileged=self._privileged,
            binds=self._volumes,
        )

        def create() -> Any:
            return api.create_container(
                image,
                command=self._keepalive[1:],
                entrypoint=self._keepalive[:1],
                name=name,
                labels=labels,
                host_config=host_config,
                working_dir=self._workdir_option,
                user=self._user or None,
                detach=True,
                stdin_open=False,
                tty=False,
            )

        # From here on the container may exist even if this call is cancelled or fails:
        # `_stop_backend` removes it by name.
        self._created_name = name
        try:
            await engine.call(f"create a container from {image!r}", create)
        except ProviderError as exc:
            if not (self._pull and is_not_found(exc)):
                raise
            logger.info("pulling %s", image)
            await engine.call(f"pull {image!r}", api.pull, image)
            await engine.call(f"create a container from {image!r}", create)
        await engine.call("start the container", api.start, name)
        info: dict[str, Any] = await engine.call(
            "inspect the container", api.inspect_container, name
        )
        return info

    async def _probe(self, engine: Engine) -> None:
        """One exec as the session's user: proves the event subscription is live (its
        `exec_create` event must arrive), checks that the image has a shell, creates the
        working directory and learns the uid/gid for written files."""
        assert self._exec_options is not None
        output = bytearray()
        probe = DockerExec(
            engine,
            self._exec_options,
            ["sh", "-c", PROBE_SCRIPT, "sandbox-probe", self._workdir],
            tty=False,
            wrap=False,
            cwd="/",
            on_output=lambda stream, data: output.extend(data),
        )
        try:
            async with asyncio.timeout(self._api_timeout):
                await probe.start()
                assert self._container_id is not None and probe.exec_id is not None
                if not await engine.sync_events(
                    self._container_id, probe.exec_id, EVENT_SYNC_TIMEOUT_S
                ):
                    logger.warning("the Docker event stream is silent; exits are detected late")
                await probe.wait_eof()
                await probe.wait_ended()
        except TimeoutError:
            raise ProviderError(
                "the Docker engine did not run the session's first command in time",
                retryable=True,
            ) from None
        finally:
            await settle(probe.terminate(0))
        text = output.decode("utf-8", "replace")
        if probe.lost_reason is not None:
            raise ProviderError(
                f"the session's first command was lost: {probe.lost_reason}",
                retryable=engine.gone_reason is None,
            )
        if probe.exit_code != 0 or "sandbox-probe:" not in text:
            raise ProviderError(
                f"the container cannot run commands for this session (exit "
                f"{probe.exit_code}): {text.strip()[-300:] or 'no output'}; the docker "
                "backend needs a POSIX sh in the image, and a working directory it can "
                "create",
                retryable=False,
            )
        uid, _, gid = text.rsplit("sandbox-probe:", 1)[1].strip().partition(":")
        if uid.isdigit() and gid.isdigit():
            self._file_owner = (int(uid), int(gid))

    async def _stop_backend(self) -> None:
        """Wait for calls in flight, remove a created container (by name, so one whose
        creation was cancelled goes too), close the engine connection."""
        engine = self._engine
        if engine is None:
            return
        try:
            if self._killer is not None:
                await self._killer.settle()
            await engine.settle_calls()
            engine.stop_events()
            if self._created_name is not None and not self._keep_container:
                try:
                    await engine.call(
                        "remove the container",
                        engine.api.remove_container,
                        self._created_name,
                        force=True,
                        v=True,
                    )
                except ProviderError as exc:
                    if not is_not_found(exc):
                        raise
        finally:
            await engine.close()

    # ---- helpers -----------------------------------------------------------------------

    def _require_engine(self) -> tuple[Engine, ExecOptions]:
        assert self._engine is not None and self._exec_options is not None
        return self._engine, self._exec_options

    def _new_exec(self, argv: Sequence[str], *, tty: bool, **kwargs: Any) -> DockerExec:
        engine, options = self._require_engine()
        return DockerExec(engine, options, argv, tty=tty, killer=self._killer, **kwargs)

    def _cwd(self, cwd: str | None) -> str | None:
        if cwd is None:
            return None
        return posixpath.normpath(posixpath.join(self._workdir, cwd))

    def _path(self, path: str) -> str:
        full = posixpath.normpath(posixpath.join(self._workdir, path))
        return "/" + full.lstrip("/")

    def _environment(self, spec: CommandSpec, *, tty: bool) -> dict[str, str]:
        env = dict(spec.env or {})
        if tty and "TERM" not in env and "TERM" not in self._env:
            env["TERM"] = DEFAULT_TERM
        return env

    # ---- commands ----------------------------------------------------------------------

    async def _exec(
        self, spec: CommandSpec, timeout: float | None, capture: ExecCapture
    ) -> ExecResult:
        """One exec on pipes, stdout and stderr kept apart (each chunk straight into the
        bounded capture); on timeout or cancellation its whole tree is killed through
        the kill script. A `cwd` or `shell=False` runs behind the command check."""
        engine, _ = self._require_engine()
        argv, cwd, capture.check = self._checked(spec, announce=False)

        def collect(stream: int, data: bytes) -> None:
            # Stream 3 (an engine error) is kept with stderr, where the user looks.
            (capture.add_stdout if stream == 1 else capture.add_stderr)(data)

        proc = self._new_exec(
            argv,
            tty=False,
            env=self._environment(spec, tty=False),
            cwd=cwd,
            on_output=collect,
        )
        try:
            async with asyncio.timeout(timeout):
                await proc.start()
                await proc.wait_ended()
            if not proc.eof and proc.lost_reason is None:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(EXIT_DRAIN_GRACE_S):
                        await proc.wait_eof()
            if not proc.eof and proc.lost_reason is None:
                # A background child holds the output open: kill the rest of the tree,
                # then collect what the engine still had.
                await settle(proc.kill_tree(0))
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(EOF_AFTER_KILL_S):
                        await proc.wait_eof()
            proc.drain_now()
        except TimeoutError:
            await settle(proc.terminate(0))
            raise capture.timeout_error(spec.display, timeout) from None
        except BaseException:
            await settle(proc.terminate(0))
            raise
        await settle(proc.terminate(0))
        if proc.lost_reason is not None:
            raise ConnectionLostError(
                f"the command did not finish: {proc.lost_reason}",
                retryable=engine.gone_reason is None,
            )
        assert proc.exit_code is not None
        return capture.result(proc.exit_code)

    def _checked(
        self, spec: CommandSpec, *, announce: bool
    ) -> tuple[Sequence[str], str | None, CommandCheck | None]:
        """The argv and working directory of the exec, and the command check they run
        (None when there is no `cwd` and a shell runs the command). With a check the
        exec starts in the session's directory and the check changes to `cwd`: the
        engine would otherwise fail the exec itself (exit 126/127, its error as output).
        """
        check = CommandCheck.needed(spec, cwd=self._cwd(spec.cwd))
        if check is None:
            return spec.argv, self._cwd(spec.cwd), None
        return check.argv(spec.argv, announce=announce), None, check

    async def _spawn_process(self, entry: PtyEntry) -> None:
        """Start an attached exec whose socket feeds the entry (no thread); with a
        command check, wait for its verdict."""
        spec = entry.spec
        argv, cwd, check = self._checked(spec.command, announce=True)
        trap = None if check is None else ShellTrap(report_exit=False, token=check.token)

        def on_output(stream: int, data: bytes) -> None:
            # The check's markers come on stdout (the terminal, for a tty): the trap strips
            # them. Stderr never carries them: it goes straight through.
            if trap is not None and stream == 1:
                data = trap.feed(data)
            entry.feed(data)

        proc = self._new_exec(
            argv,
            tty=spec.tty,
            env=self._environment(spec.command, tty=spec.tty),
            cwd=cwd,
            rows=spec.rows,
            cols=spec.cols,
            on_output=on_output,
            on_eof=entry.report_eof,
            on_exit=entry.report_exit,
            on_lost=entry.report_lost,
        )
        entry.handle = proc
        await proc.start()
        if trap is not None and check is not None:
            await wait_for_verdict(entry, trap, check)

    async def _write_stdin(self, entry: PtyEntry, data: bytes) -> None:
        """Send keystrokes over the exec's socket."""
        proc: DockerExec = entry.handle
        try:
            await proc.write(data)
        except StreamClosedError as exc:
            if proc.ended or proc.eof:
                raise ProcessExitedError(
                    f"process {entry.process_id} has exited; poll it with empty chars to "
                    "collect its remaining output and exit code"
                ) from None
            raise ConnectionLostError(
                f"lost the connection to process {entry.process_id}: {exc}"
            ) from None

    async def _resize(self, entry: PtyEntry, rows: int, cols: int) -> None:
        """`exec_resize` (the initial size was set by the wrapper with stty)."""
        proc: DockerExec = entry.handle
        await proc.resize(rows, cols)

    async def _interrupt(self, entry: PtyEntry) -> None:
        """Ctrl-C: `\\x03` on a terminal, else SIGINT to the command's process group."""
        proc: DockerExec = entry.handle
        if entry.tty:
            await self._write_stdin(entry, b"\x03")
        else:
            await proc.interrupt()

    async def _terminate_pty_entry(self, entry: PtyEntry) -> None:
        """Kill the tree (grace, then SIGKILL), close the socket."""
        proc: DockerExec | None = entry.handle
        if proc is not None:
            await proc.terminate(self.terminate_grace_s)

    async def _final_drain(self, entry: PtyEntry) -> None:
        """Read what already arrived at the socket."""
        proc: DockerExec | None = entry.handle
        if proc is not None:
            proc.drain_now()
        await asyncio.sleep(0)

    # ---- files -------------------------------------------------------------------------

    async def _read_file(self, path: str, max_bytes: int) -> bytes:
        """Stream the file out of the archive endpoint (symlinks followed); what is not a
        regular file, or is above `max_bytes`, is refused by its stat before fetching."""
        engine, options = self._require_engine()
        full = self._path(path)
        api = engine.api

        def read() -> bytes:
            target, size = _locate(api, options.container_id, full, path, write=False)
            if size is not None and size > max_bytes:
                raise FileTooLargeError.over(path, size, max_bytes)
            chunks = _fetch(api, options.container_id, target, path)
            try:
                return read_first_file(chunks, path, max_bytes)
            finally:
                chunks.close()

        return await engine.call(f"read {path!r}", read)

    async def _read_file_chunks(self, path: str, chunk_size: int) -> AsyncIterator[bytes]:
        """The archive stream's payload as it arrives, one pool call per chunk."""
        engine, options = self._require_engine()
        full = self._path(path)
        api = engine.api

        def start() -> tuple[Any, Iterator[bytes]]:
            target, _ = _locate(api, options.container_id, full, path, write=False)
            chunks = _fetch(api, options.container_id, target, path)
            return chunks, iter_first_file(chunks, path, chunk_size)

        chunks, pieces = await engine.call(f"read {path!r}", start)
        call: asyncio.Future[bytes | None] | None = None
        try:
            while True:
                call = engine.submit(f"read {path!r}", next, pieces, None)
                await asyncio.wait({call})  # a cancelled caller leaves the call to finish
                piece = call.result()
                call = None
                if piece is None:
                    return
                yield piece
        finally:
            # A generator cannot be closed while a pool thread runs it.
            if call is None or call.done():
                _close_stream(chunks, pieces)
            else:
                call.add_done_callback(lambda _: _close_stream(chunks, pieces))

    async def _write_file(self, path: str, data: bytes) -> None:
        """Stream a one-file tar in, owned by the session's user."""
        await self._put_file(
            path, lambda name, uid, gid: tar_one_file(name, data, uid=uid, gid=gid)
        )

    async def _write_file_chunks(self, path: str, chunks: AsyncIterator[bytes]) -> None:
        """Spool the chunks to a temporary file (the tar header needs the size), then
        stream the tar from it: the file is never held in memory."""
        spool = await asyncio.to_thread(tempfile.TemporaryFile)
        size = 0
        try:
            async for chunk in chunks:
                await asyncio.to_thread(spool.write, chunk)
                size += len(chunk)
            await self._put_file(
                path, lambda name, uid, gid: tar_spooled_file(name, spool, size, uid=uid, gid=gid)
            )
        except asyncio.CancelledError:
            raise  # a pool call may still use the spool: it closes once nothing holds it
        except BaseException:
            spool.close()
            raise
        spool.close()

    async def _put_file(
        self, path: str, make_tar: Callable[[str, int, int], Iterable[bytes | memoryview]]
    ) -> None:
        """Put a one-file tar at `path` after checking what is there: the archive
        endpoint would replace a directory (and all it holds), a FIFO or a device with
        the file. A final symlink is followed (bounded). A missing parent directory is
        created (as the session's user) and the write retried. A process in the
        container that swaps the path between the check and the put can still have it
        replaced: only its own container is at stake."""
        engine, options = self._require_engine()
        full = self._path(path)
        if path.endswith("/") or full == "/":
            raise NotAFileError(f"cannot write {path!r}: it names a folder, not a file")
        api = engine.api
        container_id = options.container_id
        target, _ = await engine.call(
            f"write {path!r}", _locate, api, container_id, full, path, write=True
        )
        directory, name = posixpath.split(target)
        uid, gid = self._file_owner

        async def put() -> None:
            await engine.call(
                f"write {path!r}",
                api.put_archive,
                container_id,
                directory,
                make_tar(name, uid, gid),
            )

        async def explain(exc: ProviderError) -> None:
            """A file on the way is the caller's mistake, not the provider's."""
            blocker = await engine.call(
                f"write {path!r}", _file_on_the_way, api, container_id, target
            )
            if blocker is not None:
                raise NotAFileError(
                    f"cannot write {path!r}: a parent on its path is not a folder"
                ) from None
            raise exc

        try:
            await put()
            return
        except ProviderError as exc:
            if engine.gone_reason is not None:
                raise
            if not is_not_found(exc):
                await explain(exc)
        # The parent directory is missing: create it as the session's user, then retry.
        made = await self._exec(
            CommandSpec(
                argv=("mkdir", "-p", "--", directory),
                shell_command="",
                display=f"mkdir -p {directory}",
                shell=False,
            ),
            None,
            ExecCapture(64 * 1024),
        )
        if made.exit_code != 0:
            await explain(
                ProviderError(
                    f"could not create the directory of {path!r}: "
                    f"{made.stderr.decode('utf-8', 'replace').strip()[-300:]}",
                    retryable=False,
                )
            )
        await put()


# ---- files: blocking helpers run on the engine's pool ----------------------------------


def _locate(
    api: Any, container_id: str, full: str, path: str, *, write: bool
) -> tuple[str, int | None]:
    """Follow symlinks from `full` by the engine's stat: the path of the regular file
    there and its size, or (for a write) where a new file goes and None. A directory,
    FIFO, socket or device raises `NotAFileError`; for a read, nothing there raises
    `SandboxFileNotFoundError`."""
    current = full
    for _ in range(MAX_SYMLINK_HOPS):
        try:
            stat = stat_path(api, container_id, current)
        except ProviderError:
            if _file_on_the_way(api, container_id, current) is None:
                raise
            if write:
                raise NotAFileError(
                    f"cannot write {path!r}: a parent on its path is not a folder"
                ) from None
            raise SandboxFileNotFoundError(
                f"no such file in the container: {path!r} (a parent on its path is not a folder)"
            ) from None
        if stat is None:
            if write:
                return current, None
            raise SandboxFileNotFoundError(f"no such file in the container: {path!r}")
        mode = int(stat.get("mode", 0))
        if mode & MODE_SYMLINK and stat.get("linkTarget"):
            current = str(stat["linkTarget"])
            continue
        _check_regular(mode, path)
        return current, int(stat.get("size", 0))
    raise NotAFileError(f"{path!r}: too many levels of symbolic links")


def _check_regular(mode: int, path: str) -> None:
    if mode & MODE_DIR:
        raise NotAFileError(f"{path!r} is a directory, not a regular file")
    if mode & MODE_NOT_REGULAR:
        raise NotAFileError(f"{path!r} is not a regular file")


def _fetch(api: Any, container_id: str, target: str, path: str) -> Any:
    """The archive stream of the regular file at `target` (checked again: it may have
    changed since `_locate`)."""
    try:
        chunks, stat = api.get_archive(container_id, target, chunk_size=READ_CHUNK)
    except Exception as exc:
        if is_not_found(exc):
            raise SandboxFileNotFoundError(f"no such file in the container: {path!r}") from None
        raise
    try:
        _check_regular(int((stat or {}).get("mode", 0)), path)
    except BaseException:
        chunks.close()
        raise
    return chunks


def _file_on_the_way(api: Any, container_id: str, full: str) -> str | None:
    """The nearest existing ancestor of `full` when it is not a directory (what makes a
    write under it fail), else None."""
    current = posixpath.dirname(full)
    while current not in ("/", ""):
        try:
            stat = stat_path(api, container_id, current)
        except ProviderError:
            stat = None  # itself under a file: look further up
        if stat is not None:
            mode = int(stat.get("mode", 0))
            return None if mode & (MODE_DIR | MODE_SYMLINK) else current
        current = posixpath.dirname(current)
    return None


def _close_stream(chunks: Any, pieces: Iterator[bytes]) -> None:
    close = getattr(pieces, "close", None)
    if close is not None:
        close()
    chunks.close()
