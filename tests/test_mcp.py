"""`sandbox mcp`: the MCP tool server, driven by the official SDK's own client.

Every flow runs against a REAL server subprocess (`sandbox mcp`) over
stdio and over streamable HTTP on 127.0.0.1. The error paths that need a backend unlike
unix_local (no terminal resize, a failing provider) run the same server code in-process
through the SDK's in-process client, on real unix_local subclasses.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import signal
import socket
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.types import CallToolResult

import sandbox
from sandbox.backends.unix_local import UnixLocalSession
from sandbox.errors import ProviderError
from sandbox.mcp.server import SandboxTools, build_server
from sandbox.mcp.server import main as mcp_main
from sandbox.process_entry import PtyEntry
from sandbox.session.hooks import SessionHooks
from sandbox.testing import procfs
from tests.helpers import eventually, host_pids_with_arg, unique_seconds

# The `sandbox` console script next to this interpreter (`sandbox mcp ...`), as a user
# runs it; the module itself where the package is not installed with its scripts.
_SCRIPT = Path(sys.executable).with_name("sandbox")
SERVER_ARGV = [str(_SCRIPT), "mcp"] if _SCRIPT.exists() else [sys.executable, "-m", "sandbox.mcp"]
# The SDK's client passes the server only a few variables: a PYTHONPATH that puts a
# source tree first must reach it too, or the server would run another tree's code; and
# the suite's state folder (tests/conftest.py), or the server would seal its refs with
# another key than the test reads them with.
_PASSED = ("PYTHONPATH", "SANDBOX_STATE_DIR")
SERVER_ENV = {name: os.environ[name] for name in _PASSED if name in os.environ} or None
TOOLS = {
    "exec_command",
    "write_stdin",
    "close_stdin",
    "list_processes",
    "view_screen",
    "interrupt",
    "resize",
    "terminate",
}
# A command that records its shell's parent (the server) and its own pid, atomically,
# then waits: the test finds both in the workspace and checks they die.
PID_RECORDER = (
    "echo $PPID > server.tmp && mv server.tmp server.pid && "
    "echo $$ > cmd.tmp && mv cmd.tmp cmd.pid && exec sleep {marker}"
)


# ---- helpers ---------------------------------------------------------------------------


def text(result: CallToolResult) -> str:
    """The single text block of a tool result."""
    assert len(result.content) == 1
    block = result.content[0]
    assert block.type == "text"
    return block.text


async def ok(client: Client, tool: str, **arguments: Any) -> str:
    """Call a tool that must succeed; its text."""
    result = await client.call_tool(tool, arguments)
    assert not result.is_error, text(result)
    return text(result)


async def error(client: Client, tool: str, **arguments: Any) -> str:
    """Call a tool that must fail with a tool error; its message."""
    result = await client.call_tool(tool, arguments)
    assert result.is_error, text(result)
    return text(result)


def session_id(result_text: str) -> int:
    match = re.search(r"Process running with session ID (\d+)", result_text)
    assert match, result_text
    return int(match.group(1))


# The longest window a call may ask for: one that ran to its deadline is unmistakable.
LONG_WINDOW_MS = 30000


def ended_early(result_text: str, yield_time_ms: int = LONG_WINDOW_MS) -> bool:
    """Whether a call's window ended before its deadline (`until`, `until_screen`, an
    exit did it): the wall time the server reports is under the window it was given, as
    a window that runs to its deadline reports at least its length. A deadline check,
    not a speed check: no clock of the test is read."""
    match = re.match(r"Wall time: (\d+\.\d{3}) seconds", result_text)
    assert match, result_text
    return float(match.group(1)) < yield_time_ms / 1000


def alive(pid: int) -> bool:
    """True while `pid` is a live process (a zombie counts as dead)."""
    return procfs.alive(pid)


async def read_pids(workspace: Path) -> tuple[int, int]:
    """The (server, command) pids written by PID_RECORDER."""
    files = [workspace / "server.pid", workspace / "cmd.pid"]
    assert await eventually(lambda: all(f.exists() for f in files), timeout=20)
    server_pid, cmd_pid = (int(f.read_text()) for f in files)
    return server_pid, cmd_pid


@contextlib.asynccontextmanager
async def stdio_session(workspace: Path, log: Path, *extra: str) -> AsyncIterator[Client]:
    """An SDK client connected over stdio to a fresh server subprocess."""
    params = StdioServerParameters(
        command=SERVER_ARGV[0],
        args=[*SERVER_ARGV[1:], "--workdir", str(workspace), *extra],
        env=SERVER_ENV,
    )
    with log.open("a") as errlog:
        async with Client(stdio_client(params, errlog=errlog)) as client:
            yield client


class HttpServer:
    """A `sandbox mcp --http HOST:0` subprocess and the URL it announced."""

    def __init__(self, proc: asyncio.subprocess.Process, url: str) -> None:
        self.proc = proc
        self.url = url
        self.stderr: list[str] = []
        assert proc.stderr is not None
        self._drain = asyncio.ensure_future(self._collect(proc.stderr))

    async def _collect(self, stream: asyncio.StreamReader) -> None:
        async for line in stream:
            self.stderr.append(line.decode(errors="replace"))

    async def stop(self, sig: int = signal.SIGTERM) -> int:
        """Signal the server and wait for it to exit; its exit status."""
        if self.proc.returncode is None:
            self.proc.send_signal(sig)
        async with asyncio.timeout(20):
            code = await self.proc.wait()
            await self._drain
        return code


@contextlib.asynccontextmanager
async def http_server(
    workspace: Path, host: str = "127.0.0.1", *extra: str, env: dict[str, str] | None = None
) -> AsyncIterator[HttpServer]:
    shown = f"[{host}]" if ":" in host else host
    proc = await asyncio.create_subprocess_exec(
        *SERVER_ARGV,
        "--workdir",
        str(workspace),
        "--http",
        f"{shown}:0",
        *extra,
        stdin=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
        env=env,
    )
    try:
        assert proc.stderr is not None
        before: list[str] = []  # what a --log-level DEBUG server logs before it listens
        async with asyncio.timeout(30):
            while True:
                line = (await proc.stderr.readline()).decode()
                match = re.search(rf"at (http://{re.escape(shown)}:\d+/mcp)$", line.strip())
                if match or not line:
                    break
                before.append(line)
        assert match, before
        server = HttpServer(proc, match.group(1))
        server.stderr[:0] = before
        yield server
    finally:
        # On a failed test: stop it the clean way first, so its processes go too.
        if proc.returncode is None:
            proc.terminate()
            try:
                async with asyncio.timeout(10):
                    await proc.wait()
            except TimeoutError:
                proc.kill()
                await proc.wait()


# ---- the flow, shared by both transports -----------------------------------------------


async def check_tool_schemas(client: Client) -> None:
    tools = {tool.name: tool for tool in (await client.list_tools()).tools}
    assert set(tools) == TOOLS
    for tool in tools.values():
        assert tool.description and len(tool.description) > 80, tool.name
        schema = tool.input_schema
        assert schema["type"] == "object"
        assert schema.get("additionalProperties") is False
    exec_schema = tools["exec_command"].input_schema
    assert exec_schema["required"] == ["cmd"]
    props = exec_schema["properties"]
    assert set(props) == {
        "cmd",
        "workdir",
        "tty",
        "stdin",
        "yield_time_ms",
        "max_output_tokens",
        "until",
        "until_screen",
    }
    assert props["cmd"]["type"] == "string"
    assert props["tty"]["type"] == "boolean"
    assert props["tty"]["default"] is False
    assert {"type": "integer"} in props["yield_time_ms"]["anyOf"]
    assert {"type": "string"} in props["until"]["anyOf"]
    write_schema = tools["write_stdin"].input_schema
    assert write_schema["required"] == ["session_id"]
    assert write_schema["properties"]["session_id"]["type"] == "integer"
    assert write_schema["properties"]["chars"]["default"] == ""
    assert tools["resize"].input_schema["required"] == ["session_id", "rows", "cols"]
    assert tools["list_processes"].input_schema.get("properties", {}) == {}
    assert tools["list_processes"].annotations is not None
    assert tools["list_processes"].annotations.read_only_hint is True
    # The descriptions teach the protocol: tty for interactive programs, how to poll,
    # how to stop.
    exec_text = tools["exec_command"].description or ""
    for phrase in ("tty=true", "write_stdin", "session ID", "interrupt", "terminate", "until"):
        assert phrase in exec_text, phrase
    assert "empty chars" in (tools["write_stdin"].description or "")


async def run_flow(client: Client, workspace: Path) -> None:
    """echo, a failing command, a PTY REPL with `until`, resize, a long process polled
    and interrupted, list, terminate, truncation, workdir."""
    out = await ok(client, "exec_command", cmd="echo hi")
    lines = out.splitlines()
    assert re.fullmatch(r"Wall time: \d+\.\d{3} seconds", lines[0]), out
    assert lines[1:] == ["Process exited with code 0", "Output:", "hi"]

    out = await ok(client, "exec_command", cmd="echo oops >&2; exit 3")
    assert "Process exited with code 3" in out
    assert out.endswith("Output:\noops\n")

    out = await ok(client, "exec_command", cmd="exit 0")
    assert out.endswith("Process exited with code 0\nOutput: (none)")

    # A PTY REPL, driven with `until`: every window ends when it appears, long before
    # its deadline.
    long = LONG_WINDOW_MS
    out = await ok(
        client, "exec_command", cmd="python3 -q", tty=True, until=">>> ", yield_time_ms=long
    )
    assert ended_early(out)
    repl = session_id(out)
    assert out.endswith(">>> ")
    out = await ok(
        client,
        "write_stdin",
        session_id=repl,
        chars="print(6*7)\n",
        until=">>> ",
        yield_time_ms=long,
    )
    assert ended_early(out)
    assert "42" in out and session_id(out) == repl
    await ok(client, "resize", session_id=repl, rows=40, cols=123)
    out = await ok(
        client,
        "write_stdin",
        session_id=repl,
        chars="import os; print(tuple(os.get_terminal_size()))\n",
        # Not the prompt: the REPL redraws it when the terminal is resized.
        until="(123, 40)",
        yield_time_ms=long,
    )
    assert ended_early(out)
    assert "(123, 40)" in out

    # A long process: poll it until it has printed enough, then Ctrl-C it.
    loop = "i=0; while :; do echo tick $i; i=$((i+1)); sleep 0.02; done"
    out = await ok(client, "exec_command", cmd=loop, yield_time_ms=250)
    ticker = session_id(out)
    out = await ok(client, "write_stdin", session_id=ticker, until="tick 8")
    assert "tick 8" in out and session_id(out) == ticker

    listing = await ok(client, "list_processes")
    assert re.search(rf"session {repl}: running; tty; .*command: python3 -q", listing), listing
    assert re.search(rf"session {ticker}: running; no tty; .*command: i=0;", listing), listing

    out = await ok(client, "interrupt", session_id=ticker)
    assert f"Sent Ctrl-C to session {ticker}" in out
    out = await ok(client, "write_stdin", session_id=ticker)
    assert "Process exited with code 130" in out  # 128 + SIGINT

    out = await ok(client, "terminate", session_id=repl)
    assert f"Session {repl} terminated" in out
    listing = await ok(client, "list_processes")
    assert listing == "No processes. Start one with exec_command."
    message = await error(client, "write_stdin", session_id=repl, chars="1\n")
    assert f"no process with id {repl}" in message

    # Truncation reports the original size; workdir is honoured.
    out = await ok(client, "exec_command", cmd="seq 1 20000", max_output_tokens=40)
    count = re.search(r"Original token count: (\d+)", out)
    assert count and int(count.group(1)) > 20000
    assert len(out) < 600
    (workspace / "sub").mkdir(exist_ok=True)
    out = await ok(client, "exec_command", cmd="pwd", workdir="sub")
    assert out.endswith(f"{workspace / 'sub'}\n")


async def run_error_paths(client: Client) -> None:
    """Every error reaches the model as a tool error with the library's message; the
    server keeps serving."""
    for tool, args in (
        ("write_stdin", {"session_id": 99, "chars": "x"}),
        ("write_stdin", {"session_id": 99}),
        ("interrupt", {"session_id": 99}),
        ("terminate", {"session_id": 99}),
        ("resize", {"session_id": 99, "rows": 10, "cols": 10}),
    ):
        message = await error(client, tool, **args)
        assert "no process with id 99" in message, message
        assert "list_processes" in message and "pty_processes" not in message

    out = await ok(client, "exec_command", cmd="sleep 30", yield_time_ms=250)
    piped = session_id(out)
    message = await error(client, "write_stdin", session_id=piped, chars="hello\n")
    assert "stdin is closed" in message and "tty=True" in message
    message = await error(client, "resize", session_id=piped, rows=30, cols=100)
    assert "no terminal" in message
    await ok(client, "terminate", session_id=piped)

    out = await ok(client, "exec_command", cmd="cat", tty=True, yield_time_ms=250)
    catty = session_id(out)
    message = await error(client, "resize", session_id=catty, rows=0, cols=100)
    assert "rows must be between 1 and" in message
    await ok(client, "terminate", session_id=catty)

    # Bad arguments, caught by the schema or by the library.
    assert "cmd: Field required" in await error(client, "exec_command")
    assert "cmd: Input should be a valid string" in await error(client, "exec_command", cmd=7)
    message = await error(client, "exec_command", cmd="true", yield_time=5)
    assert "yield_time: Extra inputs are not permitted" in message
    message = await error(client, "exec_command", cmd="true", yield_time_ms=-5)
    assert "yield_time_s must be >= 0" in message
    message = await error(client, "exec_command", cmd="true", max_output_tokens=0)
    assert "max_output_tokens must be a positive int" in message
    message = await error(client, "write_stdin", session_id="abc")
    assert "session_id: Input should be a valid integer" in message
    assert "abc" not in message  # the rejected value is not echoed back
    assert "unknown tool 'rm_rf'" in await error(client, "rm_rf")
    # An empty `until` means no pattern, not an error.
    assert "code 0" in await ok(client, "exec_command", cmd="true", until="")

    assert "No processes" in await ok(client, "list_processes")


# ---- stdio -----------------------------------------------------------------------------


async def test_stdio_tools_and_flow(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    async with stdio_session(workspace, tmp_path / "server.log") as client:
        assert client.server_info is not None and client.server_info.name == "sandbox"
        assert str(workspace) in (client.instructions or "")
        await check_tool_schemas(client)
        await run_flow(client, workspace)


async def test_stdio_error_paths(tmp_path: Path) -> None:
    async with stdio_session(tmp_path / "ws", tmp_path / "server.log") as client:
        await run_error_paths(client)


async def test_bad_workdir_is_a_clear_tool_error(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    async with stdio_session(workspace, tmp_path / "server.log") as client:
        await ok(client, "exec_command", cmd="touch a-file")
        for tty in (False, True):
            message = await error(client, "exec_command", cmd="pwd", workdir="missing", tty=tty)
            assert message == "the working directory (workdir) 'missing' does not exist", message
            message = await error(client, "exec_command", cmd="pwd", workdir="a-file", tty=tty)
            assert "(workdir) 'a-file' is not a directory" in message, message
        assert "No processes" in await ok(client, "list_processes")
        out = await ok(client, "exec_command", cmd="pwd", workdir=str(workspace))
        assert out.endswith(f"Output:\n{workspace}\n")
    assert "unexpectedly" not in (tmp_path / "server.log").read_text()


def _numbered_file(tmp_path: Path) -> Path:
    """A workspace holding f.txt: 200 numbered lines, more than a screen."""
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "f.txt").write_text("".join(f"line {i:03d}\n" for i in range(200)))
    return workspace


async def _open_in_less(client: Client) -> str:
    """`less f.txt` on a terminal, the call ending when its first page is on the screen."""
    return await ok(
        client,
        "exec_command",
        cmd="LESSHISTFILE=- less f.txt",
        tty=True,
        until_screen="line 022",
        yield_time_ms=20000,
    )


async def test_view_screen_shows_a_full_screen_program(tmp_path: Path) -> None:
    async with stdio_session(_numbered_file(tmp_path), tmp_path / "server.log") as client:
        out = await _open_in_less(client)
        pager = session_id(out)
        out = await ok(client, "view_screen", session_id=pager)
        lines = out.splitlines()
        assert lines[0] == (
            f"Session {pager}. Screen (24 rows x 80 columns; alternate screen: yes; "
            "title: (none); cursor: row 24, column 6 (marked █)):"
        ), out
        assert lines[1:24] == [f"line {i:03d}" for i in range(23)]
        assert lines[24] == "f.txt█", out
        # Pipes have no screen: a clear tool error.
        out = await ok(client, "exec_command", cmd="sleep 30", yield_time_ms=250)
        message = await error(client, "view_screen", session_id=session_id(out))
        assert "no terminal (tty=False), so no screen" in message
        assert "no process with id 99" in await error(client, "view_screen", session_id=99)


async def test_write_stdin_until_screen_returns_the_screen(tmp_path: Path) -> None:
    async with stdio_session(_numbered_file(tmp_path), tmp_path / "server.log") as client:
        out = await _open_in_less(client)
        pager = session_id(out)
        assert "alternate screen: yes" in out  # until_screen: the screen comes along
        out = await ok(
            client,
            "write_stdin",
            session_id=pager,
            chars=" ",
            until_screen="line 045",
            yield_time_ms=20000,
        )
        assert ended_early(out, 20000)  # the screen ended the window, not its deadline
        screen = out.split("(marked █)):\n", 1)[1].splitlines()
        assert screen[:23] == [f"line {i:03d}" for i in range(23, 46)], out
        # Without until_screen, no screen in the result.
        out = await ok(
            client, "write_stdin", session_id=pager, chars="q", until="x", yield_time_ms=2000
        )
        assert "Screen (" not in out


async def test_the_largest_screen_is_cut_for_the_model(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    async with stdio_session(workspace, tmp_path / "server.log") as client:
        out = await ok(
            client,
            "exec_command",
            cmd="read x; printf '\\033#8'; exec sleep 600",
            tty=True,
            yield_time_ms=250,
        )
        tty = session_id(out)
        await ok(client, "resize", session_id=tty, rows=1000, cols=1000)
        message = await error(client, "resize", session_id=tty, rows=1001, cols=1000)
        assert "rows must be between 1 and 1000" in message
        # Accepted, but past the cells a screen is rendered for: a clear error.
        message = await error(client, "view_screen", session_id=tty)
        assert "1,000,000 cells" in message and "resize it smaller" in message
        await ok(client, "resize", session_id=tty, rows=500, cols=500)  # the largest rendered
        out = await ok(
            client,
            "write_stdin",
            session_id=tty,
            chars="\n",
            until_screen="E" * 500,
            yield_time_ms=20000,
        )
        for text in (out, await ok(client, "view_screen", session_id=tty)):
            screen = text.split("(marked █)):\n", 1)[1]
            rows = screen.splitlines()
            # Whole rows of the 500 x 500 screen (250,000 characters), up to the cap.
            # The cursor stayed where the echoed newline left it.
            assert rows[:2] == ["E" * 500, "█" + "E" * 500]  # the marker is inserted
            assert rows[2:-1] == ["E" * 500] * (len(rows) - 3)
            assert len(screen) - len(rows[-1]) <= 65_536
            assert rows[-1] == f"(screen text cut at 65536 characters, in row {len(rows)} of 500)"


async def test_list_processes_says_which_have_a_screen(tmp_path: Path) -> None:
    async with stdio_session(tmp_path / "ws", tmp_path / "server.log") as client:
        tty = session_id(await ok(client, "exec_command", cmd="cat", tty=True, yield_time_ms=250))
        pipe = session_id(await ok(client, "exec_command", cmd="sleep 30", yield_time_ms=250))
        listing = await ok(client, "list_processes")
        assert re.search(rf"session {tty}: running; tty; screen \(view_screen\); ", listing)
        assert re.search(rf"session {pipe}: running; no tty; started ", listing), listing


async def test_stdio_legacy_handshake(tmp_path: Path) -> None:
    """A client of the older initialize handshake is served the same way."""
    params = StdioServerParameters(
        command=SERVER_ARGV[0], args=[*SERVER_ARGV[1:], "--workdir", str(tmp_path / "ws")]
    )
    async with Client(params, mode="legacy") as client:
        assert client.protocol_version != "2026-07-28"
        out = await ok(client, "exec_command", cmd="python3 -q", tty=True, until=">>> ")
        out = await ok(
            client, "write_stdin", session_id=session_id(out), chars="1+1\n", until=">>> "
        )
        assert "2" in out


async def test_stdin_closed_stops_the_server_and_its_processes(tmp_path: Path) -> None:
    """Closing stdin alone (no signal) makes the server tear everything down and exit 0.
    Spoken raw on the pipes so the exit status is ours to see."""
    workspace = tmp_path / "ws"
    marker = unique_seconds()
    proc = await asyncio.create_subprocess_exec(
        *SERVER_ARGV,
        "--workdir",
        str(workspace),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )
    assert proc.stdin is not None and proc.stdout is not None

    async def request(ident: int, method: str, params: dict[str, Any]) -> dict[str, Any]:
        assert proc.stdin is not None and proc.stdout is not None
        message = {"jsonrpc": "2.0", "id": ident, "method": method, "params": params}
        proc.stdin.write(json.dumps(message).encode() + b"\n")
        await proc.stdin.drain()
        reply: dict[str, Any] = json.loads(await proc.stdout.readline())
        assert reply["id"] == ident
        return reply

    async with asyncio.timeout(30):
        reply = await request(
            1,
            "initialize",
            {
                "protocolVersion": "2025-06-18",
                "capabilities": {},
                "clientInfo": {"name": "raw", "version": "0"},
            },
        )
        assert reply["result"]["serverInfo"]["name"] == "sandbox"
        proc.stdin.write(b'{"jsonrpc":"2.0","method":"notifications/initialized"}\n')
        command = PID_RECORDER.format(marker=marker)
        reply = await request(
            2,
            "tools/call",
            {"name": "exec_command", "arguments": {"cmd": command, "yield_time_ms": 250}},
        )
        assert "Process running with session ID" in reply["result"]["content"][0]["text"]
        server_pid, cmd_pid = await read_pids(workspace)
        assert server_pid == proc.pid and alive(cmd_pid)
        proc.stdin.close()
        assert await proc.wait() == 0
    assert not alive(cmd_pid)
    assert await eventually(lambda: not host_pids_with_arg(marker))


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
async def test_signal_mid_call_stops_everything(tmp_path: Path, sig: int) -> None:
    """A signal while a call is in flight and the client still holds stdin open: the
    server cancels the call, tears every process down, and exits."""
    workspace = tmp_path / "ws"
    marker = unique_seconds()
    async with stdio_session(workspace, tmp_path / "server.log") as client:
        out = await ok(client, "exec_command", cmd=f"sleep {marker}", yield_time_ms=250)
        session_id(out)
        call = asyncio.ensure_future(
            client.call_tool(
                "exec_command",
                {"cmd": PID_RECORDER.format(marker=marker), "yield_time_ms": 30000},
            )
        )
        server_pid, cmd_pid = await read_pids(workspace)
        assert not call.done()
        os.kill(server_pid, sig)
        assert await eventually(lambda: not alive(server_pid), timeout=10)
        # The call was cut short, not left to its 30 s window: it was answered "shutting
        # down", or the connection closed under it.
        try:
            result = await call
        except Exception:
            pass
        else:
            assert result.is_error, text(result)
    assert not alive(cmd_pid)
    assert await eventually(lambda: not host_pids_with_arg(marker))
    log = (tmp_path / "server.log").read_text()
    assert log == ""  # a clean stop logs nothing


# A client in its own process, killed with SIGKILL in the middle of a tool call.
CHILD_CLIENT = """
import asyncio, sys
from mcp import Client, StdioServerParameters

async def main(target, workspace, background, command, *server_argv):
    if target == "stdio":
        target = StdioServerParameters(
            command=server_argv[0], args=[*server_argv[1:], "--workdir", workspace]
        )
    async with Client(target) as client:
        # One process left running in the background, one call in flight.
        result = await client.call_tool("exec_command", {"cmd": background, "yield_time_ms": 250})
        assert "Process running" in result.content[0].text, result
        await client.call_tool("exec_command", {"cmd": command, "yield_time_ms": 30000})
        print("the call returned: the test expected to kill us first", flush=True)

asyncio.run(main(*sys.argv[1:]))
"""


async def start_child_client(target: str, workspace: Path, marker: str, log: Path) -> Any:
    """The child client: `sleep MARKER` left running, then PID_RECORDER in flight."""
    with log.open("a") as errlog:
        return await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            CHILD_CLIENT,
            target,
            str(workspace),
            f"sleep {marker}",
            PID_RECORDER.format(marker=marker),
            *SERVER_ARGV,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=errlog,
            stderr=errlog,
        )


async def test_client_killed_mid_call_stdio(tmp_path: Path) -> None:
    """The client dies abruptly (SIGKILL) while a call is in flight: the server sees its
    stdin close, tears the process down and exits."""
    workspace = tmp_path / "ws"
    workspace.mkdir()
    marker = unique_seconds()
    child = await start_child_client("stdio", workspace, marker, tmp_path / "client.log")
    try:
        server_pid, cmd_pid = await read_pids(workspace)
        assert alive(server_pid) and alive(cmd_pid)
        # The background one and this one (which writes its pid before it execs `sleep`).
        assert await eventually(lambda: len(host_pids_with_arg(marker)) == 2)
    finally:
        child.kill()
        await child.wait()
    assert await eventually(lambda: not alive(server_pid), timeout=10)
    assert not alive(cmd_pid)
    assert await eventually(lambda: not host_pids_with_arg(marker))
    # The server's stderr went to the client's log: it stopped without a complaint.
    assert (tmp_path / "client.log").read_text() == ""


async def test_start_failure_is_reported(tmp_path: Path) -> None:
    proc = await asyncio.create_subprocess_exec(
        *SERVER_ARGV,
        "--opt",
        "no_such_option=1",
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    async with asyncio.timeout(30):
        stdout, stderr = await proc.communicate()
    # A rejected option is bad usage, as for `sandbox run`: exit 2, one line.
    assert proc.returncode == 2
    assert stdout == b""
    assert stderr.startswith(b"sandbox: error:") and stderr.count(b"\n") == 1
    assert b"no_such_option" in stderr and b"Traceback" not in stderr


async def test_bad_http_address_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as info:
        mcp_main(["--http", "no-port-here"])
    assert info.value.code == 2
    # A port already taken: a clean error, no traceback, nothing left behind.
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = await asyncio.create_subprocess_exec(
            *SERVER_ARGV,
            "--workdir",
            str(tmp_path / "ws"),
            "--http",
            f"127.0.0.1:{port}",
            stdin=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )
        async with asyncio.timeout(30):
            _, stderr = await proc.communicate()
    assert proc.returncode == 1
    assert b"Address already in use" in stderr and b"Traceback" not in stderr


# ---- streamable HTTP ---------------------------------------------------------------------


async def test_http_tools_flow_and_errors(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    async with http_server(workspace) as server:
        async with Client(server.url) as client:
            await check_tool_schemas(client)
            await run_flow(client, workspace)
            await run_error_paths(client)
        # Processes belong to the server, not to one HTTP client: a later client finds
        # what an earlier one left running.
        marker = unique_seconds()
        async with Client(server.url, mode="legacy") as client:
            out = await ok(client, "exec_command", cmd=f"sleep {marker}", yield_time_ms=250)
            left = session_id(out)
        async with Client(server.url) as client:
            assert f"session {left}: running" in await ok(client, "list_processes")
        # Running is not yet exec'd: `sh -c "sleep N"` shows N once `sleep` runs.
        assert await eventually(lambda: bool(host_pids_with_arg(marker)))
        assert await server.stop() == 128 + signal.SIGTERM
        assert await eventually(lambda: not host_pids_with_arg(marker))
        assert server.stderr == []  # a clean stop logs nothing


async def test_http_client_killed_mid_call_then_server_stopped(tmp_path: Path) -> None:
    """An HTTP client killed mid-call: the server cancels that call, which tears its
    process down, and keeps serving. Stopping the server (SIGTERM) with a client
    connected and a call in flight then answers the call and ends everything at once."""
    workspace = tmp_path / "ws"
    marker = unique_seconds()
    async with http_server(workspace) as server:
        child = await start_child_client(server.url, workspace, marker, tmp_path / "client.log")
        try:
            server_pid, cmd_pid = await read_pids(workspace)
            assert server_pid == server.proc.pid
            # The background one and this one (which writes its pid before it execs `sleep`).
            assert await eventually(lambda: len(host_pids_with_arg(marker)) == 2)
        finally:
            child.kill()
            await child.wait()
        assert await eventually(lambda: not alive(cmd_pid), timeout=10)
        # The process it had left in the background belongs to the server: still there.
        assert len(host_pids_with_arg(marker)) == 1

        async with Client(server.url, mode="legacy") as client:
            listing = await ok(client, "list_processes")
            assert "1 process," in listing and f"command: sleep {marker}" in listing
            call = asyncio.ensure_future(
                client.call_tool("exec_command", {"cmd": f"sleep {marker}", "yield_time_ms": 30000})
            )
            try:
                assert await eventually(lambda: len(host_pids_with_arg(marker)) == 2, timeout=10)
                assert await server.stop() == 128 + signal.SIGTERM
            finally:
                result = await call
            # Cut short by the stop ("shutting down"), not left to its 30 s window.
            assert result.is_error and "shutting down" in text(result)
    assert await eventually(lambda: not host_pids_with_arg(marker))
    assert server.stderr == []  # a clean stop logs nothing


# ---- in-process: errors that need another kind of backend -----------------------------------


class NoResizeSession(UnixLocalSession):
    """unix_local as a provider without terminal resize (the base hook's refusal; its
    default would resize through unix_local's handle)."""

    async def _resize(self, entry: PtyEntry, rows: int, cols: int) -> None:
        raise sandbox.UnsupportedOperationError(
            f"the {self.backend_name} backend cannot resize a terminal"
        )


class FailingProviderSession(UnixLocalSession):
    """unix_local whose provider fails every start: first with a provider error, then
    with a foreign exception whose text carries a secret."""

    secret = "sk-live-" + unique_seconds()

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.failures = 0

    async def _spawn_process(self, entry: PtyEntry) -> None:
        self.failures += 1
        if self.failures == 1:
            raise ProviderError("the provider is busy (HTTP 503)", retryable=True)
        raise RuntimeError(f"request to https://api.example/?token={self.secret} failed")


@contextlib.asynccontextmanager
async def in_process(session: sandbox.BaseSandboxSession) -> AsyncIterator[Client]:
    async with session:
        async with Client(build_server(SandboxTools(session))) as client:
            yield client


async def test_unsupported_resize_is_a_tool_error(tmp_path: Path) -> None:
    async with in_process(NoResizeSession(workdir=tmp_path / "ws")) as client:
        out = await ok(client, "exec_command", cmd="cat", tty=True, yield_time_ms=250)
        message = await error(client, "resize", session_id=session_id(out), rows=30, cols=90)
        assert "cannot resize a terminal" in message


async def test_close_stdin_ends_the_input_of_a_pipes_process(tmp_path: Path) -> None:
    async with in_process(UnixLocalSession(workdir=tmp_path / "ws")) as client:
        out = await ok(client, "exec_command", cmd="echo ready; sort", stdin=True, until="ready")
        sorter = session_id(out)
        out = await ok(client, "write_stdin", session_id=sorter, chars="pear\napple\n")
        assert "Output: (none)" in out  # sort waits for the end of its input
        out = await ok(client, "close_stdin", session_id=sorter, yield_time_ms=20000)
        assert "Process exited with code 0" in out
        assert out.endswith("Output:\napple\npear\n"), out
        # The errors speak the tools' words.
        out = await ok(client, "exec_command", cmd="cat", tty=True, yield_time_ms=250)
        message = await error(client, "close_stdin", session_id=session_id(out))
        assert "runs on a terminal (tty=True)" in message
        out = await ok(client, "exec_command", cmd="sleep 30", yield_time_ms=250)
        message = await error(client, "close_stdin", session_id=session_id(out))
        assert "without stdin=true" in message
        message = await error(client, "write_stdin", session_id=session_id(out), chars="x")
        assert "with stdin=true to keep its stdin open" in message


class NoOpenStdinSession(UnixLocalSession):
    """unix_local as a provider that cannot keep stdin open: the hook is the base's, and
    its handles do not say they can."""

    _close_stdin = SessionHooks._close_stdin
    _stdin_stays_open = False


async def test_open_stdin_is_refused_at_start_where_the_backend_cannot(tmp_path: Path) -> None:
    async with in_process(NoOpenStdinSession(workdir=tmp_path / "ws")) as client:
        message = await error(client, "exec_command", cmd="sort", stdin=True)
        assert message.startswith("stdin=true: the unix_local backend cannot keep"), message
        assert "No processes" in await ok(client, "list_processes")
        # stdin is ignored with tty=true: a terminal always takes input.
        out = await ok(client, "exec_command", cmd="cat", tty=True, stdin=True, yield_time_ms=250)
        session_id(out)


async def test_provider_failures_are_tool_errors_without_secrets(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="sandbox")
    session = FailingProviderSession(workdir=tmp_path / "ws")
    async with in_process(session) as client:
        message = await error(client, "exec_command", cmd="true")
        assert "the provider is busy (HTTP 503)" in message
        assert "retrying later may help" in message
        message = await error(client, "exec_command", cmd="true")
        assert "internal error (RuntimeError)" in message
        assert session.secret not in message
        # The server keeps serving after both.
        assert "No processes" in await ok(client, "list_processes")
    assert session.state is sandbox.SessionState.CLOSED
    assert "exec_command failed unexpectedly: RuntimeError raised at" in caplog.text
    assert session.secret not in caplog.text


async def test_shut_down_answers_calls_in_flight(tmp_path: Path) -> None:
    """`SandboxTools.shut_down()` (what a stop signal triggers) answers an in-flight
    call at once and tears its process down; later calls are refused."""
    marker = unique_seconds()
    session = sandbox.open_session("unix_local", workdir=tmp_path / "ws")
    async with session:
        tools = SandboxTools(session)
        call = asyncio.ensure_future(
            tools.call("exec_command", {"cmd": f"sleep {marker}", "yield_time_ms": 30000})
        )
        assert await eventually(lambda: bool(host_pids_with_arg(marker)))
        tools.shut_down()
        result = await asyncio.wait_for(call, 5)
        assert result.is_error and "shutting down" in text(result)
        assert await eventually(lambda: not host_pids_with_arg(marker))
        assert session.pty_processes() == []
        late = await tools.call("list_processes", {})
        assert late.is_error and "shutting down" in text(late)


# ---- who may talk to the HTTP server: Host, Origin, bearer token --------------------------

TOKEN = "s3cret-Token_for.tests~0123456789"
MCP_HEADERS = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-03-26",
        "capabilities": {},
        "clientInfo": {"name": "raw-http-test", "version": "1"},
    },
}


def _ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
    except OSError:
        return False
    return True


_IPV6 = pytest.mark.skipif(not _ipv6_loopback(), reason="no IPv6 loopback")


def _touch_call(name: str) -> dict[str, Any]:
    """A tools/call that would leave `name` in the workspace if it ran."""
    return {
        "jsonrpc": "2.0",
        "id": 2,
        "method": "tools/call",
        "params": {"name": "exec_command", "arguments": {"cmd": f"touch {name}"}},
    }


class RawHttp:
    """Plain HTTP requests to a server, with the headers a test chooses (a forged Host
    included: httpx sends the Host header it is given)."""

    def __init__(self, url: str, token: str | None) -> None:
        import httpx

        self.url = url
        self.authority = url.split("/")[2]  # HOST:PORT as the server announced it
        self.port = int(self.authority.rsplit(":", 1)[1])
        self.token = token
        self.client = httpx.AsyncClient(timeout=30)

    def headers(self, **extra: str | None) -> dict[str, str]:
        """The MCP headers, a good Host and the token; `extra` overrides (None drops)."""
        headers = {**MCP_HEADERS, "Host": self.authority}
        if self.token is not None:
            headers["Authorization"] = f"Bearer {self.token}"
        for name, value in extra.items():
            key = name.replace("_", "-")
            headers = {k: v for k, v in headers.items() if k.lower() != key.lower()}
            if value is not None:
                headers[key] = value
        return headers

    async def post(self, body: dict[str, Any], headers: dict[str, str]) -> Any:
        return await self.client.post(self.url, json=body, headers=headers)


async def _open_session(raw: RawHttp) -> str:
    """Initialize an MCP session with good headers; its id."""
    response = await raw.post(INITIALIZE, raw.headers())
    assert response.status_code == 200, response.text
    sid = response.headers["mcp-session-id"]
    note = {"jsonrpc": "2.0", "method": "notifications/initialized"}
    response = await raw.post(note, raw.headers(mcp_session_id=sid))
    assert response.status_code == 202, response.text
    return str(sid)


# Every loopback address kind, with and without a token (each case starts a server, so
# not every pairing: the token is checked after Host and Origin, whatever the address).
@pytest.mark.parametrize(
    ("host", "with_token"),
    [
        pytest.param("127.0.0.1", False, id="127.0.0.1-no-token"),
        pytest.param("127.0.0.2", False, id="127.0.0.2-no-token"),
        pytest.param("127.0.0.2", True, id="127.0.0.2-token"),
        pytest.param("::1", True, id="::1-token", marks=_IPV6),
    ],
)
async def test_http_refuses_foreign_host_and_origin(
    tmp_path: Path, host: str, with_token: bool
) -> None:
    """On every loopback address (not only the three names the SDK protects), a request
    naming another Host or coming from another Origin is refused with 403 before the
    SDK sees it: no MCP session, no command run, whether or not a token is set."""
    workspace = tmp_path / "ws"
    extra: list[str] = []
    if with_token:
        token_file = tmp_path / "token"
        token_file.write_text(f"  {TOKEN}\n")
        extra = ["--token-file", str(token_file)]
    async with http_server(workspace, host, *extra) as server:
        raw = RawHttp(server.url, TOKEN if with_token else None)
        async with raw.client:
            sid = await _open_session(raw)
            other_port = str(raw.port + 1 if raw.port < 65535 else raw.port - 1)
            bound = raw.authority.rsplit(":", 1)[0]
            forged = [
                {"Host": f"evil.example:{raw.port}"},
                {"Host": "evil.example"},
                {"Host": f"{bound}:{other_port}"},
                {"Host": f"localhost.evil.example:{raw.port}"},
                {"Origin": "http://evil.example"},
                {"Origin": f"http://evil.example:{raw.port}"},
                {"Origin": "null"},
                {"Origin": f"http://{bound}:{other_port}"},
                {"Origin": f"https://{raw.authority}"},
                {"Host": f"evil.example:{raw.port}", "Origin": "http://evil.example"},
            ]
            for number, overrides in enumerate(forged):
                init = await raw.post(INITIALIZE, raw.headers(**overrides))
                assert init.status_code == 403, (overrides, init.status_code, init.text)
                assert "mcp-session-id" not in init.headers
                assert init.text.startswith("forbidden:")
                call = await raw.post(
                    _touch_call(f"forged-{number}"), raw.headers(mcp_session_id=sid, **overrides)
                )
                assert call.status_code == 403, (overrides, call.status_code, call.text)
            # The server's own names, as a browser on them would send them, are served.
            good = [
                {},
                {"Host": f"localhost:{raw.port}", "Origin": f"http://localhost:{raw.port}"},
                {"Host": f"127.0.0.1:{raw.port}", "Origin": f"http://127.0.0.1:{raw.port}"},
                {"Host": f"[::1]:{raw.port}", "Origin": f"http://[::1]:{raw.port}"},
                {"Origin": f"http://{raw.authority}"},
            ]
            for number, overrides in enumerate(good):
                call = await raw.post(
                    _touch_call(f"good-{number}"), raw.headers(mcp_session_id=sid, **overrides)
                )
                assert call.status_code == 200, (overrides, call.status_code, call.text)
                assert "Process exited with code 0" in call.text, call.text
        assert await server.stop() == 128 + signal.SIGTERM
    made = sorted(path.name for path in workspace.iterdir())
    assert made == [f"good-{number}" for number in range(len(good))]
    assert not any(TOKEN in line for line in server.stderr)


@pytest.mark.parametrize("host", ["127.0.0.2"])
async def test_http_token_is_required_on_every_request(tmp_path: Path, host: str) -> None:
    """With SANDBOX_MCP_TOKEN set, a request without `Authorization: Bearer TOKEN`
    (missing, wrong, another scheme, the token as a prefix) is refused with 401: it
    opens no session and runs nothing. The token never reaches the server's stderr."""
    workspace = tmp_path / "ws"
    env = {**os.environ, "SANDBOX_MCP_TOKEN": TOKEN}
    async with http_server(workspace, host, "--log-level", "DEBUG", env=env) as server:
        raw = RawHttp(server.url, TOKEN)
        async with raw.client:
            sid = await _open_session(raw)
            refused: list[str | None] = [
                None,
                "Bearer",
                "Bearer wrong-token",
                f"Bearer {TOKEN}x",
                f"Bearer {TOKEN[:-1]}",
                f"Basic {TOKEN}",
                TOKEN,
            ]
            for number, authorization in enumerate(refused):
                init = await raw.post(INITIALIZE, raw.headers(authorization=authorization))
                assert init.status_code == 401, (authorization, init.status_code, init.text)
                assert "mcp-session-id" not in init.headers
                assert init.headers["www-authenticate"].startswith("Bearer")
                call = await raw.post(
                    _touch_call(f"refused-{number}"),
                    raw.headers(mcp_session_id=sid, authorization=authorization),
                )
                assert call.status_code == 401, (authorization, call.status_code)
            call = await raw.post(
                _touch_call("allowed"),
                raw.headers(mcp_session_id=sid, authorization=f"bearer {TOKEN}"),
            )
            assert call.status_code == 200, call.text
        # The SDK's own client, given the header, works end to end.
        import httpx

        http = httpx.AsyncClient(headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30)
        from mcp.client.streamable_http import streamable_http_client

        async with http, Client(streamable_http_client(server.url, http_client=http)) as client:
            assert "hello" in await ok(client, "exec_command", cmd="echo hello")
        assert await server.stop() == 128 + signal.SIGTERM
    assert sorted(path.name for path in workspace.iterdir()) == ["allowed"]
    assert server.stderr, "DEBUG logging wrote nothing: the check below would prove nothing"
    assert not any(TOKEN in line for line in server.stderr)


async def test_http_allow_origin_and_allow_host(tmp_path: Path) -> None:
    """`--allow-origin` (repeatable) admits a browser origin of the user's choosing and
    `--allow-host` a name the server is reached by; other origins stay refused."""
    workspace = tmp_path / "ws"
    extra = [
        "--allow-origin",
        "http://localhost:3000",
        "--allow-origin",
        "https://App.Example/",
        "--allow-host",
        "sandbox.internal",
    ]
    async with http_server(workspace, "127.0.0.1", *extra) as server:
        raw = RawHttp(server.url, None)
        async with raw.client:
            for origin in ["http://localhost:3000", "https://app.example"]:
                init = await raw.post(INITIALIZE, raw.headers(origin=origin))
                assert init.status_code == 200, (origin, init.text)
            init = await raw.post(INITIALIZE, raw.headers(origin="http://localhost:3001"))
            assert init.status_code == 403
            init = await raw.post(INITIALIZE, raw.headers(host=f"sandbox.internal:{raw.port}"))
            assert init.status_code == 200, init.text
            init = await raw.post(INITIALIZE, raw.headers(host="sandbox.internal:1"))
            assert init.status_code == 403
        assert await server.stop() == 128 + signal.SIGTERM


async def _refused_start(*args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        *SERVER_ARGV,
        *args,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
    )
    try:
        async with asyncio.timeout(30):
            stdout, stderr = await proc.communicate()
    finally:
        if proc.returncode is None:  # it did not refuse: it serves, so end it
            proc.kill()
            await proc.wait()
    assert stdout == b""
    assert proc.returncode is not None
    return proc.returncode, stderr.decode()


async def test_http_non_loopback_needs_a_token(tmp_path: Path) -> None:
    """A non-loopback bind without a token refuses to start: one `sandbox: error:` line,
    exit 2, no session started. With the token it serves, and requires it."""
    workspace = tmp_path / "ws"
    env = {key: value for key, value in os.environ.items() if key != "SANDBOX_MCP_TOKEN"}
    code, stderr = await _refused_start("--workdir", str(workspace), "--http", "0.0.0.0:0", env=env)
    assert code == 2
    assert stderr.count("\n") == 1 and stderr.startswith("sandbox: error: refusing to serve")
    assert "SANDBOX_MCP_TOKEN" in stderr and "--token-file" in stderr
    assert not workspace.exists()
    env["SANDBOX_MCP_TOKEN"] = TOKEN
    async with http_server(workspace, "0.0.0.0", env=env) as server:
        port = int(server.url.rsplit(":", 1)[1].split("/")[0])
        raw = RawHttp(f"http://127.0.0.1:{port}/mcp", None)
        async with raw.client:
            assert (await raw.post(INITIALIZE, raw.headers())).status_code == 401
            raw.token = TOKEN
            assert (await raw.post(INITIALIZE, raw.headers())).status_code == 200
        assert await server.stop() == 128 + signal.SIGTERM


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (b"", "is empty"),
        (b"  \n", "is empty"),
        (b"two words\n", "printable ASCII without spaces"),
        ("t\u00f6ken".encode(), "printable ASCII"),
        (b"x" * 5000, "more than 4096 bytes"),
    ],
    ids=["empty", "blank", "spaces", "non-ascii", "too-long"],
)
async def test_bad_token_file_refuses_to_start(
    tmp_path: Path, content: bytes, expected: str
) -> None:
    token_file = tmp_path / "token"
    token_file.write_bytes(content)
    code, stderr = await _refused_start(
        "--http", "127.0.0.1:0", "--token-file", str(token_file), "--workdir", str(tmp_path / "w")
    )
    assert code == 2
    assert stderr.count("\n") == 1 and stderr.startswith("sandbox: error: --token-file")
    assert expected in stderr
    assert "words" not in stderr and "xxxx" not in stderr  # the token is never shown
    assert not (tmp_path / "w").exists()


async def test_token_options_need_http(tmp_path: Path) -> None:
    code, stderr = await _refused_start("--token-file", str(tmp_path / "none"))
    assert code == 2 and stderr.startswith("sandbox: error:") and "need --http" in stderr
    code, stderr = await _refused_start("--http", "127.0.0.1:0", "--token-file", str(tmp_path))
    assert code == 2 and stderr.startswith("sandbox: error: --token-file")


def test_access_policy_compares_hosts_and_origins_exactly() -> None:
    """The rules behind the 403s, without a server: IP literals in any spelling, names
    in any case, the port always (80 when absent); loopback names only for a loopback or
    wildcard bind; the token never in a repr."""
    from sandbox.backends.toolkit.credentials import Secret
    from sandbox.mcp.http_guard import AccessPolicy
    from sandbox.mcp.transports import HttpTransport

    v6 = AccessPolicy.for_bind("::1", 8765)
    assert v6.host_allowed("[0:0:0:0:0:0:0:1]:8765") and v6.host_allowed("LocalHost:8765")
    assert v6.host_allowed("127.0.0.1:8765") and v6.origin_allowed("http://[::1]:8765")
    for bad in ["[::1]", "::1:8765", "[::1]8765", "localhost.:8765", "localhost:08765x", ""]:
        assert not v6.host_allowed(bad), bad
    on_80 = AccessPolicy.for_bind("127.0.0.2", 80)
    assert on_80.host_allowed("127.0.0.2") and on_80.origin_allowed("http://127.0.0.2")
    assert not on_80.host_allowed("127.0.0.3")
    wildcard = AccessPolicy.for_bind("0.0.0.0", 9000, names=["box.internal"])
    assert wildcard.host_allowed("127.0.0.1:9000") and wildcard.host_allowed("box.internal:9000")
    remote = AccessPolicy.for_bind("192.0.2.7", 9000, allow_origins=["HTTPS://UI.example/"])
    assert remote.host_allowed("192.0.2.7:9000") and not remote.host_allowed("localhost:9000")
    assert remote.origin_allowed("https://ui.example") and not remote.origin_allowed("null")
    secret = AccessPolicy.for_bind("127.0.0.1", 1, token=Secret(TOKEN))
    assert secret.token_matches(f"Bearer {TOKEN}".encode())
    assert not secret.token_matches(None) and not secret.token_matches(TOKEN.encode())
    transport = HttpTransport("127.0.0.1", 0, token=Secret(TOKEN))
    assert TOKEN not in repr(secret) + str(secret) + repr(transport) + str(vars(transport))
