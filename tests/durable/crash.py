"""Crash-survival helper: run a child Python process that opens a session with a ref
file, starts a process, says so, and waits to be SIGKILLed.

For the backends whose provider is an SDK fake (e2b, daytona, modal) the fake stays in
the test's process, served by `sandbox.testing.remote_fake.FakeServer`; the child gets an
SDK-shaped proxy of it as the backend's SDK option (`remote=`), so the provider outlives
the client as a real one does."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import sandbox

CHILD = r"""
import asyncio, json, sys
import sandbox

async def main():
    backend, options, ref_file, argv, remote, tty = json.loads(sys.argv[1])
    if remote is not None:
        from sandbox.testing.remote_fake import connect

        root = connect(remote["socket"]).root
        options[remote["option"]] = getattr(root, remote["attr"]) if remote["attr"] else root
    session = sandbox.open_session(backend, ref_file=ref_file, **options)
    await session.start()
    update = await session.pty_exec_start(*argv, tty=tty, yield_time_s=0.5)
    print(update.process_id, flush=True)
    await asyncio.Event().wait()

asyncio.run(main())
"""


async def crash_with_a_process(
    backend: str,
    options: dict[str, object],
    ref_file: Path,
    argv: list[str],
    *,
    remote: tuple[str, str, str | None] | None = None,
    tty: bool = False,
) -> int:
    """Start the child, wait until its process runs, SIGKILL it; the process id.

    Pipes by default (a local PTY would hang up with its client); `tty=True` where the
    provider keeps terminals. `remote=(socket, option, attr)`: the child connects to the
    `FakeServer` at `socket` and passes its root (or the root's `attr`) as `option`."""
    spec = None if remote is None else {"socket": remote[0], "option": remote[1], "attr": remote[2]}
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            CHILD,
            json.dumps([backend, options, str(ref_file), argv, spec, tty]),
        ],
        stdout=subprocess.PIPE,
        env=env,
    )
    try:
        assert child.stdout is not None
        line = await asyncio.to_thread(child.stdout.readline)
        assert line.strip(), "the child exited before starting its process"
        os.kill(child.pid, signal.SIGKILL)
        await asyncio.to_thread(child.wait)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        if child.stdout is not None:
            child.stdout.close()  # strict pytest: no pipe left to the GC
    return int(line)


def ref_of(path: Path) -> sandbox.SessionRef:
    """The ref the crashed child left."""
    return sandbox.read_ref_file(path)


@contextlib.contextmanager
def socket_path() -> Iterator[str]:
    """A path for a `FakeServer`'s socket in a private folder (short: a unix socket's
    path is limited to 107 bytes, which a pytest tmp_path may exceed)."""
    folder = tempfile.mkdtemp(prefix="sandbox-fake-")
    try:
        yield os.path.join(folder, "fake.sock")
    finally:
        shutil.rmtree(folder, ignore_errors=True)
