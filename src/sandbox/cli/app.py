"""The `sandbox` command: run, shell, cp, backends, demo, mcp.

Bad usage and library errors print one line on stderr and exit non-zero; no traceback.
Exit codes: the command's own when it ran to its end; `EXIT_TIMEOUT` (124, as timeout(1))
when `--timeout` killed it; `EXIT_USAGE` (2) for bad usage (an unknown flag, a malformed
or rejected option value); `EXIT_ERROR` (1) for any other error (a backend that is not
installed, missing credentials, a workspace that cannot be used, a provider failure);
128+N when signal N (SIGTERM, SIGHUP, SIGINT: 130 on Ctrl-C) stopped it, after the
session was closed (`signals`); `EXIT_BROKEN_PIPE` (141, quietly) when the reader of
the output went away. A closed stdout is one error line and `EXIT_ERROR`, a closed stderr
`EXIT_ERROR` alone (`std_streams`).
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence
from typing import NoReturn

from ..backends.toolkit import options as cli_options
from ..errors import InvalidArgumentError, SandboxError, UnknownBackendError
from . import durable as cli_durable
from .exit_codes import (
    EXIT_BROKEN_PIPE,
    EXIT_ERROR,
    EXIT_INTERRUPTED,
    EXIT_TIMEOUT,
    EXIT_USAGE,
)
from .run import command_words, run_command
from .signals import run_command as run_until_signalled
from .std_streams import error_line, flush_outputs, output_failure, plug_closed_fds, say


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see --help)\n")


# What `sandbox --help` says (the module docstring is for the code's readers).
DESCRIPTION = """\
Run commands in a sandbox: local processes, a Docker container, a Kubernetes pod
or a cloud provider's sandbox, one interface for all. An error is one line on
stderr. `sandbox COMMAND --help` describes each command."""
EPILOG = f"""exit status:
  the command's own  when it ran to its end
  {EXIT_TIMEOUT}                --timeout elapsed and the command was killed (as timeout(1))
  {EXIT_USAGE}                  bad usage: an unknown flag, a malformed or refused option value
  {EXIT_ERROR}                  any other error: a backend not installed, missing credentials,
                     a workspace that cannot be used, a provider failure
  128+N              signal N stopped it (130 on Ctrl-C), after the session was closed
  {EXIT_BROKEN_PIPE}                the reader of the output went away (nothing is printed)
"""


def _build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="sandbox",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
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
    cli_durable.add_session_argument(run)
    run.add_argument("cmd", nargs=argparse.REMAINDER, help="the command (after --)")

    shell = commands.add_parser("shell", help="attach this terminal to a PTY in the sandbox")
    cli_options.add_backend_arguments(shell)
    shell.add_argument(
        "--record",
        metavar="FILE",
        help="record the terminal to FILE (asciicast v2, `asciinema play FILE`)",
    )
    cli_durable.add_session_argument(shell)
    shell.add_argument(
        "cmd",
        nargs=argparse.REMAINDER,
        help="command (default: bash -i where bash exists, else sh -i)",
    )
    cli_durable.add_commands(commands)

    copy = commands.add_parser(
        "cp", help="copy a file or folder between the host and the sandbox (:PATH is inside)"
    )
    cli_options.add_backend_arguments(copy)
    copy.add_argument("src", metavar="SRC", help="what to copy (:PATH in the sandbox)")
    copy.add_argument("dst", metavar="DST", help="where to (:PATH in the sandbox)")
    cli_durable.add_session_argument(copy)

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


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `sandbox` console script."""
    plug_closed_fds()
    try:
        try:
            return _dispatch(list(sys.argv[1:] if argv is None else argv))
        finally:
            # Buffered output fails here, while it can still be reported, not at exit.
            flush_outputs()
    except OSError as exc:
        status = output_failure(exc)
        if status is None:
            raise
        return status


def _dispatch(words: list[str]) -> int:
    if words[:1] == ["mcp"]:
        try:
            from ..mcp import server as mcp_server
        except ImportError as exc:
            say(
                f"sandbox: error: `sandbox mcp` needs the MCP SDK ({exc.name}): "
                "pip install 'agent-sandbox-pty[mcp]'"
            )
            return EXIT_ERROR
        return mcp_server.main(words[1:])
    parser = _build_parser()
    args = parser.parse_args(words)
    try:
        if args.command == "run":
            return run_until_signalled(run_command(args))
        if args.command == "shell":
            from .terminal import attach_shell

            return run_until_signalled(attach_shell(args, command_words(args.cmd)))
        if args.command == "cp":
            from .copy import copy_command

            return run_until_signalled(copy_command(args))
        if args.command == "open":
            return run_until_signalled(cli_durable.open_command(args))
        if args.command == "close":
            return run_until_signalled(cli_durable.close_command(args))
        if args.command == "backends":
            from .backends_report import print_backends

            print_backends(sys.stdout)
            return 0
        if args.command == "demo":
            from .demo import run_demo

            return run_until_signalled(run_demo(sys.stdout))
        parser.print_help()
        return EXIT_USAGE
    except (InvalidArgumentError, UnknownBackendError) as exc:
        say(_error_line(exc))
        return EXIT_USAGE
    except SandboxError as exc:
        say(_error_line(exc))
        return EXIT_ERROR
    except ValueError as exc:  # a malformed option (`--opt` without `=`)
        say(_error_line(exc))
        return EXIT_USAGE
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED


def _error_line(exc: BaseException) -> str:
    """The error's line, its options spelt as flags or `--opt` (`spelling`)."""
    from .spelling import cli_message

    message = str(exc)
    return error_line(cli_message(message) if message else exc)
