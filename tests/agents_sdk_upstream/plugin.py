"""A pytest plugin running the OpenAI Agents SDK's own sandbox tests against our client.

`make test-agents-sdk` unpacks the SDK's sdist (the pinned version) and runs its
`tests/sandbox/...` from there with `-p plugin`: the tests stay as they are; only the
names they build their client, options, sessions and states from
(`UnixLocalSandboxClient`, `UnixLocalSandboxSession`, ...) are rebound, in each test
module, to ours on the backend `--agents-sdk-backend` names (unix_local or docker).

`upstream_tests.txt` beside this file says which upstream tests apply (`run`), which do
not (`not`, with the reason: their private internals, their Docker plumbing under mocks,
a host folder a docker sandbox cannot see) and which are deliberate differences
(`diff`, each one in docs/openai-agents.md). Tests the list does not name run: a new
upstream test fails the target until it is classified.
"""

from __future__ import annotations

import asyncio
import functools
import os
import tempfile
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from agents.sandbox.manifest import Manifest
from agents.sandbox.snapshot import NoopSnapshot

from sandbox.integrations.openai_agents import (
    AgentsSessionAdapter,
    SandboxClient,
    SandboxClientOptions,
    SandboxSessionState,
)

LIST_FILE = Path(__file__).with_name("upstream_tests.txt")
BACKENDS = ("unix_local", "docker")

_backend = "unix_local"
# The label every container of this run carries: some upstream tests end a session with
# `stop()` only (never `shutdown()`), which leaves its container by the SDK's contract;
# the run removes what it made, by this label, when it ends.
RUN_LABEL = "sandbox.test.agents-sdk-run"
_run_token = f"{os.getpid()}-{os.urandom(4).hex()}"
_DEFAULT_ROOT = str(Manifest.model_fields["root"].default)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--agents-sdk-backend",
        default=os.environ.get("SANDBOX_AGENTS_SDK_BACKEND", "unix_local"),
        choices=BACKENDS,
        help="the backend our SandboxClient runs the SDK's tests on",
    )
    parser.addoption(
        "--agents-sdk-report",
        default=None,
        help="write, per test, whether it built one of our clients or sessions and its outcome",
    )
    parser.addoption(
        "--agents-sdk-all",
        action="store_true",
        help="run every collected test, whatever upstream_tests.txt says (to measure)",
    )


def _backend_options(root: str | None) -> dict[str, Any]:
    """What `open_session` takes for a test whose manifest root is `root`. On docker a
    host root (their tests put it in `tmp_path` and look at its files from the host) is
    seen at the same path in the container: its parent folder is bind-mounted there."""
    if _backend == "docker":
        from sandbox.testing.docker_image import ensure_busybox_image

        options: dict[str, Any] = {
            "image": ensure_busybox_image(),
            "labels": {RUN_LABEL: _run_token},
        }
        if root is not None and root.startswith("/") and root != _DEFAULT_ROOT:
            parent = os.path.dirname(os.path.normpath(root))
            if parent != "/" and os.path.isdir(parent):
                options["volumes"] = {parent: {"bind": parent, "mode": "rw"}}
                options["workdir"] = root  # the workspace our file calls resolve in
        return options
    return {} if root is None else {"workdir": root}


class UpstreamClient(SandboxClient):
    """`UnixLocalSandboxClient(...)`: our client, options defaulting to the run's backend
    (their client's keywords, such as `inherit_host_environment`, are theirs: dropped)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        _note()
        super().__init__()

    async def create(
        self, *, snapshot: Any = None, manifest: Any = None, options: Any = None
    ) -> Any:
        if not isinstance(options, SandboxClientOptions):
            ports = tuple(getattr(options, "exposed_ports", ()) or ())
            # A root they name is the unix_local workspace our client opens on.
            root = manifest.root if manifest is not None else None
            options = SandboxClientOptions(
                backend=_backend,
                backend_options=_backend_options(None if _backend == "unix_local" else root),
                exposed_ports=ports,
            )
        return await super().create(snapshot=snapshot, manifest=manifest, options=options)


def upstream_options(exposed_ports: tuple[int, ...] = (), **_: Any) -> SandboxClientOptions:
    """`UnixLocalSandboxClientOptions(exposed_ports=...)`: ours on the run's backend."""
    _note()
    return SandboxClientOptions(
        backend=_backend, backend_options=_backend_options(None), exposed_ports=exposed_ports
    )


def upstream_state(
    *, manifest: Manifest | None = None, snapshot: Any = None, **kwargs: Any
) -> SandboxSessionState:
    """`UnixLocalSandboxSessionState(...)`: ours, on the run's backend (their
    `workspace_root_owned` is dropped: ownership is ours to decide and seal)."""
    _note()
    manifest = manifest or Manifest()
    kwargs.pop("workspace_root_owned", None)
    kwargs.pop("type", None)
    state = SandboxSessionState(
        manifest=manifest,
        snapshot=snapshot if snapshot is not None else NoopSnapshot(id="upstream"),
        backend=_backend,
        backend_options=_backend_options(manifest.root),
        **kwargs,
    )
    state.reseal()
    return state


_STARTING = frozenset(
    {
        "exec", "read", "write", "read_bounded", "ls", "mkdir", "rm", "mv", "same_file",
        "persist_workspace", "hydrate_workspace", "extract", "apply_patch", "pty_exec_start",
        "resolve_exposed_port", "apply_manifest", "_write_new_file", "_resolve_exposed_port",
        "_read_bounded",
    }
)  # fmt: skip


class UpstreamSession(AgentsSessionAdapter):
    """`UnixLocalSandboxSession(state=...)`: our adapter. Their unix_local session works
    on the host folder without `start()`; ours needs a session, so the first call that
    needs one opens it (and the test's event loop's end closes it)."""

    def __init__(self, *, state: Any, **_: Any) -> None:
        if not isinstance(state, SandboxSessionState):
            state = upstream_state(manifest=state.manifest, snapshot=state.snapshot)
        _note()
        super().__init__(state=state, private_options={})
        _open_sessions.append(self)

    @classmethod
    def from_state(cls, state: Any, **_: Any) -> UpstreamSession:
        """Their `UnixLocalSandboxSession.from_state(state)`."""
        return cls(state=state)

    def __getattribute__(self, name: str) -> Any:
        value = object.__getattribute__(self, name)
        if name in _STARTING and asyncio.iscoroutinefunction(value):

            @functools.wraps(value)
            async def started(*args: Any, **kwargs: Any) -> Any:
                if not self._live():
                    await self._ensure_backend_started()
                return await value(*args, **kwargs)

            return started
        return value


_open_sessions: list[UpstreamSession] = []

REBOUND: dict[str, Any] = {
    "UnixLocalSandboxClient": UpstreamClient,
    "UnixLocalSandboxClientOptions": upstream_options,
    "UnixLocalSandboxSession": UpstreamSession,
    "UnixLocalSandboxSessionState": upstream_state,
}


_used: set[str] = set()
_current: list[str] = [""]
_report: list[str] = []


def _note() -> None:
    """Record that the running test built one of ours (so it is about our client)."""
    _used.add(_current[0])


def pytest_runtest_setup(item: pytest.Item) -> None:
    _current[0] = item.nodeid


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when == "call" or report.outcome != "passed":
        used = "ours" if report.nodeid in _used else "none"
        crash = getattr(report.longrepr, "reprcrash", None)
        message = " ".join(str(getattr(crash, "message", "")).split())[:300]
        _report.append(f"{report.outcome} {used} {report.nodeid}\t{message}")


def pytest_unconfigure(config: pytest.Config) -> None:
    path = config.getoption("--agents-sdk-report")
    if path:
        Path(path).write_text("\n".join(_report) + "\n")
    if _backend == "docker":
        _remove_run_containers()


def _remove_run_containers() -> None:
    """Remove the containers this run made (by `RUN_LABEL`), none of anyone else's."""
    import docker

    client = docker.APIClient(version="auto")
    try:
        for container in client.containers(
            all=True, filters={"label": f"{RUN_LABEL}={_run_token}"}
        ):
            client.remove_container(container["Id"], force=True, v=True)
    finally:
        client.close()


def _read_list() -> dict[str, tuple[str, str]]:
    """nodeid -> (status, reason) for this run's backend."""
    entries: dict[str, tuple[str, str]] = {}
    for raw in LIST_FILE.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        head, _, reason = line.partition(" | ")
        status, backends, nodeid = head.split(None, 2)
        if _backend in backends.split(","):
            entries[nodeid.strip()] = (status, reason.strip())
    return entries


def pytest_configure(config: pytest.Config) -> None:
    global _backend
    _backend = config.getoption("--agents-sdk-backend")
    tempfile.tempdir = None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for module in {item.module for item in items if isinstance(item, pytest.Function)}:
        for name, value in REBOUND.items():
            if hasattr(module, name):
                setattr(module, name, value)
    if config.getoption("--agents-sdk-all"):
        return
    listed = _read_list()
    kept: list[pytest.Item] = []
    dropped: list[pytest.Item] = []
    for item in items:
        status, reason = listed.get(item.nodeid, ("run", ""))
        if status == "not":
            dropped.append(item)
            continue
        if status == "diff":
            item.add_marker(pytest.mark.xfail(reason=f"deliberate difference: {reason}"))
        kept.append(item)
    config.hook.pytest_deselected(items=dropped)
    items[:] = kept


@pytest_asyncio.fixture(autouse=True, loop_scope="function")
async def _close_upstream_sessions() -> Any:
    yield
    while _open_sessions:
        session = _open_sessions.pop()
        if session._live():
            await session._shutdown_backend()
