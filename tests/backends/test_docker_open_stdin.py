"""Open stdin on docker: a stdio MCP-style server inside the container, driven through
the session (`pty_exec_start(stdin=True)`, `pty_write_stdin`, `pty_close_stdin`).

The test image is busybox on scratch (no registry, no Python in it), so the server is a
few lines of busybox `sh`: line-delimited JSON-RPC 2.0 as MCP's stdio transport frames
it, answering `initialize` and `tools/list`, ignoring notifications, and exiting 0 at
the end of its input, the way a stdio MCP server ends when its client closes stdin.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

import pytest

import sandbox
from tests.backend_fixtures import docker as fx
from tests.conftest import skip_or_fail


@pytest.fixture(autouse=True)
def _engine() -> None:
    reason = fx.skip_reason()
    if reason:
        skip_or_fail(f"docker: {reason}")


# Reads one request per line; answers by the method found in it. The id is copied as
# the JSON text it was (a number or a string). `read` returns non-zero at the end of
# input: the loop ends and the server says so on stderr, then exits 0.
SERVER = r"""
while IFS= read -r line; do
  id=$(printf '%s' "$line" | sed -n 's/.*"id" *: *\("[^"]*"\|[0-9][0-9]*\).*/\1/p')
  case "$line" in
    *'"method":"initialize"'*)
      printf '{"jsonrpc":"2.0","id":%s,"result":{"protocolVersion":"2025-06-18","capabilities":{"tools":{}},"serverInfo":{"name":"busybox-mcp","version":"0.1"}}}\n' "$id" ;;
    *'"method":"tools/list"'*)
      printf '{"jsonrpc":"2.0","id":%s,"result":{"tools":[{"name":"echo","description":"Echo a text back","inputSchema":{"type":"object","properties":{"text":{"type":"string"}}}}]}}\n' "$id" ;;
    *'"method":"notifications/'*) ;;
    *)
      printf '{"jsonrpc":"2.0","id":%s,"error":{"code":-32601,"message":"Method not found"}}\n' "${id:-null}" ;;
  esac
done
echo "server: end of input" >&2
exit 0
"""  # noqa: E501


def _request(method: str, request_id: int | None = None, **params: Any) -> str:
    message: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
    if request_id is not None:
        message["id"] = request_id
    if params:
        message["params"] = params
    return json.dumps(message, separators=(",", ":")) + "\n"


async def _call(
    session: sandbox.BaseSandboxSession, pid: int, method: str, request_id: int, **params: Any
) -> dict[str, Any]:
    """Send one request and read the response line that answers it."""
    update = await session.pty_write_stdin(
        pid,
        _request(method, request_id, **params),
        until=re.compile(r"\n"),
        yield_time_s=20,
    )
    assert update.process_id == pid, update
    lines = update.output.splitlines()
    assert len(lines) == 1, update.output
    response: dict[str, Any] = json.loads(lines[0])
    assert response["jsonrpc"] == "2.0" and response["id"] == request_id, response
    return response


async def test_a_stdio_mcp_server_in_a_container(tmp_path: Path) -> None:
    async with fx.environment(tmp_path) as unstarted, unstarted as session:
        await session.write_file("server.sh", SERVER)
        started = await session.pty_exec_start("sh server.sh", stdin=True, yield_time_s=0.3)
        pid = started.process_id
        assert pid is not None and started.output == "", started

        init = await _call(
            session,
            pid,
            "initialize",
            1,
            protocolVersion="2025-06-18",
            capabilities={},
            clientInfo={"name": "sandbox-test", "version": "1"},
        )
        assert init["result"]["serverInfo"]["name"] == "busybox-mcp"
        assert init["result"]["capabilities"] == {"tools": {}}
        # A notification gets no answer: the next line is the answer to the next call.
        update = await session.pty_write_stdin(
            pid, _request("notifications/initialized"), yield_time_s=0.3
        )
        assert update.output == "" and update.unwritten_bytes == 0
        tools = await _call(session, pid, "tools/list", 2)
        assert [tool["name"] for tool in tools["result"]["tools"]] == ["echo"]
        unknown = await _call(session, pid, "resources/list", 3)
        assert unknown["error"]["code"] == -32601

        # The client ends the session the stdio way: it closes the server's stdin.
        await session.pty_close_stdin(pid)
        output = ""
        for _ in range(5):
            final = await session.pty_write_stdin(pid, "", yield_time_s=10)
            output += final.output
            if final.process_id is None:
                break
        assert final.process_id is None and final.exit_code == 0, final
        assert output == "server: end of input\n"


async def test_binary_input_passes_unchanged(tmp_path: Path) -> None:
    # Every byte value, the engine's detach keys (Ctrl-P Ctrl-Q) included: those apply to
    # a terminal's input only, so an attached stdin on pipes takes them as data.
    data = bytes(range(256)) * 4 + b"\x10\x11" + b"\x10\x11tail"
    async with fx.environment(tmp_path) as unstarted, unstarted as session:
        started = await session.pty_exec_start("md5sum", stdin=True, yield_time_s=0.3)
        pid = started.process_id
        assert pid is not None
        written = await session.pty_write_stdin(pid, data, yield_time_s=0.3)
        assert written.unwritten_bytes == 0 and written.output == ""
        await session.pty_close_stdin(pid)
        final = await session.pty_write_stdin(pid, "", yield_time_s=10)
        assert final.process_id is None and final.exit_code == 0, final
        assert final.output.split()[0] == hashlib.md5(data).hexdigest()
