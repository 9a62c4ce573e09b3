"""A loopback Kubernetes API server: test code that uses the `kubernetes` backend without
a cluster.

`KubernetesApiServer` is an aiohttp server on 127.0.0.1 (a free port) that answers the
few core/v1 calls the backend makes, over REAL local processes: a pod is a directory
(the workspace, standing for the container's `workingDir`, the cwd of every exec) and
the process groups started in it (its keep-alive "init" and its execs, PTYs through
`LocalProcess`). Each behaviour below follows the upstream source (docs/providers.md,
"Kubernetes", cites the files):

=============================================  ==========================================
`POST   /api/v1/namespaces/{ns}/pods`          201 and the pod (Pending); then, as the
                                               kubelet would, `PodScheduled`, a waiting
                                               `ContainerCreating`, the init started,
                                               `Running` with a running container
`GET    /api/v1/namespaces/{ns}/pods/{name}`   the pod, or a 404 `Status`
`GET    /api/v1/namespaces/{ns}/pods?watch=1`  one JSON event a line (ADDED for what
                                               exists unless `resourceVersion` is given,
                                               then MODIFIED, DELETED), `fieldSelector`
                                               `metadata.name=` and `labelSelector` k=v
`DELETE /api/v1/namespaces/{ns}/pods/{name}`   200 and the pod with `deletionTimestamp`;
                                               SIGTERM to the init, at least 2 s of grace
                                               (kubelet `minimumGracePeriodInSeconds`),
                                               SIGKILL, every exec killed with it, then
                                               the object goes (DELETED); a grace of 0
                                               removes it at once
`GET    .../pods/{name}/exec?command=...`      the WebSocket channel protocol: `v5`
                                               when offered (the apiserver's translator),
                                               else `v4` (kubelet), else a bare 403;
                                               an empty first frame on stdout; frames
                                               0-4, v5's CLOSE 255; the final `Status`
                                               on channel 3 only after the process
                                               exited AND its output reached EOF
=============================================  ==========================================

Every request needs ``Authorization: Bearer <token>`` (else a 401 `Status`). Errors are
`Status` objects (``{"kind": "Status", "status": "Failure", "reason", "code",
"message"}``). Closing an exec socket (a client gone, SIGKILLed or not) kills no
process (containerd `internal/cri/server/container_execsync.go` waits for its exit):
a pipes process's stdin is closed, a tty process keeps its terminal (no hangup:
`internal/cri/io/exec_io.go`), and its output is no longer read (a pipes process then
blocks once its pipe is full); either dies with its pod, or by the backend's kill
script. Each pod has a folder of its own standing for the container's /tmp, named by
`TMPDIR` in every process's environment (no mount namespace here; a container's
execs share its environment), where the durable lease file goes; and a short one for
the runner (docs/runner.md), named by `SANDBOX_RUNNER_DIR`, as a kubelet sets
`HOSTNAME` (a unix socket's path must stay under 108 bytes, which a pod's folder
under a test's tmp_path may not). An exec of the runner really runs it: the runner
detaches into its own session, carrying the pod's marker in its environment like every
process of the pod, so the pod's deletion kills it and every tree it keeps (the
container's end on a cluster), then removes its folder.

Fault knobs (changeable while serving):

- `forbid_exec`: 403 `Forbidden` on pods/exec (RBAC);
- `image_pull_fails`, `missing_images`: every image, or these, cannot be pulled (the
  container waits in `ErrImagePull`, then `ImagePullBackOff`);
- `unschedulable`: `PodScheduled=False`, reason `Unschedulable`;
- `v4_only`: a cluster without the v5 translator;
- `drop_exec_sockets()`: abort every exec socket, no close frame;
- `stall(point, where=, times=)`: requests wait at `create`, `exec`, `delete` or `watch` (a
  slow watch), new pods at `schedule` (a slow scheduler), until released; `reached`
  tells a test one is waiting; `where` picks which (an exec by its `command` argv);
- `ignore_term`: the init ignores SIGTERM, so a deletion waits out its grace;
- `stuck_deletion`: a graceful delete never completes (a lost node): only a forced one
  removes the pod;
- `status_padding`: bytes added to a failure Status (a peer flooding channel 3);
- `watch_floods`: the next N watches send one line of `flood_bytes` that never ends.

What a test can look at: `pods`, `deleted` (names), `requests` (method, path,
authorized: never headers), `exec_argvs`, `live_processes()`, `open_execs()`,
`runner_dirs` (every pod's runner folder, in creation order).

Not modelled: a tty process whose client went is still read, into the server's memory
(on a cluster it blocks once the terminal and FIFO buffers are full). A PID namespace:
a process that leaves its exec's session AND scrubs the pod's marker from its
environment is not found at deletion (on a cluster the container's end kills it); the
backend's kill script finds it by its own tag.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import hmac
import json
import os
import secrets
import signal
import tempfile
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from aiohttp import WSMsgType, web

from ..files.remove_tree import discard_tree
from ..local.process import LocalProcess
from .cloudflare_server import Stall

_V5 = "v5.channel.k8s.io"
_V4 = "v4.channel.k8s.io"
_STALL_POINTS = ("create", "exec", "delete", "watch", "schedule")
_POD_MARKER = "SANDBOX_STANDIN_POD"
_MIN_GRACE_S = 2
_FRAME_BYTES = 32 * 1024
# How long the kubelet's pull "retries" before it reports the back-off.
_BACKOFF_AFTER_S = 0.05
_WATCH_IDLE_S = 300.0
_WATCH_CACHE_EVENTS = 1000


@dataclass(eq=False)
class _FakePod:
    """One pod: its object, its directory, its processes."""

    namespace: str
    name: str
    obj: dict[str, Any]
    root: str
    init: asyncio.subprocess.Process | None = None
    processes: set[Any] = field(default_factory=set)
    deleting: asyncio.Task[None] | None = None
    lifecycle: asyncio.Task[None] | None = None
    gone: asyncio.Event = field(default_factory=asyncio.Event)
    runner_dir: str = ""

    @property
    def tmp(self) -> str:
        """The host directory standing for the container's /tmp (its `TMPDIR`)."""
        return self.root + ".tmp"

    @property
    def marker(self) -> str:
        """The value of `_POD_MARKER` in its processes' environment."""
        return str(self.obj["metadata"]["uid"])


def status_body(code: int, reason: str, message: str, **extra: Any) -> dict[str, Any]:
    """A metav1 `Status` (apimachinery `pkg/apis/meta/v1/types.go`)."""
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
        **extra,
    }


def _status_response(code: int, reason: str, message: str) -> web.Response:
    return web.json_response(status_body(code, reason, message), status=code)


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class KubernetesApiServer:
    """The loopback API server (see the module docstring). Use as an async context
    manager; `write_kubeconfig(path)` writes a kubeconfig that points at it."""

    def __init__(
        self,
        *,
        token: str,
        root: str | os.PathLike[str] | None = None,
        v4_only: bool = False,
    ) -> None:
        self._token = token
        self._given_root = root
        self._root = ""
        self._temp_root = False
        self.v4_only = v4_only
        self.forbid_exec = False
        self.image_pull_fails = False
        self.missing_images: set[str] = set()
        self.unschedulable = False
        self.ignore_term = False
        self.stuck_deletion = False
        self.status_padding = 0
        self.watch_floods = 0
        self.flood_bytes = 8 * 1024 * 1024
        self.pods: dict[tuple[str, str], _FakePod] = {}
        self.deleted: list[str] = []
        self.requests: list[tuple[str, str, bool]] = []
        self.exec_argvs: list[list[str]] = []
        self.runner_dirs: list[str] = []
        self._stalls: dict[str, Stall] = {}
        self._watchers: list[tuple[str, dict[str, str], asyncio.Queue[dict[str, Any]]]] = []
        self._sockets: set[web.WebSocketResponse] = set()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._version = 1
        # The watch cache: recent events, replayed to a watch from a resourceVersion.
        self._history: collections.deque[tuple[str, dict[str, Any]]] = collections.deque(
            maxlen=_WATCH_CACHE_EVENTS
        )
        self._runner: web.AppRunner | None = None
        self.url = ""

    def __repr__(self) -> str:
        return f"KubernetesApiServer(url={self.url!r})"

    # ---- serving --------------------------------------------------------------------

    async def start(self) -> None:
        """Bind 127.0.0.1 on a free port and serve."""
        if self._given_root is None:
            self._root = tempfile.mkdtemp(prefix="k8s-standin-")
            self._temp_root = True
        else:
            self._root = os.fspath(self._given_root)
            os.makedirs(self._root, exist_ok=True)
        app = web.Application(middlewares=[self._auth], client_max_size=1 << 20)
        base = "/api/v1/namespaces/{ns}/pods"
        app.add_routes(
            [
                web.post(base, self._create),
                web.get(base, self._list),
                web.get(base + "/{name}", self._get),
                web.delete(base + "/{name}", self._delete),
                web.get(base + "/{name}/exec", self._exec),
            ]
        )
        runner = web.AppRunner(app, access_log=None, handler_cancellation=True, shutdown_timeout=1)
        await runner.setup()
        try:
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        host, port = runner.addresses[0][:2]
        self.url = f"http://{host}:{port}"

    async def close(self) -> None:
        """Stop serving: release stalls, kill every pod's processes, remove the dirs."""
        for stall in self._stalls.values():
            stall.release()
        for pod in list(self.pods.values()):
            await self._destroy(pod)
        for ws in list(self._sockets):
            with contextlib.suppress(Exception):
                await ws.close()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.wait(self._tasks)
        if self._temp_root:
            discard_tree(self._root)

    async def __aenter__(self) -> KubernetesApiServer:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    def write_kubeconfig(
        self, path: str | os.PathLike[str], *, namespace: str = "default", context: str = "standin"
    ) -> Path:
        """A kubeconfig with one context whose user holds the bearer token."""
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "standin", "cluster": {"server": self.url}}],
            "users": [{"name": "standin", "user": {"token": self._token}}],
            "contexts": [
                {
                    "name": context,
                    "context": {"cluster": "standin", "user": "standin", "namespace": namespace},
                }
            ],
            "current-context": context,
        }
        target = Path(path)
        target.write_text(json.dumps(config), encoding="utf-8")  # JSON is YAML
        return target

    # ---- knobs and views ------------------------------------------------------------

    def stall(
        self,
        point: str,
        *,
        where: Callable[[Any], bool] | None = None,
        times: int | None = None,
    ) -> Stall:
        """Make requests wait at `point` until the returned stall is released; with
        `where`, only those it accepts (an exec's subject is its `command` argv); with
        `times`, only that many."""
        if point not in _STALL_POINTS:
            raise ValueError(f"unknown stall point {point!r}; known: {', '.join(_STALL_POINTS)}")
        stall = Stall(point, where=where, times=times)
        self._stalls[point] = stall
        return stall

    async def _maybe_stall(self, point: str, subject: Any = None) -> None:
        stall = self._stalls.get(point)
        if stall is not None and stall.catches(subject):
            await stall.park()

    def drop_exec_sockets(self) -> int:
        """Abort every open exec socket (no close frame); returns how many."""
        dropped = 0
        for ws in list(self._sockets):
            transport = getattr(ws, "_req", None)
            if transport is not None and transport.transport is not None:
                transport.transport.abort()
                dropped += 1
        return dropped

    def live_processes(self) -> int:
        """Processes of every pod (inits and execs) not yet gone."""
        return sum(len(p.processes) + (p.init is not None) for p in self.pods.values())

    def open_execs(self) -> int:
        """Exec sockets being served."""
        return len(self._sockets)

    def workspace(self, namespace: str, name: str) -> str:
        """The host directory standing for a pod's working directory."""
        return self.pods[(namespace, name)].root

    # ---- plumbing -------------------------------------------------------------------

    @web.middleware
    async def _auth(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        given = request.headers.get("Authorization", "")
        ok = hmac.compare_digest(given.encode(), f"Bearer {self._token}".encode())
        self.requests.append((request.method, request.path, ok))
        if not ok:
            return _status_response(401, "Unauthorized", "Unauthorized")
        return await handler(request)

    def _spawn_task(self, coro: Awaitable[Any]) -> asyncio.Task[Any]:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _touch(self, pod: _FakePod, kind: str = "MODIFIED") -> None:
        self._version += 1
        pod.obj["metadata"]["resourceVersion"] = str(self._version)
        event = {"type": kind, "object": json.loads(json.dumps(pod.obj))}
        self._history.append((pod.namespace, event))
        for namespace, selector, queue in list(self._watchers):
            if namespace == pod.namespace and _matches(pod.obj, selector):
                queue.put_nowait(event)

    def _pod(self, request: web.Request) -> _FakePod | None:
        return self.pods.get((request.match_info["ns"], request.match_info["name"]))

    def _not_found(self, name: str) -> web.Response:
        return _status_response(404, "NotFound", f'pods "{name}" not found')

    # ---- pods -----------------------------------------------------------------------

    async def _create(self, request: web.Request) -> web.StreamResponse:
        await self._maybe_stall("create")
        namespace = request.match_info["ns"]
        try:
            obj = await request.json()
        except ValueError:
            return _status_response(400, "BadRequest", "the body is not JSON")
        name = (obj.get("metadata") or {}).get("name") if isinstance(obj, dict) else None
        containers = (obj.get("spec") or {}).get("containers") if isinstance(obj, dict) else None
        if not isinstance(name, str) or not name or not containers:
            return _status_response(422, "Invalid", "Pod is invalid: name and containers needed")
        if (namespace, name) in self.pods:
            return _status_response(409, "AlreadyExists", f'pods "{name}" already exists')
        obj["metadata"].update(
            namespace=namespace, uid=secrets.token_hex(16), creationTimestamp=_now()
        )
        obj["status"] = {"phase": "Pending", "conditions": []}
        root = os.path.join(self._root, f"{namespace}.{name}")
        os.makedirs(root, exist_ok=False)
        pod = _FakePod(namespace, name, obj, root)
        os.makedirs(pod.tmp, exist_ok=False)
        pod.runner_dir = tempfile.mkdtemp(prefix="k8s-runner-")
        self.runner_dirs.append(pod.runner_dir)
        self.pods[(namespace, name)] = pod
        self._touch(pod, "ADDED")
        pod.lifecycle = self._spawn_task(self._bring_up(pod))
        return web.json_response(obj, status=201)

    async def _bring_up(self, pod: _FakePod) -> None:
        """What the scheduler and the kubelet do to a new pod, step by step."""
        await asyncio.sleep(0)
        await self._maybe_stall("schedule")
        status = pod.obj["status"]
        container = pod.obj["spec"]["containers"][0]
        cname = container.get("name", "c")
        if self.unschedulable:
            status["conditions"] = [
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "Unschedulable",
                    "message": "0/1 nodes are available: 1 Insufficient cpu.",
                }
            ]
            self._touch(pod)
            return
        status["conditions"] = [{"type": "PodScheduled", "status": "True"}]
        waiting = {"waiting": {"reason": "ContainerCreating"}}
        status["containerStatuses"] = [{"name": cname, "ready": False, "state": waiting}]
        self._touch(pod)
        image = container.get("image")
        if self.image_pull_fails or image in self.missing_images:
            message = f'failed to pull and unpack image "{image}": not found'
            status["containerStatuses"][0]["state"] = {
                "waiting": {"reason": "ErrImagePull", "message": message}
            }
            self._touch(pod)
            await asyncio.sleep(_BACKOFF_AFTER_S)
            status["containerStatuses"][0]["state"] = {
                "waiting": {
                    "reason": "ImagePullBackOff",
                    "message": f'Back-off pulling image "{image}"',
                }
            }
            self._touch(pod)
            return
        argv = list(container.get("command") or []) + list(container.get("args") or [])
        if self.ignore_term:
            argv = ["sh", "-c", "trap '' TERM; exec \"$@\"", "sh", *argv]
        pod.init = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.PIPE if container.get("stdin") else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
            cwd=pod.root,
            env=self._env(pod),
            start_new_session=True,
        )
        status["phase"] = "Running"
        status["containerStatuses"][0].update(
            ready=True, started=True, state={"running": {"startedAt": _now()}}
        )
        self._touch(pod)
        code = await pod.init.wait()
        if pod.deleting is None:
            # The init ended by itself: with restartPolicy Never the pod is over.
            status["phase"] = "Succeeded" if code == 0 else "Failed"
            status["containerStatuses"][0]["state"] = {"terminated": {"exitCode": code}}
            self._touch(pod)
            self._kill_members(pod)

    def _env(self, pod: _FakePod) -> dict[str, str]:
        return {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": pod.root,
            "HOSTNAME": pod.name,
            # No mount namespace: the container's /tmp is a folder of the pod's own,
            # named by TMPDIR (an image may set it; every exec of a container shares
            # the container's environment).
            "TMPDIR": pod.tmp,
            "SANDBOX_RUNNER_DIR": pod.runner_dir,
            _POD_MARKER: pod.marker,
        }

    async def _get(self, request: web.Request) -> web.StreamResponse:
        pod = self._pod(request)
        if pod is None:
            return self._not_found(request.match_info["name"])
        return web.json_response(pod.obj)

    async def _list(self, request: web.Request) -> web.StreamResponse:
        namespace = request.match_info["ns"]
        selector = _selector(request.query)
        pods = [
            p.obj
            for p in self.pods.values()
            if p.namespace == namespace and _matches(p.obj, selector)
        ]
        if request.query.get("watch") not in ("true", "1"):
            return web.json_response(
                {"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": pods}
            )
        await self._maybe_stall("watch")
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        if self.watch_floods > 0:
            # One line that never ends, written as the client takes it.
            self.watch_floods -= 1
            for _ in range(0, self.flood_bytes, 64 * 1024):
                await response.write(b"x" * (64 * 1024))
            return response
        queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        entry = (namespace, selector, queue)
        self._watchers.append(entry)
        try:
            since = request.query.get("resourceVersion")
            if not since:
                for obj in pods:
                    queue.put_nowait({"type": "ADDED", "object": obj})
            else:
                for ns, event in self._history:
                    obj = event["object"]
                    if (
                        ns == namespace
                        and _matches(obj, selector)
                        and int(obj["metadata"]["resourceVersion"]) > int(since)
                    ):
                        queue.put_nowait(event)
            while True:
                try:
                    async with asyncio.timeout(_WATCH_IDLE_S):
                        event = await queue.get()
                except TimeoutError:
                    break  # the server ends idle watches; the client watches anew
                await self._maybe_stall("watch")
                await response.write(json.dumps(event).encode() + b"\n")
        finally:
            self._watchers.remove(entry)
        return response

    async def _delete(self, request: web.Request) -> web.StreamResponse:
        await self._maybe_stall("delete")
        pod = self._pod(request)
        if pod is None:
            return self._not_found(request.match_info["name"])
        grace: int | None = None
        if request.can_read_body:
            with contextlib.suppress(ValueError):
                body = await request.json()
                if isinstance(body, dict) and isinstance(body.get("gracePeriodSeconds"), int):
                    grace = body["gracePeriodSeconds"]
        if grace is None:
            grace = int(pod.obj["spec"].get("terminationGracePeriodSeconds", 30))
        if grace == 0:
            obj = json.loads(json.dumps(pod.obj))
            await self._destroy(pod)
            return web.json_response(obj)
        meta = pod.obj["metadata"]
        if pod.deleting is None:
            meta["deletionTimestamp"] = _now()
            meta["deletionGracePeriodSeconds"] = grace
            self._touch(pod)
            if self.stuck_deletion:
                # A node that never confirms: only a forced delete removes the object.
                pod.deleting = self._spawn_task(asyncio.Event().wait())
            else:
                pod.deleting = self._spawn_task(self._terminate(pod, max(grace, _MIN_GRACE_S)))
        return web.json_response(pod.obj)

    async def _terminate(self, pod: _FakePod, grace_s: float) -> None:
        """The kubelet's kill: SIGTERM to the init, the grace, SIGKILL, then the rest."""
        init = pod.init
        if init is not None and init.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                init.send_signal(signal.SIGTERM)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(grace_s):
                    await init.wait()
        await self._destroy(pod)

    async def _destroy(self, pod: _FakePod) -> None:
        """Kill everything of the pod, forget it, tell the watchers."""
        if self.pods.get((pod.namespace, pod.name)) is not pod:
            return
        del self.pods[(pod.namespace, pod.name)]
        init, pod.init = pod.init, None
        if init is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(init.pid, signal.SIGKILL)
            self._kill_members(pod)
            with contextlib.suppress(Exception):
                await init.wait()
            _close_transport(init)
        self._kill_members(pod)
        for process in list(pod.processes):
            await _reap(process)
        pod.processes.clear()
        for task in (pod.lifecycle, pod.deleting):
            if task is not None and task is not asyncio.current_task() and not task.done():
                task.cancel()
        self.deleted.append(pod.name)
        self._touch(pod, "DELETED")
        pod.gone.set()
        discard_tree(pod.root)
        discard_tree(pod.tmp)
        if pod.runner_dir:
            discard_tree(pod.runner_dir)

    def _kill_members(self, pod: _FakePod) -> None:
        """SIGKILL the pod's process groups and whatever carries its marker (what a
        container's end does through its PID namespace), until a look finds nobody."""
        groups = {getattr(p, "pid", 0) for p in pod.processes}
        if pod.init is not None:
            groups.add(pod.init.pid)
        for pid in groups:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                if pid > 0:
                    os.killpg(pid, signal.SIGKILL)
        for _ in range(16):
            found = _marked(pod.marker, groups)
            if not found:
                break
            for pid in found:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)

    # ---- exec -----------------------------------------------------------------------

    async def _exec(self, request: web.Request) -> web.StreamResponse:
        await self._maybe_stall("exec", request.query.getall("command", []))
        pod = self._pod(request)
        name = request.match_info["name"]
        if pod is None:
            return self._not_found(name)
        if self.forbid_exec:
            return _status_response(
                403,
                "Forbidden",
                f'pods "{name}" is forbidden: User "standin" cannot create resource '
                f'"pods/exec" in API group "" in the namespace "{pod.namespace}"',
            )
        if pod.init is None or pod.deleting is not None:
            return _status_response(
                400, "BadRequest", f"pod {name} is not running, cannot exec into it"
            )
        query = request.query
        argv = query.getall("command", [])
        if not argv:
            return _status_response(400, "BadRequest", "you must specify at least 1 command")
        offered = [p.strip() for p in request.headers.get("Sec-WebSocket-Protocol", "").split(",")]
        if _V5 in offered and not self.v4_only:
            protocol = _V5
        elif _V4 in offered:
            protocol = _V4
        else:
            # golang.org/x/net/websocket: no acceptable subprotocol, a bare 403.
            return web.Response(status=403)
        flags = {k: query.get(k, "") in ("true", "1") for k in ("stdin", "stdout", "stderr", "tty")}
        ws = web.WebSocketResponse(protocols=[protocol], max_msg_size=4 * 1024 * 1024)
        await ws.prepare(request)
        self._sockets.add(ws)
        self.exec_argvs.append(argv)
        try:
            await _ExecSession(self, pod, ws, protocol, argv, **flags).run()
        finally:
            self._sockets.discard(ws)
        return ws


class _ExecSession:
    """One exec: a real process whose streams travel as channel frames."""

    def __init__(
        self,
        server: KubernetesApiServer,
        pod: _FakePod,
        ws: web.WebSocketResponse,
        protocol: str,
        argv: list[str],
        *,
        stdin: bool,
        stdout: bool,
        stderr: bool,
        tty: bool,
    ) -> None:
        self.server = server
        self.pod = pod
        self.ws = ws
        self.protocol = protocol
        self.argv = argv
        self.stdin = stdin
        self.stdout = stdout
        self.stderr = stderr and not tty
        self.tty = tty
        self.out: asyncio.Queue[tuple[int, bytes]] = asyncio.Queue()

    async def _send(self, channel: int, data: bytes) -> None:
        if not self.ws.closed:
            for start in range(0, max(len(data), 1), _FRAME_BYTES):
                await self.ws.send_bytes(bytes([channel]) + data[start : start + _FRAME_BYTES])

    async def run(self) -> None:
        await self._send(1 if self.stdout else 2, b"")  # wsstream: an empty first frame
        try:
            process = await self._start()
        except OSError as exc:
            message = (
                "failed to exec in container: OCI runtime exec failed: exec failed: "
                f'exec: "{self.argv[0]}": {exc.strerror}: unknown'
            )
            await self._send(3, json.dumps(status_body(500, "InternalError", message)).encode())
            await self.ws.close()
            return
        self.pod.processes.add(process)
        reader = asyncio.ensure_future(self._read_client(process))
        try:
            code = await self._pump(process)
            await self._send(3, json.dumps(self._exit_status(code)).encode())
            await self.ws.close()
        except (ConnectionError, RuntimeError):
            pass  # the client went away: the process goes on (it dies with its pod)
        finally:
            reader.cancel()
            with contextlib.suppress(BaseException):
                await reader
            if not self.tty or _exited(process):
                if isinstance(process, LocalProcess) and _exited(process):
                    process.close(kill_group=False)
                if _exited(process):
                    self.pod.processes.discard(process)
                    if not isinstance(process, LocalProcess):
                        _close_transport(process)

    async def _start(self) -> Any:
        env = self.server._env(self.pod)
        if self.tty:
            process = LocalProcess.spawn(
                self.argv,
                tty=True,
                env=env,
                cwd=self.pod.root,
                on_stdout=lambda data: self.out.put_nowait((1, data)),
                on_exit=lambda code: self.out.put_nowait((-1, b"")),
                on_eof=lambda: self.out.put_nowait((-2, b"")),
            )
            return process
        pipe = asyncio.subprocess.PIPE
        return await asyncio.create_subprocess_exec(
            *self.argv,
            stdin=pipe if self.stdin else asyncio.subprocess.DEVNULL,
            stdout=pipe if self.stdout else asyncio.subprocess.DEVNULL,
            stderr=pipe if self.stderr else asyncio.subprocess.DEVNULL,
            cwd=self.pod.root,
            env=env,
            start_new_session=True,
            preexec_fn=_default_signals,
        )

    async def _pump(self, process: Any) -> int:
        """Forward output until the process exited AND its output ended."""
        if isinstance(process, LocalProcess):
            exited = eof = False
            while not (exited and eof):
                channel, data = await self.out.get()
                if channel == -1:
                    exited = True
                elif channel == -2:
                    eof = True
                else:
                    await self._send(channel, data)
            return await process.wait()
        streams = [(1, process.stdout), (2, process.stderr)]
        copies = [
            asyncio.ensure_future(self._copy(channel, stream))
            for channel, stream in streams
            if stream is not None
        ]
        try:
            await asyncio.gather(*copies)
            code: int = await process.wait()
        finally:
            for copy in copies:
                copy.cancel()
        return 128 - code if code < 0 else code

    async def _copy(self, channel: int, stream: asyncio.StreamReader) -> None:
        while chunk := await stream.read(_FRAME_BYTES):
            await self._send(channel, chunk)

    async def _read_client(self, process: Any) -> None:
        try:
            async for msg in self.ws:
                if msg.type != WSMsgType.BINARY or not msg.data:
                    continue
                channel, payload = msg.data[0], msg.data[1:]
                if channel == 0 and self.stdin:
                    await _write(process, payload)
                elif channel == 4 and self.tty and isinstance(process, LocalProcess):
                    size = json.loads(payload)
                    process.resize(int(size["Height"]), int(size["Width"]))
                elif channel == 255 and self.protocol == _V5 and payload[:1] == b"\x00":
                    _close_stdin(process)
        finally:
            # The socket ended: a pipes process's stdin closes; a tty process runs on.
            if not self.tty:
                _close_stdin(process)

    def _exit_status(self, code: int) -> dict[str, Any]:
        if code == 0:
            return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success"}
        message = (
            "command terminated with non-zero exit code: error executing command "
            f"[{' '.join(self.argv)}], exit code {code}"
        ) + " " * self.server.status_padding
        # kubelet `ServeExec`: no `code` in this Status, the exit code as a cause.
        return {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": message,
            "reason": "NonZeroExitCode",
            "details": {"causes": [{"reason": "ExitCode", "message": str(code)}]},
        }


def _default_signals() -> None:  # pragma: no cover - runs in the child
    # A container's processes start with default dispositions, whatever the server's
    # own (a background job of a non-interactive shell ignores SIGINT and SIGQUIT).
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGQUIT, signal.SIG_DFL)


def _exited(process: Any) -> bool:
    if isinstance(process, LocalProcess):
        return process.exited
    return process.returncode is not None


async def _write(process: Any, data: bytes) -> None:
    if isinstance(process, LocalProcess):
        with contextlib.suppress(Exception):
            await process.write(data)
        return
    if process.stdin is not None and not process.stdin.is_closing():
        with contextlib.suppress(ConnectionError):
            process.stdin.write(data)
            await process.stdin.drain()


def _close_stdin(process: Any) -> None:
    if not isinstance(process, LocalProcess) and process.stdin is not None:
        process.stdin.close()


async def _reap(process: Any) -> None:
    if isinstance(process, LocalProcess):
        process.close()
        return
    with contextlib.suppress(ProcessLookupError):
        process.kill()
    await process.wait()
    _close_transport(process)


def _close_transport(process: Any) -> None:
    # asyncio keeps a subprocess's pipes (and so its transport) open until each is
    # read to EOF; a pipe nobody reads any more is closed here, not by the GC later.
    transport = getattr(process, "_transport", None)
    if transport is not None:
        transport.close()


def _selector(query: Any) -> dict[str, str]:
    selector: dict[str, str] = {}
    for key, prefix in (("fieldSelector", "field:"), ("labelSelector", "label:")):
        for part in (query.get(key) or "").split(","):
            name, _, value = part.partition("=")
            if name:
                selector[prefix + name.strip()] = value.strip()
    return selector


def _matches(obj: dict[str, Any], selector: dict[str, str]) -> bool:
    meta = obj.get("metadata") or {}
    for key, value in selector.items():
        if key == "field:metadata.name" and meta.get("name") != value:
            return False
        if key.startswith("label:") and (meta.get("labels") or {}).get(key[6:]) != value:
            return False
    return True


def _marked(marker: str, groups: set[int]) -> set[int]:
    """Live processes carrying `_POD_MARKER=marker`, or in one of `groups`' sessions,
    and their descendants."""
    needle = f"{_POD_MARKER}={marker}".encode()
    table: dict[int, tuple[int, int]] = {}
    found: set[int] = set()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        pid = int(name)
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
            if fields[0] == b"Z":
                continue
            table[pid] = (int(fields[1]), int(fields[3]))
            if table[pid][1] in groups:
                found.add(pid)
                continue
            with open(f"/proc/{pid}/environ", "rb") as f:
                if needle in f.read(1 << 20).split(b"\0"):
                    found.add(pid)
        except (OSError, IndexError, ValueError):
            continue
    grew = True
    while grew:
        grew = False
        for pid, (ppid, _) in table.items():
            if pid not in found and ppid in found:
                found.add(pid)
                grew = True
    found.discard(os.getpid())
    return found


__all__ = ["KubernetesApiServer", "status_body"]
