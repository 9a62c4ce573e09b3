"""Benchmarks of the SDK backends against their fakes: what the client keeps when a
peer sends more than the bound (a file that grew after its stat, read through e2b).

tracemalloc's peak, not RSS: what the client allocated for the read, without the
interpreter's arena reuse blurring a figure of a few MiB."""

from __future__ import annotations

import asyncio
import tempfile
import tracemalloc
from collections.abc import Callable
from pathlib import Path

from .local_cases import Config
from .measure import Figure

KEY = "bench_e2b_key_0123456789"
READ_LIMIT = 1 << 20


async def e2b_flooding_download(cfg: Config) -> list[Figure]:
    """Peak memory the client allocates while a download passes the read limit: ours
    (streamed, stopped past the limit) against the SDK's whole-body read of the same
    file (what a read without the bound keeps)."""
    try:
        import sandbox
        from sandbox.testing.e2b_fake import FakeE2B
    except ImportError:
        return []
    size_mb = 64 if cfg.quick else 256
    fig = Figure(
        "flooding peer",
        f"e2b read past a {READ_LIMIT >> 20} MiB limit of a file grown to {size_mb} MiB: "
        "client peak",
        "MiB",
        False,
    )
    with tempfile.TemporaryDirectory(prefix="bench-e2b-", dir=cfg.workdir) as root:
        async with FakeE2B(api_key=KEY, root=Path(root)) as fake:
            session = sandbox.open_session(
                "e2b", sandbox_class=fake.AsyncSandbox, api_key=KEY, read_limit_bytes=READ_LIMIT
            )
            async with session:
                home = Path(fake.sandbox_home(session.sandbox_id or ""))
                path = home / "big.bin"
                raw = session._client.sandbox  # the SDK surface itself, for the baseline
                for _ in range(cfg.rounds):
                    path.write_bytes(b"small")
                    gate = fake.block("files.read")
                    read = asyncio.ensure_future(_refused(session.read_file("big.bin")))
                    await gate.reached.wait()  # the stat said 5 bytes: now it grows
                    with path.open("ab") as handle:
                        for _ in range(size_mb):
                            handle.write(b"x" * (1 << 20))
                    fig.ours.append(await _peak(read, gate.release))
                    fig.baseline.append(await _peak(raw.files.read(str(path), format="bytes")))
    fig.note = "tracemalloc peak; baseline: the SDK's format='bytes' read of the same file"
    return [fig]


async def _refused(call: object) -> None:
    import sandbox

    try:
        await call  # type: ignore[misc]
    except sandbox.FileTooLargeError:
        return


async def _peak(call: object, go: Callable[[], None] | None = None) -> float:
    tracemalloc.start()
    try:
        if go is not None:
            go()
        await asyncio.ensure_future(call)  # type: ignore[arg-type]
        return tracemalloc.get_traced_memory()[1] / 2**20
    finally:
        tracemalloc.stop()


CASES = [e2b_flooding_download]
