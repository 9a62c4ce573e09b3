"""A fake of the part of the `modal` SDK the `modal` backend uses, run by real processes.

`FakeModal()` stands in for the `modal` module: it has `Sandbox`, `App`, `Client` and
`Image` classes with the same names, parameters and `.aio` call shape as the SDK's
(`Sandbox.create.aio(...)`, `sandbox.exec.aio(...)`, `process.wait.aio()`,
`process.stdin.drain.aio()`, ...). Hand it to the backend as its `sdk` option::

    fake = FakeModal()
    async with sandbox.open_session(
        "modal", sdk=fake, token_id="x", token_secret="y",
        workdir=str(tmp_path / "ws"), state_dir=str(tmp_path / "state"),
    ) as session:
        ...
    await fake.aclose()  # terminates whatever a test left

Every command runs as a REAL local process (`sandbox.local.process.LocalProcess`), on a
real terminal when `pty=True`, so terminal behaviour, signals and exit codes are real,
not scripted. The fake sandbox's file system is this machine's: give the session a
temporary `workdir` and `state_dir`. Errors are the SDK's own exception classes (`modal.exception`).

Only the surface the backend uses is faked, and `tests/backends/test_modal.py` checks it
against the installed SDK with `sandbox.testing.drift.surface_problems`, so an SDK
upgrade that changes that surface fails the test suite instead of the fake drifting.
The plain blocking forms (`Sandbox.create(...)` without `.aio`) raise `TypeError`.

Fault knobs, for tests (thin wrappers over `fake.faults`, a
`sandbox.testing.faults.FaultPlan`): `fake.fail(op, exc)` makes the next call of `op` raise `exc`
(an SDK exception); `fake.block(op)` returns a `Gate` whose `reached` event is set when a
call of `op` arrives, and which holds that call until `gate.release()` (never releasing
it is "a call that never returns"; with `then_raise=exc` the released call
raises). The ops and where they are checked:

- `client` (`Client.from_credentials`), `app_lookup` (`App.lookup`);
- `create` before the sandbox exists, `create_response` after it exists (the provider
  created it but the answer was lost), `from_id`, `from_name`, `terminate`;
- `exec` before the process starts, `exec_response` after it started;
- `write` (`stdin.drain`), `wait` (`process.wait`), `read` (before each chunk of
  stdout/stderr is delivered: a reader that dies);
- `read_file`, `write_file`, `stat` (`filesystem.read_bytes` / `write_bytes` / `stat`).

A `when=` predicate receives the argv of the process concerned (the path for
`read_file`/`write_file`/`stat`, an empty tuple for other sandbox-level calls) and restricts a
fault to matching calls. `fake.calls` records every call as `(op, argv)`; each process
records its `exec` options in `exec_options`.

Exceptions, as the SDK (1.6.4) raises them in each situation the fake models:
`Client.from_credentials` with an empty token: `modal.exception.AuthError`; a closed
client or a detached sandbox: `ClientClosed`; `App.lookup` of a missing app without
`create_if_missing`: `NotFoundError`; `Sandbox.create` with a name in use:
`AlreadyExistsError`, without an app or with a relative `workdir`: `InvalidError`;
`Sandbox.from_id` / `from_name` of an unknown sandbox: `NotFoundError`; `exec` with
non-string arguments or a relative `workdir`: `InvalidError`; `exec`, a stdin write or a
file call in a terminated sandbox: `ConflictError`; `filesystem.*` with a relative path:
`InvalidError`, a missing path: `SandboxFilesystemNotFoundError`, a directory:
`SandboxFilesystemIsADirectoryError`, a file as a parent:
`SandboxFilesystemNotADirectoryError`; a lost connection: whatever a fault knob arms.

With `pty=True` the fake, like the SDK (`modal._output.pty.get_pty_info`), gives the
process the client's `TERM` (from `os.environ`) unless `env` names one.

A pipe process's stdin is a real pipe, as Modal's: `drain()` writes what `write()`
buffered, and after `write_eof()` the process reads end-of-file (a `write()` then raises
`ValueError("Stdin is closed. Cannot write to it.")`, the SDK's words).

The runner (docs/runner.md) runs in a fake sandbox as in a real one: delivered by an
exec with stdin, started detached by `connect --start`, reached again by the next
client's exec. A real sandbox's /tmp is its own; here /tmp is this machine's, shared by
every fake sandbox, so each sandbox's processes see `SANDBOX_RUNNER_DIR`, a short
folder name of its own (made by whoever puts a runner there, removed when the sandbox
is terminated) where the backend puts its runner, as the kubernetes stand-in does per
pod.

Known differences from the real service: a finished process
keeps its local fds until the sandbox is terminated; the sandbox lifetime `timeout` is
not enforced; every process sees `SANDBOX_RUNNER_DIR` (above).
"""

from __future__ import annotations

import asyncio
import codecs
import collections
import contextlib
import copy
import functools
import inspect
import os
import secrets
import shutil
import signal
import stat as stat_module
import tempfile
from collections.abc import AsyncGenerator, Callable, Iterator, Mapping
from typing import Any, ClassVar, Literal, TypeVar, overload

from modal import exception as modal_exception
from modal._tunnel import Tunnel
from modal.types import FileInfo, FileType

from ..local.process import LocalProcess
from . import faults, procfs
from .preview_proxy import PreviewProxy
from .special_files import wait_forever_on_special_file

# Every process a fake sandbox starts carries this variable, so that terminating the
# sandbox can find processes that left their process group (like a container teardown).
FAKE_SANDBOX_ENV = "SANDBOX_MODAL_FAKE_ID"
# Where the backend puts the runner (its `$SANDBOX_RUNNER_DIR`): each fake sandbox gets a
# folder of its own, since they all share this machine's /tmp (see the module docstring).
RUNNER_DIR_ENV = "SANDBOX_RUNNER_DIR"
STDIN_BUFFER_LIMIT = 16 * 1024 * 1024  # the SDK's limit for the command-router writer

# The SDK class each fake class stands for, by name (the drift check maps return
# annotations with it).
SDK_NAMES = {
    "FakeSandbox": "Sandbox",
    "FakeContainerProcess": "ContainerProcess",
    "FakeStreamReader": "StreamReader",
    "FakeStreamWriter": "StreamWriter",
    "FakeSandboxFilesystem": "SandboxFilesystem",
    "FakeApp": "App",
    "FakeClient": "Client",
    "FakeImage": "Image",
}

# The SDK calls a fault can be planned on or a `Gate` can hold.
OPS = (
    "client",
    "app_lookup",
    "create",
    "create_response",
    "from_id",
    "from_name",
    "terminate",
    "exec",
    "exec_response",
    "write",
    "wait",
    "read",
    "read_file",
    "write_file",
    "stat",
    "snapshot",
    "tunnels",
    "get_tags",
    "set_tags",
)

# Picks the call a `Gate` or fault applies to, by its arguments.
Predicate = Callable[[tuple[str, ...]], bool]


# ---- the `.aio` call shape of synchronicity-wrapped SDK objects ------------------------


class AioCallable:
    """What a wrapped SDK callable looks like once looked up: a blocking call (which the
    fake does not implement) with the coroutine function at `.aio`."""

    def __init__(self, aio: Callable[..., Any], name: str) -> None:
        self.aio = aio
        self._name = name

    def __call__(self, *args: object, **kwargs: object) -> Any:
        raise TypeError(f"the Modal fake implements only the async form: use {self._name}.aio()")


class _AioMethod:
    """Like synchronicity's `MethodWithAio` on an instance method: `.aio` is bound to the
    instance and keeps the original signature (`self` included) through `__wrapped__`."""

    def __init__(self, func: Callable[..., Any]) -> None:
        self._func = func

    def __get__(self, instance: object, owner: type | None = None) -> AioCallable:
        bound = functools.update_wrapper(functools.partial(self._func, instance), self._func)
        return AioCallable(bound, self._func.__name__)


class _AioClassMethod(_AioMethod):
    """Like `MethodWithAio` on a classmethod: `.aio` is bound to the class."""

    def __get__(self, instance: object, owner: type | None = None) -> AioCallable:
        bound = functools.update_wrapper(functools.partial(self._func, owner), self._func)
        return AioCallable(bound, self._func.__name__)


class _AioStatic(_AioMethod):
    """Like synchronicity's `FunctionWithAio` on a staticmethod: the signature has no
    `self`/`cls`. The fake still needs its class (to find its `FakeModal`), so the class
    is bound as a hidden first argument that the signature does not show."""

    def __get__(self, instance: object, owner: type | None = None) -> AioCallable:
        return AioCallable(functools.partial(self._func, owner), self._func.__name__)


class _SyncAndAioClassMethod:
    """Like synchronicity's wrapper of a plain (sync) classmethod: callable directly, with
    a deprecated async `.aio` form as well (`modal.Image.from_id`)."""

    def __init__(self, func: Callable[..., Any]) -> None:
        self._func = func

    def __get__(self, instance: object, owner: type | None = None) -> Any:
        bound = functools.update_wrapper(functools.partial(self._func, owner), self._func)

        async def aio(*args: Any, **kwargs: Any) -> Any:
            return bound(*args, **kwargs)

        aio.__signature__ = inspect.signature(bound)  # type: ignore[attr-defined]
        aio.__doc__ = self._func.__doc__
        return _Both(bound, aio)


class _Both:
    """A sync callable with an `.aio` coroutine function beside it."""

    def __init__(self, call: Callable[..., Any], aio: Callable[..., Any]) -> None:
        self._call = call
        self.aio = aio
        functools.update_wrapper(self, call)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._call(*args, **kwargs)


# ---- fault injection --------------------------------------------------------------------


# The gate every `block` returns (`sandbox.testing.faults.Gate`), under its old name here.
Gate = faults.Gate


# ---- the fake SDK -------------------------------------------------------------------


class FakeModal:
    """A fake `modal` module: one in-memory "cloud" of apps, sandboxes and processes.

    Pass it as the backend's `sdk` option. `sandboxes` maps ids to every sandbox ever
    created; `live_sandboxes()` and `leftover_pids()` tell a test what was left behind.
    """

    Sandbox: type[FakeSandbox]
    App: type[FakeApp]
    Client: type[FakeClient]
    Image: type[FakeImage]

    def __init__(self) -> None:
        self.id = secrets.token_hex(6)
        self.sandboxes: dict[str, FakeSandbox] = {}
        self.apps: dict[str, FakeApp] = {}
        self.clients: list[FakeClient] = []
        self.calls: list[tuple[str, tuple[str, ...]]] = []
        self._faults = faults.FaultPlan(OPS)
        # One subclass per fake, so the SDK's class-level calls (`Sandbox.create`) know
        # which fake cloud they belong to.
        self.Sandbox = _bound(FakeSandbox, self)
        self.App = _bound(FakeApp, self)
        self.Client = _bound(FakeClient, self)
        self.Image = _bound(FakeImage, self)

    def __repr__(self) -> str:
        return f"<FakeModal {self.id} sandboxes={len(self.live_sandboxes())}>"

    # ---- knobs ----------------------------------------------------------------------

    @property
    def faults(self) -> faults.FaultPlan:
        """The fault plan behind the knobs below (`sandbox.testing.faults`): arm gates
        and planned failures at any point directly, in the kit's own terms."""
        return self._faults

    def fail(
        self,
        op: str,
        exc: BaseException,
        *,
        times: int | None = 1,
        when: Predicate | None = None,
    ) -> None:
        """Make the next `times` calls of `op` (None: all) matching `when` raise `exc`."""
        self._faults.fail(op, exc, times=times, where=when)

    def block(
        self,
        op: str,
        *,
        times: int | None = 1,
        when: Predicate | None = None,
        then_raise: BaseException | None = None,
    ) -> Gate:
        """Hold the next `times` calls of `op` matching `when` at a `Gate` (returned);
        once released, they raise `then_raise` if given (a call that fails late)."""
        return self._faults.gate(op, times=times, where=when, error=then_raise)

    def clear_faults(self) -> None:
        """Forget every pending fault (held calls stay held until their gate is released)."""
        self._faults.clear()

    async def _check(self, op: str, argv: tuple[str, ...] = ()) -> None:
        self.calls.append((op, argv))
        await self._faults.checkpoint(op, subject=argv)

    # ---- inspection -----------------------------------------------------------------

    def live_sandboxes(self) -> list[FakeSandbox]:
        """Sandboxes created and not terminated."""
        return [s for s in self.sandboxes.values() if not s._terminated]

    def open_clients(self) -> list[FakeClient]:
        """Clients made by `Client.from_credentials` and not closed."""
        return [c for c in self.clients if not c._closed]

    def leftover_pids(self) -> list[int]:
        """Live (non-zombie) local processes started by any sandbox of this fake."""
        return procfs.pids_with_env(FAKE_SANDBOX_ENV, self.id, prefix=True)

    async def aclose(self) -> None:
        """Terminate every sandbox (for test teardown)."""
        for sandbox in list(self.sandboxes.values()):
            await sandbox._shutdown()


_T = TypeVar("_T")


def _bound(cls: type[_T], fake: FakeModal) -> type[_T]:
    bound: type[_T] = type(cls.__name__.removeprefix("Fake"), (cls,), {"_fake": fake})
    return bound


def _fake_of(cls: type) -> FakeModal:
    fake = getattr(cls, "_fake", None)
    if not isinstance(fake, FakeModal):
        raise TypeError("use the classes of a FakeModal instance (fake.Sandbox, fake.App, ...)")
    return fake


def _check_real_parameters(real: Callable[..., Any], options: Mapping[str, object]) -> None:
    """Extra keyword options must be ones the installed SDK accepts (so they cannot drift)."""
    accepted = inspect.signature(real).parameters
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        raise TypeError(f"the installed modal SDK does not accept {', '.join(unknown)}")


class FakeClient:
    """Fake `modal.Client`: made from a token, closed at the end."""

    _fake: ClassVar[FakeModal]

    def __init__(self, token_id: str) -> None:
        self._token_id = token_id
        self._closed = False

    def __repr__(self) -> str:
        return f"<FakeClient closed={self._closed}>"

    @_AioClassMethod
    async def from_credentials(
        cls: type[FakeClient], token_id: str, token_secret: str
    ) -> FakeClient:
        """A client for this token (any non-empty token is accepted)."""
        fake = _fake_of(cls)
        await fake._check("client")
        if not token_id or not token_secret:
            raise modal_exception.AuthError("Token missing")
        client = cls(token_id)
        fake.clients.append(client)
        return client

    @_AioMethod
    async def close(self) -> None:
        """Close the client."""
        self._closed = True


class FakeImage:
    """Fake `modal.Image`: names a registry image, or holds a filesystem snapshot (a copy
    of a sandbox's workdir that a sandbox created from it starts with)."""

    _fake: ClassVar[FakeModal]
    # Snapshot id -> the folder holding its copy (process-wide: `from_id` has no fake).
    _snapshots: ClassVar[dict[str, str]] = {}

    def __init__(self, tag: str, snapshot_id: str | None = None) -> None:
        self.tag = tag
        self._snapshot_id = snapshot_id

    def __repr__(self) -> str:
        return f"<FakeImage {self.tag}>"

    @property
    def object_id(self) -> str:
        """The image id (`im-...`)."""
        return self._snapshot_id or f"im-{self.tag}"

    @staticmethod
    def from_registry(tag: str) -> FakeImage:
        """An image named by its registry tag (nothing is pulled)."""
        return FakeImage(tag)

    @_SyncAndAioClassMethod
    def from_id(cls, image_id: str, client: FakeClient | None = None) -> FakeImage:
        """The image with this id (a snapshot's: `NotFoundError` once it is gone)."""
        if image_id not in FakeImage._snapshots:
            raise modal_exception.NotFoundError(f"Image {image_id} not found")
        return FakeImage(f"snapshot:{image_id}", image_id)


class FakeApp:
    """Fake `modal.App`, as returned by `App.lookup`."""

    _fake: ClassVar[FakeModal]

    def __init__(self, name: str) -> None:
        self._name = name

    def __repr__(self) -> str:
        return f"<FakeApp {self._name}>"

    @_AioStatic
    async def lookup(
        cls: type[FakeApp],  # hidden: see _AioStatic
        name: str,
        *,
        client: FakeClient | None = None,
        environment_name: str | None = None,
        create_if_missing: bool = False,
    ) -> FakeApp:
        """The app called `name`, created if missing and `create_if_missing`."""
        fake = _fake_of(cls)
        await fake._check("app_lookup")
        _check_client(client)
        app = fake.apps.get(name)
        if app is None:
            if not create_if_missing:
                raise modal_exception.NotFoundError(f"App '{name}' not found")
            app = fake.apps[name] = cls(name)
        return app


def _check_client(client: object) -> None:
    if isinstance(client, FakeClient) and client._closed:
        raise modal_exception.ClientClosed("the client is closed")


class FakeSandbox:
    """Fake `modal.Sandbox`: commands run as local processes in `workdir`."""

    _fake: ClassVar[FakeModal]

    def __init__(
        self,
        object_id: str,
        *,
        app: FakeApp | None,
        name: str | None,
        workdir: str | None,
        env: Mapping[str, str | None] | None,
        image: object,
        options: Mapping[str, object],
    ) -> None:
        self._object_id = object_id
        self._app = app
        self._name = name
        self._workdir = workdir
        self._env = {k: v for k, v in (env or {}).items() if v is not None}
        self.image = image
        self.options = dict(options)
        self.processes: list[FakeContainerProcess] = []
        # Shared by every handle of this sandbox (`from_id` / `from_name` make a new
        # handle each time, as the SDK hydrates a new object); `_attached` is per handle.
        self._shared = {"terminated": False}
        # The sandbox's tags (modal `Sandbox.create(tags=...)`, `set_tags`): one dict
        # shared by every handle, as they live on the server.
        self._tags: dict[str, str] = dict(options.get("tags") or {})  # type: ignore[call-overload]
        self._attached = True
        self._filesystem = FakeSandboxFilesystem(self)
        self._tunnels: dict[int, PreviewProxy] = {}
        # The sandbox's own runner folder (`RUNNER_DIR_ENV`): short, since a unix
        # socket's path must stay under 108 bytes; named at create, removed at terminate.
        self._runner_dir: str | None = None

    @property
    def _terminated(self) -> bool:
        return self._shared["terminated"]

    @_terminated.setter
    def _terminated(self, value: bool) -> None:
        self._shared["terminated"] = value

    def _new_handle(self) -> FakeSandbox:
        """Another handle on this sandbox (its own attachment, everything else shared)."""
        handle = copy.copy(self)
        handle._attached = True
        return handle

    def __repr__(self) -> str:
        return f"<FakeSandbox {self._object_id} terminated={self._terminated}>"

    @property
    def object_id(self) -> str:
        """The sandbox id (`sb-...`)."""
        return self._object_id

    @property
    def filesystem(self) -> FakeSandboxFilesystem:
        """The file API (this machine's files, absolute paths)."""
        self._ensure_attached()
        return self._filesystem

    @_AioMethod
    async def tunnels(self, timeout: int = 50) -> dict[int, Tunnel]:
        """The ports declared at create (`encrypted_ports`, `unencrypted_ports`), each
        forwarded by a loopback `PreviewProxy`. Unlike Modal's edge, an "encrypted" one
        speaks plain HTTP here (the fake has no certificate): only its shape is real."""
        self._ensure_attached()
        await self._fake._check("tunnels")
        found: dict[int, Tunnel] = {}
        for key, encrypted in (("encrypted_ports", True), ("unencrypted_ports", False)):
            for port in self.options.get(key) or ():  # type: ignore[attr-defined]
                proxy = self._tunnels.get(port)
                if proxy is None:
                    proxy = self._tunnels[port] = await PreviewProxy(port).start()
                if encrypted:
                    found[port] = Tunnel("127.0.0.1", proxy.port, "", 0)
                else:
                    found[port] = Tunnel("127.0.0.1", proxy.port, "127.0.0.1", proxy.port)
        return found

    @_AioMethod
    async def snapshot_filesystem(
        self, timeout: int = 55, *, ttl: int | None = 30 * 24 * 3600
    ) -> FakeImage:
        """A copy of the workdir as an image (`modal.Sandbox.snapshot_filesystem`)."""
        self._ensure_attached()
        await self._fake._check("snapshot")
        if self._terminated:
            raise modal_exception.NotFoundError("Sandbox has already been terminated")
        image_id = f"im-{secrets.token_hex(8)}"
        store = await asyncio.to_thread(tempfile.mkdtemp, prefix=f"modal-{image_id}-")
        if self._workdir is not None:
            await asyncio.to_thread(
                shutil.copytree, self._workdir, store, symlinks=True, dirs_exist_ok=True
            )
        FakeImage._snapshots[image_id] = store
        return FakeImage(f"snapshot:{image_id}", image_id)

    def _ensure_attached(self) -> None:
        if not self._attached:
            raise modal_exception.ClientClosed("Unable to perform operation on a detached sandbox")

    # ---- class-level calls -----------------------------------------------------------

    @_AioStatic
    async def create(
        cls: type[FakeSandbox],  # hidden: see _AioStatic
        *args: str,
        app: FakeApp | None = None,
        name: str | None = None,
        image: object = None,
        env: dict[str, str | None] | None = None,
        timeout: int | None = 300,
        workdir: str | None = None,
        client: FakeClient | None = None,
        **options: Any,
    ) -> FakeSandbox:
        """Create a sandbox (`options` must be ones the installed SDK accepts)."""
        fake = _fake_of(cls)
        _check_real_parameters(_sdk_sandbox_create(), options)
        await fake._check("create")
        _check_client(client)
        if app is None:
            raise modal_exception.InvalidError("App is required when creating a Sandbox")
        if workdir is not None and not workdir.startswith("/"):
            raise modal_exception.InvalidError(f"workdir must be an absolute path, got: {workdir}")
        if name is not None and any(
            s._app is app and s._name == name for s in fake.live_sandboxes()
        ):
            raise modal_exception.AlreadyExistsError(f"Sandbox '{name}' already exists")
        sandbox = cls(
            f"sb-{secrets.token_hex(10)}",
            app=app,
            name=name,
            workdir=workdir,
            env=env,
            image=image,
            options={"timeout": timeout, **options},
        )
        if workdir is not None:
            await asyncio.to_thread(os.makedirs, workdir, exist_ok=True)
            snapshot = getattr(image, "_snapshot_id", None)
            if snapshot is not None:  # a snapshot's files are there from the start
                await asyncio.to_thread(
                    shutil.copytree,
                    FakeImage._snapshots[snapshot],
                    workdir,
                    symlinks=True,
                    dirs_exist_ok=True,
                )
        # Named, not made: the runner's upload makes it (0700) for a sandbox that uses
        # one, so a sandbox a test never terminates leaves no empty folder behind.
        sandbox._runner_dir = f"/tmp/mrun-{secrets.token_hex(6)}"
        fake.sandboxes[sandbox.object_id] = sandbox
        await fake._check("create_response")
        return sandbox

    @_AioStatic
    async def from_id(
        cls: type[FakeSandbox],
        sandbox_id: str,
        client: FakeClient | None = None,
    ) -> FakeSandbox:
        """The sandbox with this id (also a terminated one, like the SDK)."""
        fake = _fake_of(cls)
        await fake._check("from_id")
        _check_client(client)
        sandbox = fake.sandboxes.get(sandbox_id)
        if sandbox is None:
            raise modal_exception.NotFoundError(f"Sandbox with id {sandbox_id} not found")
        return sandbox._new_handle()

    @_AioStatic
    async def from_name(
        cls: type[FakeSandbox],
        app_name: str,
        name: str,
        *,
        environment_name: str | None = None,
        include_terminated: bool = False,
        client: FakeClient | None = None,
    ) -> FakeSandbox:
        """The running sandbox called `name` in the app `app_name`."""
        fake = _fake_of(cls)
        await fake._check("from_name")
        _check_client(client)
        for sandbox in fake.sandboxes.values():
            if (
                sandbox._name == name
                and sandbox._app is not None
                and sandbox._app._name == app_name
                and (include_terminated or not sandbox._terminated)
            ):
                return sandbox._new_handle()
        raise modal_exception.NotFoundError(f"Sandbox '{name}' not found in app '{app_name}'")

    # ---- instance calls ----------------------------------------------------------------

    @overload
    async def exec(
        self,
        *args: str,
        timeout: int | None = None,
        workdir: str | None = None,
        env: dict[str, str | None] | None = None,
        text: Literal[True] = True,
        pty: bool = False,
    ) -> FakeContainerProcess: ...

    @overload
    async def exec(
        self,
        *args: str,
        timeout: int | None = None,
        workdir: str | None = None,
        env: dict[str, str | None] | None = None,
        text: Literal[False] = False,
        pty: bool = False,
    ) -> FakeContainerProcess: ...

    @_AioMethod  # type: ignore[operator, misc]  # the overloads above describe it
    async def exec(
        self,
        *args: str,
        timeout: int | None = None,
        workdir: str | None = None,
        env: dict[str, str | None] | None = None,
        text: bool = True,
        pty: bool = False,
    ) -> FakeContainerProcess:
        """Start `args` as a local process (on a terminal if `pty`), in `workdir`."""
        self._ensure_attached()
        argv = tuple(args)
        if not argv or not all(isinstance(a, str) for a in argv):
            raise modal_exception.InvalidError("All entrypoint arguments must be strings")
        if workdir is not None and not workdir.startswith("/"):
            raise modal_exception.InvalidError(f"workdir must be an absolute path, got: {workdir}")
        await self._fake._check("exec", argv)
        if self._terminated:
            raise modal_exception.ConflictError("Sandbox already finished")
        environment = dict(os.environ)
        environment.update(self._env)
        environment.update({k: v for k, v in (env or {}).items() if v is not None})
        environment[FAKE_SANDBOX_ENV] = f"{self._fake.id}-{self._object_id}"
        if self._runner_dir is not None:
            environment[RUNNER_DIR_ENV] = self._runner_dir
        if pty:
            # As the SDK's `get_pty_info`: the terminal type is the client's own `TERM`
            # (none if it has none) unless the command's env names one.
            environment.pop("TERM", None)
            term = (env or {}).get("TERM") or os.environ.get("TERM")
            if term:
                environment["TERM"] = term
        process = FakeContainerProcess(self, argv, pty=pty, text=text)
        process.exec_options = {"timeout": timeout, "workdir": workdir, "env": env, "pty": pty}
        process._start(environment, workdir or self._workdir or "/", timeout)
        self.processes.append(process)
        await self._fake._check("exec_response", argv)
        return process

    @overload
    async def terminate(self, *, wait: Literal[True]) -> int: ...

    @overload
    async def terminate(self, *, wait: Literal[False] = False) -> None: ...

    @_AioMethod  # type: ignore[operator, misc]  # the overloads above describe it
    async def terminate(self, *, wait: bool = False) -> int | None:
        """Kill every process of the sandbox, as a container teardown would."""
        self._ensure_attached()
        await self._fake._check("terminate")
        await self._shutdown()
        return 137 if wait else None

    @_AioMethod
    async def get_tags(self) -> dict[str, str]:
        """The sandbox's tags, from the server (modal `SandboxTagsGet`)."""
        self._ensure_attached()
        await self._fake._check("get_tags")
        return dict(self._tags)

    @_AioMethod
    async def set_tags(self, tags: dict[str, str], *, client: FakeClient | None = None) -> None:
        """Replace the sandbox's whole tag set (modal `SandboxTagsSet`; {} clears it)."""
        self._ensure_attached()
        await self._fake._check("set_tags")
        self._tags.clear()
        self._tags.update(tags)

    @_AioMethod
    async def poll(self) -> int | None:
        """None while the sandbox runs, else its exit code (137: it was terminated)."""
        self._ensure_attached()
        await self._fake._check("poll")
        return 137 if self._terminated else None

    @_AioMethod
    async def detach(self) -> None:
        """Stop using this handle (the sandbox keeps running)."""
        self._attached = False

    async def _shutdown(self) -> None:
        """Kill every process of the sandbox, as a container teardown would."""
        if self._terminated:
            return
        self._terminated = True
        tunnels, self._tunnels = list(self._tunnels.values()), {}
        for proxy in tunnels:
            await proxy.close()
        for process in self.processes:
            await process._kill()
        marker = f"{self._fake.id}-{self._object_id}"
        for pid in procfs.pids_with_env(FAKE_SANDBOX_ENV, marker, prefix=True):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        if self._runner_dir is not None:
            await asyncio.to_thread(shutil.rmtree, self._runner_dir, True)


def _sdk_sandbox_create() -> Callable[..., Any]:
    """The installed SDK's `Sandbox.create.aio` (the reference for extra options)."""
    import modal

    create: Callable[..., Any] = modal.Sandbox.create.aio
    return create


class FakeSandboxFilesystem:
    """Fake `Sandbox.filesystem`: this machine's files, absolute paths only."""

    def __init__(self, sandbox: FakeSandbox) -> None:
        self._sandbox = sandbox

    def __repr__(self) -> str:
        return f"<FakeSandboxFilesystem of {self._sandbox.object_id}>"

    @_AioMethod
    async def read_bytes(self, remote_path: str) -> bytes:
        """Read a file. A FIFO or device is opened and waited on forever (the SDK's file
        tool reads it like any file): without holding a thread here."""
        _check_absolute(remote_path, "read_bytes")
        await self._sandbox._fake._check("read_file", (remote_path,))
        if self._sandbox._terminated:
            raise modal_exception.ConflictError("Sandbox already finished")
        await wait_forever_on_special_file(remote_path)

        def read() -> bytes:
            with _filesystem_errors(remote_path), open(remote_path, "rb") as handle:
                return handle.read()

        return await asyncio.to_thread(read)

    @_AioMethod
    async def write_bytes(self, data: bytes | bytearray | memoryview, remote_path: str) -> None:
        """Write a file, creating its parent directories (a FIFO there: waited on
        forever, as for a read)."""
        _check_absolute(remote_path, "write_bytes")
        if not isinstance(data, bytes | bytearray | memoryview):
            raise TypeError("data must be bytes-like")
        await self._sandbox._fake._check("write_file", (remote_path,))
        if self._sandbox._terminated:
            raise modal_exception.ConflictError("Sandbox already finished")
        await wait_forever_on_special_file(remote_path)

        def write() -> None:
            with _filesystem_errors(remote_path):
                os.makedirs(os.path.dirname(remote_path) or "/", exist_ok=True)
                with open(remote_path, "wb") as handle:
                    handle.write(data)

        await asyncio.to_thread(write)

    @_AioMethod
    async def stat(self, remote_path: str) -> FileInfo:
        """The entry itself (a symlink is described, not followed). The SDK names only
        files, directories and symlinks: a FIFO, socket or device comes back as a FILE
        whose `mode` (the full st_mode here) says what it is."""
        _check_absolute(remote_path, "stat")
        await self._sandbox._fake._check("stat", (remote_path,))
        if self._sandbox._terminated:
            raise modal_exception.ConflictError("Sandbox already finished")

        def stat() -> FileInfo:
            with _filesystem_errors(remote_path):
                info = os.lstat(remote_path)
                target = os.readlink(remote_path) if stat_module.S_ISLNK(info.st_mode) else None
            if stat_module.S_ISDIR(info.st_mode):
                kind = FileType.DIRECTORY
            elif target is not None:
                kind = FileType.SYMLINK
            else:
                kind = FileType.FILE
            return FileInfo(
                name=os.path.basename(remote_path),
                path=remote_path,
                type=kind,
                size=info.st_size,
                mode=info.st_mode,
                permissions=stat_module.filemode(info.st_mode)[1:],
                owner=str(info.st_uid),
                group=str(info.st_gid),
                modified_time=info.st_mtime,
                symlink_target=target,
            )

        return await asyncio.to_thread(stat)


def _check_absolute(path: str, operation: str) -> None:
    if not path.startswith("/"):
        raise modal_exception.InvalidError(
            f"Sandbox.filesystem.{operation}() currently only supports absolute remote_path values"
        )


@contextlib.contextmanager
def _filesystem_errors(path: str) -> Iterator[None]:
    try:
        yield
    except FileNotFoundError:
        raise modal_exception.SandboxFilesystemNotFoundError(
            f"No such file or directory: {path}"
        ) from None
    except IsADirectoryError:
        raise modal_exception.SandboxFilesystemIsADirectoryError(
            f"Is a directory: {path}"
        ) from None
    except (NotADirectoryError, FileExistsError):
        # A parent that is a file: the file tool says "NotDirectory" or "AlreadyExists",
        # both raised by the SDK as SandboxFilesystemNotADirectoryError.
        raise modal_exception.SandboxFilesystemNotADirectoryError(
            f"Not a directory: {path}"
        ) from None
    except PermissionError:
        raise modal_exception.SandboxFilesystemPermissionError(
            f"Permission denied: {path}"
        ) from None


class FakeContainerProcess:
    """Fake `modal.container_process.ContainerProcess` around a real local process."""

    def __init__(self, sandbox: FakeSandbox, argv: tuple[str, ...], *, pty: bool, text: bool):
        self._sandbox = sandbox
        self._fake = sandbox._fake
        self.argv = argv
        self._pty = pty
        self._stdout = FakeStreamReader(self, 1, text)
        self._stderr = FakeStreamReader(self, 2, text)
        self._stdin = FakeStreamWriter(self)
        self._local: LocalProcess | None = None
        self._returncode: int | None = None
        self._exited = asyncio.Event()
        self._timer: asyncio.TimerHandle | None = None
        # What `exec` was called with, for tests to inspect (not SDK surface).
        self.exec_options: dict[str, Any] = {}

    def __repr__(self) -> str:
        return f"<FakeContainerProcess {self.argv[:1]} returncode={self._returncode}>"

    @property
    def stdout(self) -> FakeStreamReader:
        """The output stream (everything, with a terminal)."""
        return self._stdout

    @property
    def stderr(self) -> FakeStreamReader:
        """The error stream (empty with a terminal)."""
        return self._stderr

    @property
    def stdin(self) -> FakeStreamWriter:
        """The input stream."""
        return self._stdin

    @_AioMethod
    async def wait(self) -> int:
        """Wait for the exit: the code, 128+N for signal N, -1 past the exec timeout."""
        await self._fake._check("wait", self.argv)
        await self._exited.wait()
        assert self._returncode is not None
        return self._returncode

    # ---- driving the local process ----------------------------------------------------

    def _start(self, env: dict[str, str], cwd: str, timeout: int | None) -> None:
        try:
            self._local = LocalProcess.spawn(
                self.argv,
                tty=self._pty,
                env=env,
                cwd=cwd,
                # As Modal's: a pipe process's stdin stays open until `write_eof()`.
                stdin=not self._pty,
                on_stdout=self._stdout._push,
                on_stderr=None if self._pty else self._stderr._push,
                on_exit=self._on_exit,
                on_eof=self._on_eof,
            )
        except OSError as exc:
            # What a container runtime reports for a command it cannot start (the path
            # it names is the program's, or the working directory's).
            self._stderr._push(f"exec: {exc.filename or self.argv[0]}: {exc.strerror}\n".encode())
            self._on_eof()
            self._on_exit(127 if isinstance(exc, FileNotFoundError) else 126)
            return
        if timeout:
            self._timer = asyncio.get_running_loop().call_later(timeout, self._expire)

    def _on_exit(self, code: int) -> None:
        if self._returncode is None:
            self._returncode = code
        if self._timer is not None:
            self._timer.cancel()
        self._exited.set()

    def _on_eof(self) -> None:
        self._stdout._end()
        self._stderr._end()

    def _expire(self) -> None:
        """The exec's server-side timeout: kill it; the SDK then reports -1 and ends
        the output streams at the deadline."""
        self._returncode = -1
        if self._local is not None:
            self._local.signal_group(signal.SIGKILL)
        self._on_eof()

    async def _kill(self) -> None:
        if self._local is not None:
            await self._local.terminate(0)
        self._on_eof()
        self._on_exit(self._returncode if self._returncode is not None else 137)


class FakeStreamReader:
    """Fake `modal.io_streams.StreamReader`: async iteration yields chunks (bytes, or
    str for `text=True`) in arrival order until the stream ends."""

    __fake_dunders__ = ("__aiter__",)

    def __init__(self, process: FakeContainerProcess, fd: int, text: bool) -> None:
        self._process = process
        self._fd = fd
        self._text = text
        self._chunks: collections.deque[bytes] = collections.deque()
        self._ended = False
        self._waiter: asyncio.Future[None] | None = None

    def __repr__(self) -> str:
        return f"<FakeStreamReader fd={self._fd}>"

    def __aiter__(self) -> AsyncGenerator[Any, None]:
        """Iterate the chunks until the stream ends."""
        return self._iterate()

    async def _iterate(self) -> AsyncGenerator[Any, None]:
        decoder = codecs.getincrementaldecoder("utf-8")() if self._text else None
        while True:
            while not self._chunks and not self._ended:
                self._waiter = asyncio.get_running_loop().create_future()
                try:
                    await self._waiter
                finally:
                    self._waiter = None
            if not self._chunks:
                if decoder is not None:
                    tail = decoder.decode(b"", final=True)
                    if tail:
                        yield tail
                return
            await self._process._fake._check("read", self._process.argv)
            chunk = self._chunks.popleft()
            if decoder is None:
                yield chunk
            else:
                text = decoder.decode(chunk)
                if text:
                    yield text

    def _push(self, data: bytes) -> None:
        if not self._ended:
            self._chunks.append(bytes(data))
            self._wake()

    def _end(self) -> None:
        self._ended = True
        self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)


class FakeStreamWriter:
    """Fake `modal.io_streams.StreamWriter`: `write()` buffers, `drain.aio()` sends."""

    def __init__(self, process: FakeContainerProcess) -> None:
        self._process = process
        self._buffer = bytearray()
        self._closed = False
        self._eof_sent = False

    def __repr__(self) -> str:
        return f"<FakeStreamWriter closed={self._closed}>"

    def write(self, data: bytes | bytearray | memoryview | str) -> None:
        """Buffer `data` (sent by `drain`)."""
        if self._closed:
            raise ValueError("Stdin is closed. Cannot write to it.")
        if isinstance(data, str):
            data = data.encode("utf-8")
        if not isinstance(data, bytes | bytearray | memoryview):
            raise TypeError(f"data argument must be a bytes-like object, not {type(data).__name__}")
        if len(self._buffer) + len(data) > STDIN_BUFFER_LIMIT:
            raise BufferError("Buffer size exceed limit. Call drain to flush the buffer.")
        self._buffer.extend(data)

    def write_eof(self) -> None:
        """Close the stream once the buffer is drained."""
        self._closed = True

    @_AioMethod
    async def drain(self) -> None:
        """Send the buffered input to the process."""
        process = self._process
        await process._fake._check("write", process.argv)
        data = bytes(self._buffer)
        eof = self._closed and not process._pty and not self._eof_sent
        if not data and not eof:
            return
        local = process._local
        if data and local is not None and not local.exited:
            with contextlib.suppress(Exception):  # a closing terminal or pipe swallows input
                await local.write(data)
        self._buffer.clear()
        if eof:
            # The EOF goes after the bytes drained with it (SandboxStdinWrite's `eof`).
            self._eof_sent = True
            if local is not None:
                local.close_stdin()


__all__ = [
    "FAKE_SANDBOX_ENV",
    "OPS",
    "RUNNER_DIR_ENV",
    "SDK_NAMES",
    "STDIN_BUFFER_LIMIT",
    "AioCallable",
    "FakeApp",
    "FakeClient",
    "FakeContainerProcess",
    "FakeImage",
    "FakeModal",
    "FakeSandbox",
    "FakeSandboxFilesystem",
    "FakeStreamReader",
    "FakeStreamWriter",
    "Gate",
    "Predicate",
]
