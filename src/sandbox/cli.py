"""The `sandbox` command: run, shell, backends, demo, mcp.

Bad usage and library errors print one line on stderr and exit non-zero; no traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import sys
from collections.abc import Sequence
from typing import NoReturn

from . import cli_options
from .backends import open_session
from .errors import SandboxError

# Matches any character: a window with this `until` returns as soon as output arrives,
# which turns polls into a stream.
ANY_OUTPUT = re.compile(r"[\s\S]")
EXIT_USAGE = 2


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see --help)\n")


def _build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="sandbox", description=__doc__)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    run = commands.add_parser("run", help="run a command, print its output, exit with its code")
    cli_options.add_backend_arguments(run)
    run.add_argument("--tty", action="store_true", help="run on a terminal")
    run.add_argument("--timeout", type=float, help="seconds before the command is killed")
    run.add_argument("cmd", nargs=argparse.REMAINDER, help="the command (after --)")

    shell = commands.add_parser("shell", help="attach this terminal to a PTY in the sandbox")
    cli_options.add_backend_arguments(shell)
    shell.add_argument("cmd", nargs=argparse.REMAINDER, help="command (default: sh)")

    commands.add_parser("backends", help="list the backends, installed or not, credentials")
    commands.add_parser("demo", help="an agent-style session on unix_local, step by step")
    commands.add_parser("mcp", help="serve the sandbox as MCP tools (see `sandbox mcp --help`)")
    return parser


def _command_words(words: Sequence[str]) -> list[str]:
    return list(words[1:] if words and words[0] == "--" else words)


async def _run(args: argparse.Namespace) -> int:
    command = _command_words(args.cmd)
    if not command:
        raise SandboxError("run needs a command: sandbox run -- CMD...")
    backend, options = cli_options.options_from_args(args)
    async with open_session(backend, **options) as session:
        if not args.tty:
            result = await session.exec(*command, timeout=args.timeout)
            sys.stdout.buffer.write(result.stdout)
            sys.stdout.flush()
            sys.stderr.buffer.write(result.stderr)
            sys.stderr.flush()
            return result.exit_code
        run = session.pty_exec_start(*command, tty=True, until=ANY_OUTPUT, yield_time_s=30)
        update = await (asyncio.wait_for(run, args.timeout) if args.timeout else run)
        while True:
            sys.stdout.write(update.output)
            sys.stdout.flush()
            if update.process_id is None:
                return update.exit_code if update.exit_code is not None else 1
            update = await session.pty_write_stdin(
                update.process_id, "", until=ANY_OUTPUT, yield_time_s=30
            )


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
    except SandboxError as exc:
        print(f"sandbox: error: {exc}", file=sys.stderr)
        return 1
    except ValueError as exc:
        print(f"sandbox: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
