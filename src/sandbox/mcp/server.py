"""`sandbox mcp`: the sandbox as a Model Context Protocol tool server.

One sandbox session per server: it is started before the server answers anything and
closed (every process torn down through the session's settled cleanup) when the server
stops, whatever stopped it: the client closing stdin, SIGTERM, SIGINT or SIGHUP, or the
client going away. Over stdio the server serves one client and exits when it leaves.
With `--http HOST:PORT` it serves the SDK's streamable HTTP transport at
`http://HOST:PORT/mcp` until it is signalled; every client shares the one session, so
processes outlive a client (a reconnecting agent finds them with `list_processes`) and
are torn down when the server stops. A call in flight when its HTTP client vanishes is
cancelled where the SDK notices (current protocol: at once), which tears down the
process it was starting.

The tools mirror the library's PTY API one to one and add nothing to its semantics:
the yield windows, clamps, truncation and registry bounds are the library's. One default
differs: a window's output is truncated to `MODEL_OUTPUT_TOKENS` unless the call asks
for more (`output/model_budget.py`), so one answer cannot fill a model's context.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import anyio
from mcp import types
from mcp.server.lowlevel import Server
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..backends.toolkit.options import add_backend_arguments, options_from_args
from ..cli.exit_codes import EXIT_ERROR, EXIT_USAGE
from ..cli.signals import StopSignals, signal_name
from ..cli.std_streams import error_line, is_writable, plug_closed_fds, say
from ..errors import InvalidArgumentError, SandboxError
from ..output.model_budget import (
    MAX_MODEL_OUTPUT_TOKENS,
    MODEL_OUTPUT_TOKENS,
    model_output_tokens,
)
from ..session import BaseSandboxSession, SessionState
from ..types import PtyProcessInfo, PtyUpdate
from . import state_file
from .http_guard import TOKEN_ENV, read_token
from .transports import HTTP_PATH, HttpTransport, StdioTransport, Transport

if TYPE_CHECKING:
    from ..terminal.screen import ScreenSnapshot

logger = logging.getLogger("sandbox.mcp")

SERVER_NAME = "sandbox"


# ---- tool arguments ------------------------------------------------------------------


class _Args(BaseModel):
    """Base of the tool argument models: unknown arguments are an error, so a model
    that misspells one is told instead of silently ignored."""

    model_config = ConfigDict(extra="forbid")


_YIELD_START = (
    "Maximum time to wait for output before returning, in milliseconds (default 10000, "
    "clamped to 250..30000). The call returns earlier when the process exits or `until` "
    "appears."
)
_YIELD_WRITE = (
    "Maximum time to wait for output before returning, in milliseconds. A write waits "
    "250 ms by default; a poll (empty chars) waits at least 5000 ms. Clamped to 30000. "
    "The call returns earlier when the process exits or `until` appears."
)
_MAX_TOKENS = (
    "Truncate the returned output to about this many tokens (head and tail kept, the "
    "middle elided; the result then reports the original token count). Default "
    f"{MODEL_OUTPUT_TOKENS}; ask for more when you need the whole output (at most "
    f"{MAX_MODEL_OUTPUT_TOKENS}, larger values are lowered to it)."
)
_UNTIL = (
    "Return as soon as this exact text appears in the new output, e.g. a prompt such as "
    "'>>> ' or '$ ', or a line like 'Listening on'. Plain substring, not a regex."
)
_UNTIL_SCREEN = (
    "Return as soon as this exact text is visible on the process's rendered terminal "
    "screen (tty=true only), e.g. '-- INSERT --' in vim or '(END)' in less; the rendered "
    "screen is then included in the result. Plain substring, not a regex."
)
CURSOR_MARKER = "█"
"""Where the cursor is, in the screen text a model reads (`view_screen`, `until_screen`)."""
MAX_SCREEN_TEXT_CHARS = 65_536
"""The most screen text `view_screen` (or an `until_screen` result) hands a model."""
_SESSION_ID = "The session ID reported by exec_command ('Process running with session ID N')."


class ExecCommandArgs(_Args):
    """Arguments of `exec_command`."""

    cmd: str = Field(
        description="The shell command line, run with `sh -c` (pipes, &&, redirections work)."
    )
    workdir: str | None = Field(
        default=None,
        description="Working directory; relative paths are inside the workspace. "
        "Default: the workspace.",
    )
    tty: bool = Field(
        default=False,
        description="Run on a pseudo-terminal so you can type into it later with "
        "write_stdin. Use it for interactive programs: REPLs (python3, node), shells, "
        "prompts (ssh, git rebase -i), pagers and full-screen programs. Default false: "
        "output through pipes and stdin closed, which is best for ordinary commands.",
    )
    stdin: bool = Field(
        default=False,
        description="With tty=false, keep the command's stdin open: write_stdin sends it "
        "input and close_stdin ends that input (the program reads end-of-file). Use it "
        "for programs that read their input to its end or speak a line protocol on "
        "stdin: sort, wc, a stdio MCP or language server. Ignored with tty=true.",
    )
    yield_time_ms: int | None = Field(default=None, description=_YIELD_START)
    max_output_tokens: int | None = Field(default=None, description=_MAX_TOKENS)
    until: str | None = Field(default=None, description=_UNTIL)
    until_screen: str | None = Field(default=None, description=_UNTIL_SCREEN)


class WriteStdinArgs(_Args):
    """Arguments of `write_stdin`."""

    session_id: int = Field(description=_SESSION_ID)
    chars: str = Field(
        default="",
        description="Keystrokes to send; empty (the default) just polls for new output. "
        "End a line with '\\n' to press Enter. Control keys are characters: '\\u0003' "
        "Ctrl-C, '\\u0004' Ctrl-D (end of input), '\\u001b' Escape. Only processes "
        "started with tty=true (or stdin=true) accept input; any process can be polled.",
    )
    yield_time_ms: int | None = Field(default=None, description=_YIELD_WRITE)
    max_output_tokens: int | None = Field(default=None, description=_MAX_TOKENS)
    until: str | None = Field(default=None, description=_UNTIL)
    until_screen: str | None = Field(default=None, description=_UNTIL_SCREEN)


class CloseStdinArgs(_Args):
    """Arguments of `close_stdin`."""

    session_id: int = Field(description=_SESSION_ID)
    yield_time_ms: int | None = Field(
        default=None,
        description="After closing, wait this long at most for output, in milliseconds "
        "(at least 5000, at most 30000); the call returns earlier when the process exits "
        "or `until` appears.",
    )
    max_output_tokens: int | None = Field(default=None, description=_MAX_TOKENS)
    until: str | None = Field(default=None, description=_UNTIL)


class ListProcessesArgs(_Args):
    """`list_processes` takes no arguments."""


class SessionIdArgs(_Args):
    """Arguments of `view_screen`, `interrupt` and `terminate`."""

    session_id: int = Field(description=_SESSION_ID)


class ResizeArgs(_Args):
    """Arguments of `resize`."""

    session_id: int = Field(description=_SESSION_ID)
    rows: int = Field(description="Terminal height in rows.")
    cols: int = Field(description="Terminal width in columns.")


# ---- result text ---------------------------------------------------------------------


def _seconds(ms: int | None) -> float | None:
    """Milliseconds from the wire to the library's seconds; None keeps the default."""
    return None if ms is None else ms / 1000


def format_update(update: PtyUpdate, wall_time_s: float) -> str:
    """The text a model reads for one collection window: wall time, the process state,
    the original token count when truncated, then the output."""
    lines = [f"Wall time: {wall_time_s:.3f} seconds"]
    if update.process_id is not None:
        lines.append(f"Process running with session ID {update.process_id}")
    elif update.exit_code is not None:
        lines.append(f"Process exited with code {update.exit_code}")
    else:
        lines.append("Process ended without an exit code (the sandbox lost track of it)")
    if update.original_token_count is not None:
        lines.append(f"Original token count: {update.original_token_count}")
    if update.output:
        lines.append("Output:")
        lines.append(update.output)
    else:
        lines.append("Output: (none)")
    text = "\n".join(lines)
    if update.screen is not None:
        text += "\n" + format_screen(update.screen)
    return text


def format_screen(snapshot: ScreenSnapshot) -> str:
    """The rendered screen as a model reads it: size, alternate-screen flag, title and
    cursor, then the screen's lines with the cursor marked."""
    where = (
        f"row {snapshot.cursor_row + 1}, column {snapshot.cursor_col + 1} (marked {CURSOR_MARKER})"
        if snapshot.cursor_visible
        else "hidden"
    )
    lines = [
        f"Screen ({snapshot.rows} rows x {snapshot.cols} columns; "
        f"alternate screen: {'yes' if snapshot.alternate_screen else 'no'}; "
        f"title: {snapshot.title if snapshot.title is not None else '(none)'}; cursor: {where}):"
    ]
    if snapshot.skipped_bytes:
        lines.append(
            f"({snapshot.skipped_bytes} bytes of fast output were not rendered; the screen "
            "shows the most recent output)"
        )
    text = snapshot.text(cursor_marker=CURSOR_MARKER) or "(blank)"
    if len(text) > MAX_SCREEN_TEXT_CHARS:
        # A big terminal's screen (up to 1000 x 1000 cells) would flood the model's
        # context: keep its top rows, cut at a row's end.
        cut = text.rfind("\n", 0, MAX_SCREEN_TEXT_CHARS + 1)
        kept = text[: cut if cut > 0 else MAX_SCREEN_TEXT_CHARS]
        row = kept.count("\n") + 1 + (cut > 0)  # the row the cut falls in
        lines.append(kept)
        lines.append(
            f"(screen text cut at {MAX_SCREEN_TEXT_CHARS} characters, in row {row} "
            f"of {snapshot.rows})"
        )
    else:
        lines.append(text)
    return "\n".join(lines)


def _ago(timestamp: float, now: float) -> str:
    return f"{max(0.0, now - timestamp):.1f}s ago"


def format_processes(infos: list[PtyProcessInfo], now: float | None = None) -> str:
    """The process list as text, oldest first."""
    if not infos:
        return "No processes. Start one with exec_command."
    now = time.time() if now is None else now
    noun = "process" if len(infos) == 1 else "processes"
    lines = [f"{len(infos)} {noun}, oldest first:"]
    for info in infos:
        if info.running:
            state = "running"
        elif info.exit_code is not None:
            state = f"exited with code {info.exit_code} (poll it to collect its output)"
        else:
            state = "ended (poll it to collect its output)"
        command = info.command if len(info.command) <= 200 else info.command[:199] + "…"
        lines.append(
            f"- session {info.process_id}: {state}; {'tty' if info.tty else 'no tty'}; "
            f"{'screen (view_screen); ' if info.has_screen else ''}"
            f"started {_ago(info.started_at, now)}, last used {_ago(info.last_used, now)}; "
            f"command: {command}"
        )
    return "\n".join(lines)


def _error_text(exc: SandboxError) -> str:
    """The library's message, with its Python vocabulary turned into the tool names a
    model sees."""
    text = str(exc).replace("pty_processes()", "the list_processes tool")
    text = text.replace("pty_close_stdin", "close_stdin").replace("stdin=True", "stdin=true")
    # The library names its `cwd` argument; the tool's argument is `workdir`.
    text = text.replace("working directory (cwd)", "working directory (workdir)")
    return text + (" (retrying later may help)" if exc.retryable else "")


# ---- the server ----------------------------------------------------------------------


class _Tool:
    """One tool: its MCP description, argument model and handler."""

    def __init__(
        self,
        name: str,
        title: str,
        description: str,
        args: type[_Args],
        handler: Callable[[Any], Awaitable[str]],
        annotations: types.ToolAnnotations,
    ) -> None:
        self.name = name
        self.args = args
        self.handler = handler
        self.definition = types.Tool(
            name=name,
            title=title,
            description=description,
            input_schema=args.model_json_schema(),
            annotations=annotations,
        )


def _validation_text(name: str, exc: ValidationError) -> str:
    # Field names and pydantic's reason only: the rejected values are the caller's.
    problems = []
    for error in exc.errors():
        where = ".".join(str(part) for part in error["loc"]) or "arguments"
        problems.append(f"{where}: {error['msg']}")
    return f"invalid arguments for {name}: " + "; ".join(problems)


class SandboxTools:
    """The eight tools over one started sandbox session."""

    def __init__(self, session: BaseSandboxSession) -> None:
        self.session = session
        self._calls: set[anyio.CancelScope] = set()
        self._closing = False
        self.tools = {
            tool.name: tool
            for tool in (
                _Tool(
                    "exec_command",
                    "Run a command",
                    EXEC_COMMAND_DESCRIPTION,
                    ExecCommandArgs,
                    self.exec_command,
                    types.ToolAnnotations(destructive_hint=True, open_world_hint=True),
                ),
                _Tool(
                    "write_stdin",
                    "Type into or poll a process",
                    WRITE_STDIN_DESCRIPTION,
                    WriteStdinArgs,
                    self.write_stdin,
                    types.ToolAnnotations(destructive_hint=True, open_world_hint=True),
                ),
                _Tool(
                    "close_stdin",
                    "End a process's input",
                    CLOSE_STDIN_DESCRIPTION,
                    CloseStdinArgs,
                    self.close_stdin,
                    types.ToolAnnotations(destructive_hint=True, open_world_hint=False),
                ),
                _Tool(
                    "list_processes",
                    "List processes",
                    LIST_PROCESSES_DESCRIPTION,
                    ListProcessesArgs,
                    self.list_processes,
                    types.ToolAnnotations(read_only_hint=True, open_world_hint=False),
                ),
                _Tool(
                    "view_screen",
                    "View a terminal screen",
                    VIEW_SCREEN_DESCRIPTION,
                    SessionIdArgs,
                    self.view_screen,
                    types.ToolAnnotations(read_only_hint=True, open_world_hint=False),
                ),
                _Tool(
                    "interrupt",
                    "Send Ctrl-C",
                    INTERRUPT_DESCRIPTION,
                    SessionIdArgs,
                    self.interrupt,
                    types.ToolAnnotations(destructive_hint=True, open_world_hint=False),
                ),
                _Tool(
                    "resize",
                    "Resize a terminal",
                    RESIZE_DESCRIPTION,
                    ResizeArgs,
                    self.resize,
                    types.ToolAnnotations(
                        destructive_hint=False, idempotent_hint=True, open_world_hint=False
                    ),
                ),
                _Tool(
                    "terminate",
                    "Stop a process",
                    TERMINATE_DESCRIPTION,
                    SessionIdArgs,
                    self.terminate,
                    types.ToolAnnotations(destructive_hint=True, open_world_hint=False),
                ),
            )
        }

    async def exec_command(self, args: ExecCommandArgs) -> str:
        """Start `cmd` and return its first window."""
        started = time.monotonic()
        update = await self.session.pty_exec_start(
            args.cmd,
            tty=args.tty,
            stdin=args.stdin,
            cwd=args.workdir or None,
            yield_time_s=_seconds(args.yield_time_ms),
            max_output_tokens=model_output_tokens(args.max_output_tokens),
            until=args.until or None,
            until_screen=args.until_screen or None,
        )
        return format_update(update, time.monotonic() - started)

    async def write_stdin(self, args: WriteStdinArgs) -> str:
        """Write `chars` (or poll) and return the next window."""
        started = time.monotonic()
        update = await self.session.pty_write_stdin(
            args.session_id,
            args.chars,
            yield_time_s=_seconds(args.yield_time_ms),
            max_output_tokens=model_output_tokens(args.max_output_tokens),
            until=args.until or None,
            until_screen=args.until_screen or None,
        )
        return format_update(update, time.monotonic() - started)

    async def close_stdin(self, args: CloseStdinArgs) -> str:
        """End the process's input, then poll it (what it printed at its end of input)."""
        started = time.monotonic()
        await self.session.pty_close_stdin(args.session_id)
        update = await self.session.pty_write_stdin(
            args.session_id,
            "",
            yield_time_s=_seconds(args.yield_time_ms),
            max_output_tokens=model_output_tokens(args.max_output_tokens),
            until=args.until or None,
        )
        return format_update(update, time.monotonic() - started)

    async def list_processes(self, args: ListProcessesArgs) -> str:
        """The live registry."""
        return format_processes(self.session.pty_processes())

    async def view_screen(self, args: SessionIdArgs) -> str:
        """The rendered screen of a tty process."""
        snapshot = await self.session.pty_screen(args.session_id)
        return f"Session {args.session_id}. " + format_screen(snapshot)

    async def interrupt(self, args: SessionIdArgs) -> str:
        """Ctrl-C."""
        await self.session.pty_interrupt(args.session_id)
        return (
            f"Sent Ctrl-C to session {args.session_id}. Poll it with write_stdin (empty "
            "chars) to see the effect."
        )

    async def resize(self, args: ResizeArgs) -> str:
        """Resize the terminal."""
        await self.session.pty_resize(args.session_id, rows=args.rows, cols=args.cols)
        return f"Resized the terminal of session {args.session_id} to {args.rows}x{args.cols}."

    async def terminate(self, args: SessionIdArgs) -> str:
        """Tear one process down."""
        await self.session.pty_terminate(args.session_id)
        return f"Session {args.session_id} terminated (with all its child processes)."

    def shut_down(self) -> None:
        """Refuse new calls and cancel the ones in flight (each cancelled start tears its
        own process down), so a stopping server answers every open request at once."""
        self._closing = True
        for scope in list(self._calls):
            scope.cancel()

    async def call(self, name: str, arguments: dict[str, Any] | None) -> types.CallToolResult:
        """Run tool `name`; every failure becomes an error result, never an exception."""
        tool = self.tools.get(name)
        if tool is None:
            known = ", ".join(self.tools)
            return _error_result(f"unknown tool {name!r}; the tools are: {known}")
        try:
            args = tool.args.model_validate(arguments or {})
        except ValidationError as exc:
            return _error_result(_validation_text(name, exc))
        if self._closing:
            return _error_result(SHUTTING_DOWN)
        text: str | None = None
        with anyio.CancelScope() as scope:
            self._calls.add(scope)
            try:
                text = await tool.handler(args)
            except SandboxError as exc:
                return _error_result(_error_text(exc))
            except Exception as exc:
                # Not ours to word: a foreign exception's text may carry anything (a
                # token in a URL...), so the model and the log get its type and where
                # it was raised; the full traceback only at DEBUG, on request.
                logger.error(
                    "tool %s failed unexpectedly: %s raised at %s",
                    name,
                    type(exc).__name__,
                    _where(exc),
                )
                logger.debug("traceback of the %s failure", name, exc_info=True)
                return _error_result(
                    f"{name} failed with an internal error ({type(exc).__name__}); "
                    "see the server log"
                )
            finally:
                self._calls.discard(scope)
        if text is None:  # cancelled by shut_down()
            return _error_result(SHUTTING_DOWN)
        return types.CallToolResult(content=[types.TextContent(type="text", text=text)])


SHUTTING_DOWN = "the sandbox server is shutting down: the call was cancelled"


def _where(exc: BaseException) -> str:
    """`file:line` of the frame that raised `exc`."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    if tb is None:
        return "an unknown place"
    return f"{tb.tb_frame.f_code.co_filename}:{tb.tb_lineno}"


def _error_result(message: str) -> types.CallToolResult:
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=message)], is_error=True
    )


EXEC_COMMAND_DESCRIPTION = """\
Run a shell command in the sandbox and return what it printed.

The call waits until the command exits, or `until` text appears, or `yield_time_ms` \
passes (default 10 s, at most 30 s), whichever comes first, then returns:
- "Process exited with code N" and the output: the command is finished; or
- "Process running with session ID N" and the output so far: the command keeps \
running. Use write_stdin with that session_id to poll for more output (empty chars) \
or to type into it, interrupt to send Ctrl-C, terminate to stop it.

Use tty=true for anything interactive (a REPL such as `python3 -q`, a shell, a \
program that prompts, a full-screen program); pair it with `until` set to the prompt \
you expect (e.g. '>>> ') so the call returns as soon as the program is ready. For a \
full-screen program use `until_screen` (text on its rendered screen) and view_screen. \
Leave \
tty=false for ordinary commands (builds, tests, scripts): their stdin is closed, \
unless stdin=true keeps it open for write_stdin (end it with close_stdin). \
Long-running servers are fine: start them, read the first output, and poll later."""

WRITE_STDIN_DESCRIPTION = """\
Type into a running process, or poll it for new output.

With `chars`, the keystrokes are sent to the process (it must have been started with \
tty=true, or with stdin=true until close_stdin) and the output of the next 250 ms \
(or until `until` appears) is returned. \
With empty chars this is a poll: it waits up to 5 s or more (`yield_time_ms`) for new \
output and returns early when the process exits or `until` appears. Output is never \
repeated: each call returns only what is new. When the result says "Process exited \
with code N" the session is finished and its ID is gone."""

CLOSE_STDIN_DESCRIPTION = """\
End the input of a process started with tty=false and stdin=true: it reads \
end-of-file after everything written before with write_stdin (e.g. sort then prints \
its result, a stdio server exits). Then waits like a poll (at least 5 s, returning \
early when the process exits or `until` appears) and returns what it printed. \
Nothing more can be written afterwards. Fails for a tty process (type Ctrl-D, \
'\\u0004', at the start of a line instead) and for one started without stdin=true."""

LIST_PROCESSES_DESCRIPTION = """\
List the processes started with exec_command that are still known: their session \
IDs, commands, whether they are running or exited (an exited process stays listed \
until it is polled once more), and when they were last used. At most 64 are kept; \
when full, starting another drops the least recently used."""

VIEW_SCREEN_DESCRIPTION = """\
Show the terminal screen of a process started with tty=true, rendered as a person at \
the terminal would see it now: full-screen programs (vim, less, top, nano, htop, \
menus) draw with escape sequences that are unreadable in the raw output, so read them \
here. The cursor is marked with █; the result also says whether the program is on \
the alternate screen (full-screen mode) and the window title. To wait for something to \
show on the screen, pass `until_screen` to write_stdin or exec_command."""

INTERRUPT_DESCRIPTION = """\
Send Ctrl-C to a process (works with and without tty). It does not wait: poll with \
write_stdin afterwards to see the effect. A program that ignores Ctrl-C can be \
stopped with terminate."""

RESIZE_DESCRIPTION = """\
Resize the terminal of a process started with tty=true (rows x cols), e.g. before \
running a full-screen program. Fails for a process without a terminal, or where the \
sandbox cannot resize terminals."""

TERMINATE_DESCRIPTION = """\
Stop a process and everything it started, and forget its session ID. Use it for \
servers and programs you no longer need, or that do not respond to interrupt."""


def build_server(tools: SandboxTools, *, instructions: str | None = None) -> Server[Any]:
    """An MCP server exposing `tools` (over an already started session)."""

    async def on_list_tools(
        ctx: Any, params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return types.ListToolsResult(tools=[tool.definition for tool in tools.tools.values()])

    async def on_call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        return await tools.call(params.name, params.arguments)

    return Server(
        SERVER_NAME,
        version=_version(),
        title="Sandbox",
        instructions=instructions,
        on_list_tools=on_list_tools,
        on_call_tool=on_call_tool,
    )


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("agent-sandbox-pty")
    except PackageNotFoundError:
        return "0"


def _instructions(backend: str, session: BaseSandboxSession) -> str:
    where = getattr(session, "workdir", None)
    place = f" Its workspace (the default working directory) is {where}." if where else ""
    return (
        f"Tools to run commands in a {backend} sandbox.{place} Run commands with "
        "exec_command; interact with or poll long-running ones with write_stdin using the "
        "session ID it reports; stop them with interrupt or terminate."
    )


# ---- running -------------------------------------------------------------------------


async def serve(
    session: BaseSandboxSession,
    transport: Transport,
    *,
    backend: str = "sandbox",
    detach: bool = False,
) -> int:
    """Start `session`, serve it until the peer leaves or a stop signal arrives, then
    close it (settled: every process is torn down), or with `detach` detach from it
    (`--state-file`: it stays for the next server). Returns the exit status: 128+N
    after a stop signal N, as every `sandbox` command (0 when the peer left)."""
    status = 0
    starting = anyio.CancelScope()
    tools = SandboxTools(session)
    stopped = False

    def stop(signum: int) -> None:
        # Every signal repeats the stop (each step is idempotent); none cancels the
        # close, which runs shielded below.
        nonlocal stopped
        if not stopped:
            logger.info("received %s: stopping", signal_name(signum))
        stopped = True
        starting.cancel()
        tools.shut_down()
        transport.stop()

    with StopSignals(stop) as signals:
        try:
            with starting:
                await session.start()
            if signals.first is None:
                server = build_server(tools, instructions=_instructions(backend, session))
                await transport.serve(server)
        except SandboxError as exc:
            say(error_line(exc))
            status = EXIT_ERROR
        except OSError as exc:
            # Typically: the HTTP address could not be bound.
            say(error_line(exc))
            status = EXIT_ERROR
        except Exception:
            logger.exception("the MCP transport failed")
            status = 1
        finally:
            with anyio.CancelScope(shield=True):
                try:
                    if detach and session.state is SessionState.RUNNING:
                        await session.detach()  # --state-file: the next server resumes
                    await session.aclose()
                except Exception as exc:
                    say(error_line(f"closing the session failed: {exc}"))
                    status = EXIT_ERROR
    if status == 0 and signals.first is not None:
        status = 128 + signals.first
    return status


def _parse_address(text: str) -> tuple[str, int]:
    host, sep, port_text = text.rpartition(":")
    if not sep or not host or not port_text.isdigit() or int(port_text) > 65535:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT (e.g. 127.0.0.1:8765), got {text!r}")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, int(port_text)


def build_parser(prog: str = "sandbox mcp") -> argparse.ArgumentParser:
    """The `sandbox mcp` argument parser."""
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Serve a sandbox to MCP clients: one sandbox session per server, "
        "over stdio (default) or streamable HTTP.",
    )
    add_backend_arguments(parser)
    state_file.add_arguments(parser)
    parser.add_argument(
        "--http",
        metavar="HOST:PORT",
        type=_parse_address,
        help=f"serve streamable HTTP at http://HOST:PORT{HTTP_PATH} instead of stdio "
        "(port 0 picks a free port; the address is printed on stderr)",
    )
    parser.add_argument(
        "--token-file",
        metavar="PATH",
        help="with --http: require `Authorization: Bearer TOKEN` on every request, TOKEN "
        f"being PATH's content (default: the {TOKEN_ENV} environment variable; one of them "
        "is needed to serve a non-loopback address)",
    )
    parser.add_argument(
        "--allow-origin",
        action="append",
        default=[],
        metavar="ORIGIN",
        help="with --http: also accept requests from this browser Origin, e.g. "
        "http://localhost:3000 (repeatable; by default only the server's own address)",
    )
    parser.add_argument(
        "--allow-host",
        action="append",
        default=[],
        metavar="NAME",
        help="with --http: also accept the Host NAME:PORT (a name the server is reached "
        "by, e.g. on 0.0.0.0; repeatable)",
    )
    parser.add_argument(
        "--log-level",
        default="WARNING",
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        help="log level of the messages written to stderr (default WARNING)",
    )
    return parser


def _fail(exc: BaseException, status: int) -> int:
    say(error_line(exc))
    return status


def _transport(args: argparse.Namespace) -> Transport:
    """The transport `args` ask for; `InvalidArgumentError` for HTTP-only options without
    `--http` and for a refused address or token, `OSError` for a name that does not
    resolve."""
    if not args.http:
        if args.token_file is not None or args.allow_origin or args.allow_host:
            raise InvalidArgumentError("--token-file, --allow-origin and --allow-host need --http")
        if not is_writable(1):
            # Checked before the session starts: the protocol's replies go there.
            raise OSError(
                "standard output is not open for writing, and the stdio transport answers "
                "on it (serve --http instead?)"
            )
        return StdioTransport()
    host, port = args.http
    return HttpTransport(
        host,
        port,
        token=read_token(args.token_file),
        allow_hosts=tuple(args.allow_host),
        allow_origins=tuple(args.allow_origin),
    )


def main(argv: list[str]) -> int:
    """Entry point of `sandbox mcp ARGS...`; returns the process exit status."""
    plug_closed_fds()  # `python -m sandbox.mcp` does not come through the CLI's main
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=getattr(logging, args.log_level),
        stream=sys.stderr,
        format="sandbox mcp: %(levelname)s %(name)s: %(message)s",
    )
    try:
        transport = _transport(args)
        backend, options = options_from_args(args)
        session = state_file.session_for(args, backend, options)
    except InvalidArgumentError as exc:
        return _fail(exc, EXIT_USAGE)
    except (SandboxError, ValueError, TypeError, OSError) as exc:
        return _fail(exc, EXIT_ERROR)
    detach = state_file.detaches(args)
    return asyncio.run(serve(session, transport, backend=session.backend_name, detach=detach))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
