"""A process in the sandbox swaps a folder for a symlink to a host folder in a tight loop
(`renameat2(RENAME_EXCHANGE)`) while the host reads and writes through that folder:
nothing may land outside the workspace, no host content may come back, and every
failure must be a `SandboxError` (issue 12, item 1).

Checked through real sessions (unconfined and in the bubblewrap jail, where the kernel
has openat2) and directly on the fallback walk that older kernels get.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

import sandbox
from sandbox.backends.unix_local import confine, safe_open
from tests.conftest import skip_or_fail

INSIDE = b"inside the workspace\n"
HOST_SECRET = b"HOST SECRET, never to be returned\n"
ROUNDS = 1500
BUDGET_S = 60.0
ENOUGH = 40  # refused AND succeeded operations after which the race has been shown

# Swaps `d` (a folder) and `swap` (a symlink to the host folder) until `stop` exists or
# the time is up; prints "swapping" once it runs. Exits with the errno if a swap fails.
SWAPPER = r"""
import ctypes, os, sys, time
libc = ctypes.CDLL(None, use_errno=True)
deadline = time.monotonic() + float(sys.argv[1])
print("swapping", flush=True)
swaps = 0
while time.monotonic() < deadline and not os.path.exists("stop"):
    for _ in range(200):
        if libc.renameat2(-100, b"d", -100, b"swap", 2) != 0:  # AT_FDCWD, RENAME_EXCHANGE
            sys.exit(ctypes.get_errno())
        swaps += 1
print("swaps", swaps, flush=True)
"""


def _prepare(workspace: Path, host: Path) -> None:
    host.mkdir()
    (host / "secret.txt").write_bytes(HOST_SECRET)
    (workspace / "d").mkdir(parents=True)
    (workspace / "d" / "secret.txt").write_bytes(INSIDE)
    (workspace / "swap").symlink_to(host)
    (workspace / "swapper.py").write_text(SWAPPER)


def _outcome_counts(outcomes: list[str]) -> tuple[int, int]:
    return outcomes.count("ok"), len(outcomes) - outcomes.count("ok")


def _assert_host_untouched(host: Path) -> None:
    assert sorted(p.name for p in host.iterdir()) == ["secret.txt"], "a write escaped"
    assert (host / "secret.txt").read_bytes() == HOST_SECRET


@contextlib.asynccontextmanager
async def _swapping(session: sandbox.BaseSandboxSession) -> AsyncIterator[None]:
    update = await session.pty_exec_start(
        f"exec python3 swapper.py {BUDGET_S + 30:g}", until="swapping", yield_time_s=30
    )
    assert update.process_id is not None and "swapping" in update.output, update.output
    try:
        yield
    finally:
        await session.write_file("stop", "")
        with contextlib.suppress(sandbox.PtyProcessNotFoundError):
            final = await session.pty_write_stdin(update.process_id, "", yield_time_s=30)
            assert final.exit_code == 0, final.output  # every swap worked: the race ran


async def _race(session: sandbox.BaseSandboxSession, host: Path) -> None:
    outcomes: list[str] = []
    started = time.monotonic()
    async with _swapping(session):
        for i in range(ROUNDS):
            try:
                await session.write_file(f"d/pwned{i}.txt", b"x")
                outcomes.append("ok")
            except sandbox.SandboxError as exc:  # anything else fails the test
                outcomes.append(type(exc).__name__)
            try:
                data = await session.read_file("d/secret.txt")
                assert data == INSIDE, "host content came back"
                outcomes.append("ok")
            except sandbox.SandboxError as exc:
                outcomes.append(type(exc).__name__)
            succeeded, refused = _outcome_counts(outcomes)
            if (succeeded >= ENOUGH and refused >= ENOUGH) or time.monotonic() - started > BUDGET_S:
                break
    _assert_host_untouched(host)
    succeeded, refused = _outcome_counts(outcomes)
    assert refused >= 1 and succeeded >= 1, f"the race never showed: {set(outcomes)}"
    assert "WorkspacePathError" in outcomes


@pytest.mark.parametrize("confined", [False, True], ids=["unconfined", "confined"])
async def test_symlink_swap_cannot_lead_files_out(tmp_path: Path, confined: bool) -> None:
    if confined:
        ok, reason = confine.availability()
        if not ok:
            skip_or_fail(reason)  # CI (SANDBOX_REQUIRE_ALL=1) must run the jail's race
    workspace, host = tmp_path / "ws", tmp_path / "host"
    _prepare(workspace, host)
    async with sandbox.open_session(
        "unix_local", workdir=workspace, confine=confined, terminate_grace_s=0.5
    ) as session:
        await _race(session, host)


@pytest.mark.parametrize("resolver", ["walk", "openat2"])
async def test_resolvers_hold_against_the_swap(tmp_path: Path, resolver: str) -> None:
    """The same race against `safe_open` itself, for the fallback walk older kernels get
    (and openat2 on its own), with the swapper a plain local process."""
    if resolver == "openat2" and not safe_open.openat2_available():
        pytest.skip("this kernel has no openat2")
    workspace, host = tmp_path / "ws", tmp_path / "host"
    _prepare(workspace, host)
    root = os.path.realpath(workspace)
    # `with`: the pipe is closed and the child reaped however the test ends.
    with subprocess.Popen(
        [sys.executable, "swapper.py", str(BUDGET_S + 30)],
        cwd=workspace,
        stdout=subprocess.PIPE,
    ) as swapper:
        try:
            assert swapper.stdout is not None
            assert swapper.stdout.readline() == b"swapping\n"
            outcomes: list[str] = []
            started = time.monotonic()
            for i in range(ROUNDS):
                for write, name in ((True, f"d/pwned{i}.txt"), (False, "d/secret.txt")):
                    try:
                        opened = safe_open.open_regular(root, name, write=write, resolver=resolver)
                    except sandbox.SandboxError as exc:
                        outcomes.append(type(exc).__name__)
                        continue
                    try:
                        if not write:
                            assert os.read(opened.fd, 100) == INSIDE, "host content came back"
                    finally:
                        os.close(opened.fd)
                    outcomes.append("ok")
                succeeded, refused = _outcome_counts(outcomes)
                if (
                    succeeded >= ENOUGH and refused >= ENOUGH
                ) or time.monotonic() - started > BUDGET_S:
                    break
        finally:
            (workspace / "stop").touch()
            try:
                assert swapper.wait(timeout=30) == 0
            finally:
                swapper.kill()  # a no-op once it exited; `with` closes its pipe and reaps it
    _assert_host_untouched(host)
    succeeded, refused = _outcome_counts(outcomes)
    assert refused >= 1 and succeeded >= 1, f"the race never showed: {set(outcomes)}"
    assert "WorkspacePathError" in outcomes


async def test_streamed_files_hold_against_the_swap(tmp_path: Path) -> None:
    """read_file_chunks and write_file_chunks open the same way."""
    workspace, host = tmp_path / "ws", tmp_path / "host"
    _prepare(workspace, host)
    outcomes: list[str] = []
    async with sandbox.open_session("unix_local", workdir=workspace) as session:
        async with _swapping(session):
            started = time.monotonic()
            for i in range(ROUNDS):
                try:
                    await session.write_file_chunks(f"d/pwned{i}.txt", [b"x", b"y"])
                    outcomes.append("ok")
                except sandbox.SandboxError as exc:
                    outcomes.append(type(exc).__name__)
                try:
                    chunks = [c async for c in session.read_file_chunks("d/secret.txt")]
                    assert b"".join(chunks) == INSIDE, "host content came back"
                    outcomes.append("ok")
                except sandbox.SandboxError as exc:
                    outcomes.append(type(exc).__name__)
                succeeded, refused = _outcome_counts(outcomes)
                if (succeeded >= ENOUGH and refused >= ENOUGH) or (
                    time.monotonic() - started > BUDGET_S
                ):
                    break
                await asyncio.sleep(0)
    _assert_host_untouched(host)
    assert "WorkspacePathError" in outcomes and "ok" in outcomes, set(outcomes)
