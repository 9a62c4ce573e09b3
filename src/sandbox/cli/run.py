"""`sandbox run`: run one command in a fresh session, print its output, exit with its code.

Without `--tty` the command is a one-shot `exec_stream`, its output written as it
comes (stdout and stderr apart); with it, a PTY process whose output is
streamed by polls that end as soon as anything arrives. `--timeout` covers the whole run
and kills the command's tree when it elapses (exit code `EXIT_TIMEOUT`).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence
from typing import BinaryIO

from ..backends.toolkit import options as cli_options
from ..errors import ExecTimeoutError, InvalidArgumentError, PtyProcessNotFoundError
from ..session import BaseSandboxSession
from ..types import PtyUpdate
from .durable import cli_session
from .exit_codes import EXIT_ERROR, EXIT_TIMEOUT
from .session import ANY_OUTPUT, record_path
from .std_streams import say, write_all

STREAM_WINDOW_S = 30.0


def command_words(words: Sequence[str]) -> list[str]:
    """The command after an optional leading `--` (argparse's REMAINDER keeps it)."""
    return list(words[1:] if words and words[0] == "--" else words)


async def run_command(args: argparse.Namespace) -> int:
    """Run `args.cmd` as `sandbox run` does; returns the exit code to exit with."""
    command = command_words(args.cmd)
    if not command:
        raise InvalidArgumentError("run needs a command: sandbox run -- CMD...")
    if args.record is not None and not args.tty:
        raise InvalidArgumentError("--record needs --tty: only a terminal is recorded")
    backend, options = cli_options.options_from_args(args)
    record = record_path(args.record)
    async with cli_session(backend, options, getattr(args, "session", None)) as session:
        if args.tty:
            return await _run_tty(session, command, args.timeout, record)
        try:
            return await _run_streamed(session, command, args.timeout)
        except ExecTimeoutError:
            return _timed_out(args.timeout)


async def _run_streamed(
    session: BaseSandboxSession, command: list[str], timeout: float | None
) -> int:
    """Write each chunk to our stdout or stderr as it comes, then the command's exit code.

    The writes block the event loop, so the command's output waits in its pipe meanwhile
    and the stream never drops any (an omission is still said, never silent). A write
    that fails (the reader left: EPIPE) leaves the stream, which kills the command's
    tree at once; `main` turns the error into its exit code (141, quietly).
    """
    async with session.exec_stream(*command, timeout=timeout) as stream:
        async for chunk in stream:
            if chunk.omitted:
                say(f"sandbox: {chunk.omitted} bytes of the command's {chunk.stream} were lost")
            elif chunk.stream == "stdout":
                write_all(sys.stdout.buffer, chunk.data)
            else:
                write_all(sys.stderr.buffer, chunk.data)
    return EXIT_ERROR if stream.exit_code is None else stream.exit_code


async def _run_tty(
    session: BaseSandboxSession, command: list[str], timeout: float | None, record: str | None
) -> int:
    """Stream a terminal command's output until it exits or `timeout` elapses.

    The timeout covers the whole run, not one window: the first window ends by it, and
    a later poll still waiting at the deadline sees the process terminated under it,
    which ends that window with the last output.
    """
    loop = asyncio.get_running_loop()
    deadline = None if timeout is None else loop.time() + timeout
    first_window = STREAM_WINDOW_S if timeout is None else min(timeout, STREAM_WINDOW_S)
    # No screen: the output goes to the user's own terminal, which renders it.
    update = await session.pty_exec_start(
        *command,
        tty=True,
        until=ANY_OUTPUT,
        yield_time_s=first_window,
        screen=False,
        record=record,
    )
    _show(update)
    process_id = update.process_id
    timed_out = False
    while process_id is not None and update.process_id is not None:
        poll = asyncio.ensure_future(
            session.pty_write_stdin(process_id, "", until=ANY_OUTPUT, yield_time_s=STREAM_WINDOW_S)
        )
        try:
            if deadline is not None and not timed_out:
                done, _ = await asyncio.wait({poll}, timeout=max(0.0, deadline - loop.time()))
                if not done:
                    timed_out = await _terminate(session, process_id)
            update = await poll
        except PtyProcessNotFoundError:
            break  # terminated before the poll began: nothing more to show
        except BaseException:
            poll.cancel()
            await asyncio.wait({poll})
            raise
        _show(update)
    if timed_out:
        assert timeout is not None
        return _timed_out(timeout)
    return _exit_code(update)


async def _terminate(session: BaseSandboxSession, process_id: int) -> bool:
    """Terminate the process (its whole tree); False if it had already exited."""
    try:
        await session.pty_terminate(process_id)
    except PtyProcessNotFoundError:
        return False  # it exited, and a poll collected it, just before the deadline
    return True


def _show(update: PtyUpdate) -> None:
    _write(sys.stdout.buffer, update.output.encode("utf-8", "surrogateescape"))


def _write(stream: BinaryIO, data: bytes) -> None:
    if data:
        write_all(stream, data)


def _exit_code(update: PtyUpdate) -> int:
    return update.exit_code if update.exit_code is not None else EXIT_ERROR


def _timed_out(timeout: float) -> int:
    sys.stdout.flush()
    # Our own notice: a stderr that cannot take it leaves the exit code to tell.
    say(f"sandbox: command timed out after {timeout:g}s and was killed")
    return EXIT_TIMEOUT
