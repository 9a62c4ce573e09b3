"""The docker backend's benchmarks, each beside a raw baseline in the same run: the
same `docker exec` driven directly through the docker SDK (exec_create, exec_start with
socket=True, the socket read with the event loop), without the library.

Needs a reachable engine and busybox-static (the test image is built locally); without
them the case reports a skipped figure.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import itertools
import socket
import tarfile
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import sandbox

from .measure import Figure

GROUP = "docker"


def _available() -> str | None:
    try:
        import docker

        client = docker.from_env()
        client.ping()
        client.close()
        from sandbox.testing.docker_image import ensure_busybox_image

        ensure_busybox_image()
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


@asynccontextmanager
async def container() -> AsyncIterator[tuple[Any, str]]:
    """A fresh container of the test image, removed afterwards: (api, id)."""
    import docker

    from sandbox.testing.docker_image import ensure_busybox_image

    api = docker.APIClient(version="auto")
    info = api.create_container(
        ensure_busybox_image(),
        command=["2147483647"],
        entrypoint=["sleep"],
        host_config=api.create_host_config(init=True, network_mode="none"),
        labels={"sandbox.bench": "1"},
    )
    try:
        api.start(info["Id"])
        yield api, info["Id"]
    finally:
        api.remove_container(info["Id"], force=True)
        api.close()


class RawExec:
    """The baseline: one attached exec through the SDK, its socket read by the loop."""

    def __init__(self, api: Any, container_id: str, argv: list[str], *, tty: bool) -> None:
        self.api, self.container_id, self.argv, self.tty = api, container_id, argv, tty
        self.data = bytearray()
        self.count = 0
        self.keep = True
        self.eof = asyncio.Event()
        self.wake: asyncio.Future[None] | None = None

    async def start(self) -> None:
        def blocking() -> Any:
            exec_id = self.api.exec_create(
                self.container_id, self.argv, stdin=self.tty, tty=self.tty
            )["Id"]
            self.exec_id = exec_id
            return self.api.exec_start(exec_id, socket=True, tty=self.tty)

        self.raw = await asyncio.to_thread(blocking)
        self.sock: socket.socket = self.raw._sock
        self.sock.setblocking(False)
        self.loop = asyncio.get_running_loop()
        self.loop.add_reader(self.sock.fileno(), self._readable)

    def _readable(self) -> None:
        for _ in range(8):
            try:
                chunk = self.sock.recv(256 * 1024)
            except BlockingIOError:
                return
            if not chunk:
                self.loop.remove_reader(self.sock.fileno())
                self.eof.set()
                return
            self.count += len(chunk)
            if self.keep:
                self.data += chunk
            if self.wake is not None and not self.wake.done():
                self.wake.set_result(None)

    async def write(self, data: bytes) -> None:
        await self.loop.sock_sendall(self.sock, data)

    async def read_until(self, marker: bytes) -> None:
        while marker not in self.data:
            self.wake = self.loop.create_future()
            await self.wake

    async def finish(self) -> int:
        await self.eof.wait()
        info = await asyncio.to_thread(self.api.exec_inspect, self.exec_id)
        return int(info["ExitCode"])

    def close(self) -> None:
        if not self.eof.is_set():
            self.loop.remove_reader(self.sock.fileno())
        self.sock.close()
        self.raw.close()


def _payload(size: int) -> tuple[bytes, str]:
    line = bytes(range(33, 127)) * 1000
    data = (line * (size // len(line) + 1))[:size]
    return data, hashlib.sha256(data).hexdigest()


def _put(api: Any, container_id: str, path: str, data: bytes) -> None:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        info = tarfile.TarInfo(path.rsplit("/", 1)[1])
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    api.put_archive(container_id, path.rsplit("/", 1)[0] or "/", buffer.getvalue())


def _session(container_id: str, **options: Any) -> sandbox.BaseSandboxSession:
    return sandbox.open_session("docker", container=container_id, workdir="/tmp", **options)


def _modes() -> list[tuple[str, dict[str, Any]]]:
    """The per-exec path (`runner=False`; the runner is the default now), and the runner
    (docs/runner.md) where this install has one: the same figures for both, against the
    same raw baseline."""
    from sandbox.runner import runner_binary

    modes: list[tuple[str, dict[str, Any]]] = [("", {"runner": False})]
    if runner_binary() is not None:
        modes.append((", runner", {"runner": True}))
    return modes


async def docker_round_trip(cfg: Any) -> list[Figure]:
    """`cat` on a tty: write a line, wait `until` it is echoed and printed back."""
    reason = _available()
    if reason:
        return [Figure(GROUP, f"skipped: {reason}", "-", False)]
    fig = Figure(GROUP, "cat: write + until reply (tty)", "ms", False)
    async with container() as (api, cid):
        for _ in range(cfg.rounds):
            async with _session(cid) as s:
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
            raw = RawExec(api, cid, ["cat"], tty=True)
            await raw.start()
            times = []
            for i in range(cfg.round_trips):
                raw.data.clear()
                t0 = time.perf_counter()
                await raw.write(f"ping{i}\n".encode())
                await raw.read_until(f"ping{i}\r\nping{i}\r\n".encode())
                times.append(time.perf_counter() - t0)
            raw.close()
            fig.baseline.append(sorted(times)[len(times) // 2] * 1000)
    fig.note = "baseline: the same exec through the docker SDK's raw socket"
    return [fig]


async def docker_throughput(cfg: Any) -> list[Figure]:
    """Drain `cat FILE` (tty and pipes) and verify every byte."""
    reason = _available()
    if reason:
        return [Figure(GROUP, f"skipped: {reason}", "-", False)]
    size = cfg.drain_mb * 1_000_000
    data, digest = _payload(size)
    figures = []
    async with container() as (api, cid):
        await asyncio.to_thread(_put, api, cid, "/tmp/payload.bin", data)
        for (suffix, mode), tty in itertools.product(_modes(), (True, False)):
            label = ("pty" if tty else "pipes (multiplexed)") + suffix
            fig = Figure(GROUP, f"drain {cfg.drain_mb} MB, {label}", "MB/s", True)
            for _ in range(cfg.rounds):
                async with _session(cid, output_limit_bytes=size + (1 << 20), **mode) as s:
                    t0 = time.perf_counter()
                    update = await s.pty_exec_start(
                        "cat /tmp/payload.bin", tty=tty, yield_time_s=0.25
                    )
                    parts = [update.output]
                    while update.process_id is not None:
                        update = await s.pty_write_stdin(update.process_id, "", yield_time_s=0.25)
                        parts.append(update.output)
                    elapsed = time.perf_counter() - t0
                    got = "".join(parts).encode()
                    assert hashlib.sha256(got).hexdigest() == digest, "bytes verified"
                fig.ours.append(size / 1e6 / elapsed)
                raw = RawExec(api, cid, ["cat", "/tmp/payload.bin"], tty=tty)
                t0 = time.perf_counter()
                await raw.start()
                assert await raw.finish() == 0
                elapsed = time.perf_counter() - t0
                if tty:
                    assert hashlib.sha256(raw.data).hexdigest() == digest
                raw.close()
                fig.baseline.append(size / 1e6 / elapsed)
            fig.note = "baseline: raw socket read to EOF (pipes: frames not decoded)"
            figures.append(fig)
    return figures


async def docker_start(cfg: Any) -> list[Figure]:
    """Start `true` and see it exit, one after another."""
    reason = _available()
    if reason:
        return [Figure(GROUP, f"skipped: {reason}", "-", False)]
    count = max(10, cfg.starts // 5)
    figures = []
    async with container() as (api, cid):
        for (suffix, mode), tty in itertools.product(_modes(), (True, False)):
            label = ("pty" if tty else "pipes") + suffix
            fig = Figure(GROUP, f"start `true`, {label}", "calls/s", True)
            for _ in range(cfg.rounds):
                async with _session(cid, **mode) as s:
                    t0 = time.perf_counter()
                    for _ in range(count):
                        update = await s.pty_exec_start("true", tty=tty)
                        assert update.process_id is None and update.exit_code == 0
                    fig.ours.append(count / (time.perf_counter() - t0))
                t0 = time.perf_counter()
                for _ in range(count):
                    raw = RawExec(api, cid, ["true"], tty=tty)
                    await raw.start()
                    assert await raw.finish() == 0
                    raw.close()
                fig.baseline.append(count / (time.perf_counter() - t0))
            figures.append(fig)
    return figures


async def docker_scale(cfg: Any) -> list[Figure]:
    """64 tty PTYs started at once, one echo through each, then terminate-all."""
    reason = _available()
    if reason:
        return [Figure(GROUP, f"skipped: {reason}", "-", False)]
    figures = []
    for suffix, mode in _modes():
        figures += await _scale(cfg, suffix, mode)
    return figures


async def _scale(cfg: Any, suffix: str, mode: dict[str, Any]) -> list[Figure]:
    start = Figure(GROUP, f"64 PTYs: start at once + echo through each{suffix}", "ms", False)
    stop = Figure(GROUP, f"pty_terminate_all, 64 live{suffix}", "ms", False)
    async with container() as (api, cid):
        for _ in range(cfg.rounds):
            async with _session(cid, terminate_grace_s=0.5, **mode) as s:
                t0 = time.perf_counter()
                ups = await asyncio.gather(
                    *(s.pty_exec_start("echo r; exec cat", tty=True, until="r") for _ in range(64))
                )
                await asyncio.gather(
                    *(
                        s.pty_write_stdin(u.process_id, "x\n", until="x\r\nx\r\n")
                        for u in ups
                        if u.process_id is not None
                    )
                )
                start.ours.append((time.perf_counter() - t0) * 1000)
                t0 = time.perf_counter()
                await s.pty_terminate_all()
                stop.ours.append((time.perf_counter() - t0) * 1000)
            t0 = time.perf_counter()
            raws = [
                RawExec(api, cid, ["sh", "-c", "echo r; exec cat"], tty=True) for _ in range(64)
            ]
            await asyncio.gather(*(r.start() for r in raws))
            await asyncio.gather(*(r.read_until(b"r") for r in raws))
            for r in raws:
                r.data.clear()
            await asyncio.gather(*(r.write(b"x\n") for r in raws))
            await asyncio.gather(*(r.read_until(b"x\r\nx\r\n") for r in raws))
            start.baseline.append((time.perf_counter() - t0) * 1000)
            t0 = time.perf_counter()
            await asyncio.to_thread(_kill_all, api, cid)
            await asyncio.gather(*(r.eof.wait() for r in raws))
            stop.baseline.append((time.perf_counter() - t0) * 1000)
            for r in raws:
                r.close()
    start.note = "baseline: 64 raw SDK execs (threads from asyncio's default pool)"
    stop.note = "baseline: one exec that SIGKILLs every cat, until all sockets close"
    return [start, stop]


def _kill_all(api: Any, container_id: str) -> None:
    exec_id = api.exec_create(container_id, ["sh", "-c", "kill -9 $(pidof cat)"])["Id"]
    api.exec_start(exec_id)


def _pss_bytes(pid: int) -> int:
    """A host-visible container process's proportional set size (its shared pages
    divided among their users, so a forked keeper's pages are not counted twice)."""
    with open(f"/proc/{pid}/smaps_rollup") as rollup:
        for line in rollup:
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    return 0


def _host_pids(api: Any, container_id: str, needle: str) -> list[int]:
    """The host pids of the container's processes whose command line holds `needle`."""
    top = api.top(container_id, ps_args="-o pid,args")
    titles = top["Titles"]
    pid_at, args_at = titles.index("PID"), titles.index("COMMAND")
    return [int(row[pid_at]) for row in top.get("Processes") or [] if needle in row[args_at]]


async def _resume_and_read(api: Any, cid: str, payload: str) -> float:
    """Start a process that prints `payload`'s file only after its client detached,
    resume once it has, and return the seconds from `resume_session` to its last byte."""
    s = _session(cid, runner=True, output_limit_bytes=4 << 20)
    await s.start()
    started = await s.pty_exec_start(
        f"while [ ! -e /tmp/go ]; do sleep 0.01; done; cat {payload}; echo; echo END-MARK; "
        "touch /tmp/printed; exec sleep 600",
        yield_time_s=0,
    )
    assert started.process_id is not None
    ref = await s.detach()
    await asyncio.to_thread(_exec_code, api, cid, ["touch", "/tmp/go"])
    while await asyncio.to_thread(_exec_code, api, cid, ["test", "-e", "/tmp/printed"]):
        await asyncio.sleep(0.02)
    t0 = time.perf_counter()
    async with sandbox.resume_session(ref) as resumed:
        update = await resumed.pty_write_stdin(
            started.process_id, "", until="END-MARK", yield_time_s=30
        )
        elapsed = time.perf_counter() - t0
        assert "END-MARK" in update.output
        await resumed.pty_terminate_all()
    await asyncio.to_thread(_exec_code, api, cid, ["rm", "-f", "/tmp/printed", "/tmp/go"])
    return elapsed


async def docker_runner_reattach(cfg: Any) -> list[Figure]:
    """Resume a session whose process printed 1 MiB while no client followed it: the
    time until its last byte is back, against the same resume of a process that printed
    nothing meanwhile (the difference is the replay)."""
    from sandbox.runner import runner_binary

    reason = _available() or (None if runner_binary() else "the runner is not built")
    if reason:
        return [Figure(GROUP, f"skipped: {reason}", "-", False)]
    fig = Figure(GROUP, "resume + reattach a process holding 1 MiB, runner", "ms", False)
    async with container() as (api, cid):
        await asyncio.to_thread(_put, api, cid, "/tmp/one-mib.bin", b"a" * (1 << 20))
        await asyncio.to_thread(_put, api, cid, "/tmp/nothing.bin", b"")
        for _ in range(cfg.rounds):
            fig.ours.append(await _resume_and_read(api, cid, "/tmp/one-mib.bin") * 1000)
            fig.baseline.append(await _resume_and_read(api, cid, "/tmp/nothing.bin") * 1000)
    fig.note = "baseline: the same resume of a process that printed nothing while detached"
    return [fig]


async def docker_runner_memory(cfg: Any) -> list[Figure]:
    """The runner's memory (its keepers included, PSS) with 64 idle processes, against
    the 64 processes' own."""
    from sandbox.runner import runner_binary

    reason = _available() or (None if runner_binary() else "the runner is not built")
    if reason:
        return [Figure(GROUP, f"skipped: {reason}", "-", False)]
    fig = Figure(GROUP, "runner memory, 64 idle processes (PSS)", "MiB", False)
    async with container() as (api, cid):
        for _ in range(cfg.rounds):
            async with _session(cid, runner=True) as s:
                for _ in range(64):
                    await s.pty_exec_start("exec sleep 600", tty=True, yield_time_s=0)
                await asyncio.sleep(0.2)
                runner = _host_pids(api, cid, ".sandbox-runner-")
                sleeps = _host_pids(api, cid, "sleep 600")
                fig.ours.append(sum(map(_pss_bytes, runner)) / 2**20)
                fig.baseline.append(sum(map(_pss_bytes, sleeps)) / 2**20)
                await s.pty_terminate_all()
    fig.note = "ours: the runner and its 64 keepers; baseline: the 64 sleeps themselves"
    return [fig]


def _exec_code(api: Any, container_id: str, argv: list[str]) -> int:
    exec_id = api.exec_create(container_id, argv)["Id"]
    api.exec_start(exec_id)
    return int(api.exec_inspect(exec_id)["ExitCode"])


CASES = [
    docker_round_trip,
    docker_throughput,
    docker_start,
    docker_scale,
    docker_runner_reattach,
    docker_runner_memory,
]
