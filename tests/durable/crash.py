"""Crash-survival helper: run a child Python process that opens a session with a ref
file, starts a process, says so, and waits to be SIGKILLed."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import sandbox

CHILD = r"""
import asyncio, json, sys
import sandbox

async def main():
    backend, options, ref_file, argv, tty = json.loads(sys.argv[1])
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
    tty: bool = False,
) -> int:
    """Start the child, wait until its process runs (on pipes by default: where a PTY
    is the client's own, it would hang up with it), SIGKILL it; the process id."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, json.dumps([backend, options, str(ref_file), argv, tty])],
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
