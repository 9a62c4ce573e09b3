"""`sandbox demo`: what an agent runtime does with a session, step by step.

Each step prints the call, the `PtyUpdate` it returned and its wall time, so a reader
sees the windows ending early on `until` and on exit instead of waiting them out.
"""

from __future__ import annotations

import dataclasses
import shutil
import time
from collections.abc import Awaitable
from typing import TextIO, TypeVar

from ..backends import open_session
from ..session import BaseSandboxSession
from ..types import PtyUpdate

T = TypeVar("T")


async def _step(out: TextIO, title: str, call: Awaitable[T]) -> T:
    started = time.perf_counter()
    result = await call
    elapsed_ms = (time.perf_counter() - started) * 1000
    out.write(f"\n== {title}  ({elapsed_ms:.1f} ms)\n")
    shown: object = result
    if isinstance(result, PtyUpdate) and result.screen is not None:
        # The screen is shown after the step as the model reads it, not as a repr.
        shown = dataclasses.replace(result, screen=None, output=f"<{len(result.output)} chars>")
    if shown is not None:
        out.write(f"   {shown!r}\n")
    out.flush()
    return result


async def run_demo(out: TextIO) -> int:
    """Run the demo on unix_local, printing every step; returns 0 on success."""
    async with open_session("unix_local") as session:
        out.write(f"session: {session!r}\n")
        await _step(
            out, 'exec("echo hello from the sandbox")', session.exec("echo hello from the sandbox")
        )
        repl = await _step(
            out,
            'pty_exec_start("python3 -q", tty=True, until=">>> ")',
            session.pty_exec_start("python3 -q", tty=True, until=">>> "),
        )
        assert repl.process_id is not None
        await _step(
            out,
            'pty_write_stdin(repl, "sum(i * i for i in range(10**6))\\n", until=">>> ")',
            session.pty_write_stdin(
                repl.process_id, "sum(i * i for i in range(10**6))\n", until=">>> "
            ),
        )
        busy = await _step(
            out,
            'pty_exec_start("while :; do :; done", tty=True, yield_time_s=0.5)',
            session.pty_exec_start(
                "echo spinning; while :; do :; done", tty=True, yield_time_s=0.5
            ),
        )
        assert busy.process_id is not None
        await _step(out, "pty_interrupt(busy)", session.pty_interrupt(busy.process_id))
        await _step(
            out,
            "pty_write_stdin(busy, '')  # collect the exit",
            session.pty_write_stdin(busy.process_id, ""),
        )
        out.write("\n== pty_processes()\n")
        for info in session.pty_processes():
            out.write(f"   {info!r}\n")
        await _step(
            out,
            "pty_resize(repl, rows=40, cols=120)",
            session.pty_resize(repl.process_id, rows=40, cols=120),
        )
        await _step(
            out,
            'pty_write_stdin(repl, "import os; os.get_terminal_size()\\n", until="lines=40)")',
            session.pty_write_stdin(
                repl.process_id, "import os; os.get_terminal_size()\n", until="lines=40)"
            ),
        )
        await _full_screen_step(out, session)
        await _step(out, 'pty_exec_start("exit 3")', session.pty_exec_start("exit 3"))
        await _step(out, "pty_terminate_all()", session.pty_terminate_all())
        out.write(f"\nprocesses left: {len(session.pty_processes())}\n")
    out.write("session closed: nothing left running\n")
    return 0


async def _full_screen_step(out: TextIO, session: BaseSandboxSession) -> None:
    """A full-screen program: page through a file in `less`, waiting on its rendered
    screen with `until_screen`, and show that screen as a model receives it."""
    if shutil.which("less") is None:
        out.write("\n== (less is not installed: the full-screen step is skipped)\n")
        return
    await session.write_file("numbers.txt", "".join(f"line {i:03d}\n" for i in range(200)))
    pager = await _step(
        out,
        'pty_exec_start("less numbers.txt", tty=True, until_screen="line 022")',
        session.pty_exec_start(
            "less numbers.txt",
            tty=True,
            env={"LESSHISTFILE": "-"},
            until_screen="line 022",
            yield_time_s=20,
        ),
    )
    assert pager.process_id is not None
    page = await _step(
        out,
        'pty_write_stdin(pager, " ", until_screen="line 045")  # page down',
        session.pty_write_stdin(pager.process_id, " ", until_screen="line 045", yield_time_s=20),
    )
    snap = page.screen
    assert snap is not None
    out.write(
        f"   the screen as the model receives it ({snap.rows}x{snap.cols}, alternate screen: "
        f"{snap.alternate_screen}, cursor marked with █):\n"
    )
    for line in snap.text(cursor_marker="█").splitlines():
        out.write(f"   | {line}\n")
    await _step(
        out, 'pty_write_stdin(pager, "q")  # quit', session.pty_write_stdin(pager.process_id, "q")
    )
