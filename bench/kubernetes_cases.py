"""The kubernetes backend's benchmarks through the loopback API server
(`sandbox.testing.kubernetes_server`), each beside a raw baseline in the same run: the
same pods/exec WebSocket (v5 frames by hand over aiohttp) or the same create / watch /
delete calls, without the library.

On a real cluster both sides pay the API server's and the kubelet's hops (and a start
pays scheduling and the image pull), so the ratios are the figure to read; the absolute
numbers here are loopback ones.
"""

from __future__ import annotations

import json
import time
from typing import Any

import sandbox

from .measure import Figure

GROUP = "kubernetes"
TOKEN = "bench-token-0f9e8d7c"


def _available() -> str | None:
    import importlib.util

    for module in ("aiohttp", "kubernetes_asyncio"):
        if importlib.util.find_spec(module) is None:
            return f"{module} is not installed"
    return None


async def _raw_exec(server: Any, pod: str, argv: list[str], *, tty: bool) -> Any:
    import aiohttp

    http = aiohttp.ClientSession()
    params = [("command", a) for a in argv] + [
        ("stdin", "true" if tty else "false"),
        ("stdout", "true"),
        ("stderr", "false" if tty else "true"),
        ("tty", "true" if tty else "false"),
    ]
    ws = await http.ws_connect(
        f"{server.url}/api/v1/namespaces/default/pods/{pod}/exec",
        params=params,
        protocols=("v5.channel.k8s.io",),
        headers={"Authorization": f"Bearer {TOKEN}"},
    )
    return http, ws


def _wrapped(argv: list[str]) -> list[str]:
    """What the backend sends for `argv`: the prelude and the toolkit's wrapper (whose
    exit sweep reads /proc: the host's whole table here, a pod's few processes on a
    cluster), so the baseline does the same work in the sandbox."""
    from sandbox.backends.kubernetes import scripts
    from sandbox.backends.toolkit import new_tag, tag_environment, wrapper_argv

    tag = new_tag()
    return scripts.prelude_argv(wrapper_argv(tag, argv, set_tag=False), env=tag_environment(tag))


async def _read_until(ws: Any, want: bytes) -> None:
    got = bytearray()
    while want not in got:
        msg = await ws.receive()
        if msg.data and msg.data[0] == 1:
            got.extend(msg.data[1:])


async def _read_status(ws: Any) -> dict[str, Any]:
    while True:
        msg = await ws.receive()
        if msg.data and msg.data[:1] == b"\x03":
            status: dict[str, Any] = json.loads(msg.data[1:])
            return status


async def kubernetes_round_trip(cfg: Any) -> list[Figure]:
    """`cat` on a tty: write a line, wait `until` it is echoed and printed back."""
    if reason := _available():
        return [Figure(GROUP, f"skipped: {reason}", "-", False)]
    from sandbox.testing.kubernetes_server import KubernetesApiServer

    fig = Figure(GROUP, "cat: write + until reply (tty)", "ms", False)
    async with KubernetesApiServer(token=TOKEN) as server:
        kubeconfig = str(server.write_kubeconfig(f"{server._root}/kubeconfig"))
        for _ in range(cfg.rounds):
            async with sandbox.open_session(
                "kubernetes", kubeconfig=kubeconfig, image="busybox"
            ) as s:
                start = await s.pty_exec_start("cat", tty=True, yield_time_s=0.25)
                pid = start.process_id
                assert pid is not None
                times = []
                for i in range(cfg.round_trips):
                    want = f"ping{i}\r\nping{i}\r\n"
                    t0 = time.perf_counter()
                    reply = await s.pty_write_stdin(pid, f"ping{i}\n", until=want, yield_time_s=5)
                    times.append(time.perf_counter() - t0)
                    assert want in reply.output
                fig.ours.append(sorted(times)[len(times) // 2] * 1000)
                http, ws = await _raw_exec(server, str(s.pod_name), ["cat"], tty=True)  # type: ignore[attr-defined]
                times = []
                for i in range(cfg.round_trips):
                    t0 = time.perf_counter()
                    await ws.send_bytes(b"\x00" + f"ping{i}\n".encode())
                    await _read_until(ws, f"ping{i}\r\nping{i}\r\n".encode())
                    times.append(time.perf_counter() - t0)
                await ws.send_bytes(b"\x00\x04")
                await ws.close()
                await http.close()
                fig.baseline.append(sorted(times)[len(times) // 2] * 1000)
    fig.note = "baseline: the same exec, v5 frames by hand over aiohttp"
    return [fig]


async def kubernetes_start(cfg: Any) -> list[Figure]:
    """Start `true` on pipes and see it exit, one after another; and a whole session
    (pod create, watch until running, probe, delete) against raw calls."""
    if reason := _available():
        return [Figure(GROUP, f"skipped: {reason}", "-", False)]
    import aiohttp

    from sandbox.runner import runner_binary
    from sandbox.testing.kubernetes_server import KubernetesApiServer

    count = max(10, cfg.starts // 5)
    execs = Figure(GROUP, "start `true`, pipes", "calls/s", True)
    # Through the runner (docs/runner.md) where this install has one: one frame per
    # start over the link exec instead of an exec each; the same raw baseline.
    through_runner = (
        Figure(GROUP, "start `true`, pipes, runner", "calls/s", True)
        if runner_binary() is not None
        else None
    )
    pods = Figure(GROUP, "session: create pod, wait, delete", "ms", False)
    auth = {"Authorization": f"Bearer {TOKEN}"}
    async with KubernetesApiServer(token=TOKEN) as server:
        kubeconfig = str(server.write_kubeconfig(f"{server._root}/kubeconfig"))
        base = f"{server.url}/api/v1/namespaces/default/pods"
        for round_no in range(cfg.rounds):
            t0 = time.perf_counter()
            s = sandbox.open_session("kubernetes", kubeconfig=kubeconfig, image="busybox")
            async with s:
                pods.ours.append((time.perf_counter() - t0) * 1000)
                t0 = time.perf_counter()
                for _ in range(count):
                    update = await s.pty_exec_start("true")
                    assert update.process_id is None and update.exit_code == 0
                execs.ours.append(count / (time.perf_counter() - t0))
                t0 = time.perf_counter()
                for _ in range(count):
                    http, ws = await _raw_exec(
                        server, str(s.pod_name), _wrapped(["sh", "-c", "true"]), tty=False
                    )  # type: ignore[attr-defined]
                    assert (await _read_status(ws))["status"] == "Success"
                    await ws.close()
                    await http.close()
                execs.baseline.append(count / (time.perf_counter() - t0))
            if through_runner is not None:
                r = sandbox.open_session(
                    "kubernetes", kubeconfig=kubeconfig, image="busybox", runner=True
                )
                async with r:
                    t0 = time.perf_counter()
                    for _ in range(count):
                        update = await r.pty_exec_start("true")
                        assert update.process_id is None and update.exit_code == 0
                    through_runner.ours.append(count / (time.perf_counter() - t0))
                through_runner.baseline = execs.baseline
            t0 = time.perf_counter()
            async with aiohttp.ClientSession(headers=auth) as http:
                name = f"raw-{round_no}"
                manifest = {
                    "metadata": {"name": name},
                    "spec": {
                        "containers": [
                            {
                                "name": "c",
                                "image": "busybox",
                                "stdin": True,
                                "command": ["sh", "-c", "trap 'exit 0' TERM; read -r _"],
                            }
                        ]
                    },
                }
                async with http.post(base, json=manifest) as response:
                    assert response.status == 201
                while True:
                    async with http.get(f"{base}/{name}") as response:
                        if (await response.json())["status"].get("phase") == "Running":
                            break
                raw, ws = await _raw_exec(server, name, ["sh", "-c", ":"], tty=False)
                await _read_status(ws)
                await ws.close()
                await raw.close()
                async with http.delete(f"{base}/{name}", json={"gracePeriodSeconds": 2}):
                    pass
                while True:
                    async with http.get(f"{base}/{name}") as response:
                        if response.status == 404:
                            break
            pods.baseline.append((time.perf_counter() - t0) * 1000)
    execs.note = (
        "baseline: the same wrapped exec by hand (v5), read to its Status; the wrapper's "
        "exit sweep reads the host's /proc in the stand-in (no PID namespace)"
    )
    pods.note = "baseline: the same calls by hand, polling instead of watching"
    if through_runner is None:
        return [execs, pods]
    through_runner.note = (
        "target: <= 3 ms a start (>= 333 calls/s); baseline: the same wrapped exec by hand, "
        "as for the per-exec figure"
    )
    return [execs, through_runner, pods]


CASES = [kubernetes_round_trip, kubernetes_start]
