"""The `sandbox` command: run, shell, backends, demo, mcp.

Bad usage and library errors print one line on stderr and exit non-zero; no traceback.
Exit codes: the command's own when it ran to its end; `EXIT_TIMEOUT` (124, as timeout(1))
when `--timeout` killed it; `EXIT_USAGE` (2) for bad usage (an unknown flag, a malformed
or rejected option value); `EXIT_ERROR` (1) for any other error (a backend that is not
installed, missing credentials, a workspace that cannot be used, a provider failure);
`EXIT_INTERRUPTED` (130) on Ctrl-C.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import sys
from collections.abc import Sequence
from typing import BinaryIO, NoReturn

from . import cli_options
from .cli_session import ANY_OUTPUT, open_cli_session
from .errors import (
    ExecTimeoutError,
    InvalidArgumentError,
    PtyProcessNotFoundError,
    SandboxError,
    UnknownBackendError,
)
from .session import BaseSandboxSession
from .types import PtyUpdate

EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_TIMEOUT = 124
EXIT_INTERRUPTED = 130
STREAM_WINDOW_S = 30.0


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see --help)\n")


def _build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="sandbox", description=__doc__)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    run = commands.add_parser("run", help="run a command, print its output, exit with its code")
    cli_options.add_backend_arguments(run)
    run.add_argument("--tty", action="store_true", help="run on a terminal")
    run.add_argument(
        "--record",
        metavar="FILE",
        help="with --tty: record the terminal to FILE (asciicast v2, `asciinema play FILE`)",
    )
    run.add_argument(
        "--timeout",
        type=_seconds,
        help=f"seconds before the command is killed (then the exit code is {EXIT_TIMEOUT})",
    )
    run.add_argument("cmd", nargs=argparse.REMAINDER, help="the command (after --)")

    shell = commands.add_parser("shell", help="attach this terminal to a PTY in the sandbox")
    cli_options.add_backend_arguments(shell)
    shell.add_argument(
        "--record",
        metavar="FILE",
        help="record the terminal to FILE (asciicast v2, `asciinema play FILE`)",
    )
    shell.add_argument("cmd", nargs=argparse.REMAINDER, help="command (default: sh)")

    commands.add_parser("backends", help="list the backends, installed or not, credentials")
    commands.add_parser("demo", help="an agent-style session on unix_local, step by step")
    commands.add_parser("mcp", help="serve the sandbox as MCP tools (see `sandbox mcp --help`)")
    return parser


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds: {text!r}")
    return value


def _command_words(words: Sequence[str]) -> list[str]:
    return list(words[1:] if words and words[0] == "--" else words)


async def _run(args: argparse.Namespace) -> int:
    command = _command_words(args.cmd)
    if not command:
        raise InvalidArgumentError("run needs a command: sandbox run -- CMD...")
    if args.record is not None and not args.tty:
        raise InvalidArgumentError("--record needs --tty: only a terminal is recorded")
    backend, options = cli_options.options_from_args(args)
    async with open_cli_session(backend, options) as session:
        if args.tty:
            return await _run_tty(session, command, args.timeout, args.record)
        try:
            result = await session.exec(*command, timeout=args.timeout)
        except ExecTimeoutError as exc:
            _write(sys.stdout.buffer, exc.stdout)
            _write(sys.stderr.buffer, exc.stderr)
            return _timed_out(args.timeout)
        _write(sys.stdout.buffer, result.stdout)
        _write(sys.stderr.buffer, result.stderr)
        return result.exit_code


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
        stream.write(data)
        stream.flush()


def _exit_code(update: PtyUpdate) -> int:
    return update.exit_code if update.exit_code is not None else EXIT_ERROR


def _timed_out(timeout: float) -> int:
    sys.stdout.flush()
    print(f"sandbox: command timed out after {timeout:g}s and was killed", file=sys.stderr)
    return EXIT_TIMEOUT


def _error_line(exc: BaseException) -> str:
    # One line, whatever the message holds (a provider's multi-line answer).
    message = " ".join(str(exc).split()) or type(exc).__name__
    return f"sandbox: error: {message}"


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `sandbox` console script."""
    words = list(sys.argv[1:] if argv is None else argv)
    if words[:1] == ["mcp"]:
        try:
            from . import mcp_server
        except ImportError as exc:
            print(
                f"sandbox: error: `sandbox mcp` needs the MCP SDK ({exc.name}): "
                "pip install 'agent-sandbox-pty[mcp]'",
                file=sys.stderr,
            )
            return 1
        return mcp_server.main(words[1:])
    parser = _build_parser()
    args = parser.parse_args(words)
    try:
        if args.command == "run":
            return asyncio.run(_run(args))
        if args.command == "shell":
            from .terminal import attach_shell

            return asyncio.run(attach_shell(args, _command_words(args.cmd)))
        if args.command == "backends":
            from .backends_report import print_backends

            print_backends(sys.stdout)
            return 0
        if args.command == "demo":
            from .demo import run_demo

            return asyncio.run(run_demo(sys.stdout))
        parser.print_help()
        return EXIT_USAGE
    except (InvalidArgumentError, UnknownBackendError) as exc:
        print(_error_line(exc), file=sys.stderr)
        return EXIT_USAGE
    except SandboxError as exc:
        print(_error_line(exc), file=sys.stderr)
        return EXIT_ERROR
    except ValueError as exc:  # a malformed option (`--opt` without `=`)
        print(_error_line(exc), file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
