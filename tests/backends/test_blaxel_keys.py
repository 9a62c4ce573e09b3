"""blaxel terminals: what the caller passes is never typed as keys, however long (the
typed line grows fourfold through `keystroke_safe`), and the stand-in's terminal is an
interactive shell on a PTY whose line editor acts on keys, like the real one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("blaxel", reason="the blaxel extra is not installed")
pytest.importorskip("aiohttp", reason="the blaxel extra is not installed")

import aiohttp

from sandbox.backends.blaxel import BlaxelSession, terminal
from sandbox.testing.blaxel_server import BlaxelServer
from tests.backends.test_blaxel import server, session

__all__ = ["server", "session"]

# Every C0 control but NUL (and DEL), then a command a line editor would run.
CONTROLS = "".join(chr(c) for c in range(1, 32)) + "\x7f"
SHORT = "\x15touch pwned-u #\x03touch pwned-c #\rtouch pwned-r #"


@pytest.mark.parametrize("tty", [True, False], ids=["tty", "pipes"])
@pytest.mark.parametrize("value", [SHORT, CONTROLS * 94 + SHORT], ids=["short", "3000"])
async def test_env_values_full_of_controls_are_data(
    session: BlaxelSession, tmp_path: Path, tty: bool, value: str
) -> None:
    update = await session.pty_exec_start(
        'printf %s "$V" > out', env={"V": value}, tty=tty, yield_time_s=20
    )
    assert update.exit_code == 0, update
    assert (tmp_path / "ws" / "out").read_bytes() == value.encode()
    assert sorted(p.name for p in (tmp_path / "ws").iterdir()) == ["out"]


async def test_a_short_line_with_controls_is_typed_not_sourced(session: BlaxelSession) -> None:
    """The short case above really goes through the line editor (not the file a long
    line is written to)."""
    from sandbox.backends.toolkit import new_tag
    from sandbox.backends.toolkit.trap import ShellTrap
    from sandbox.process_entry import CommandSpec

    spec = CommandSpec(("x",), 'printf %s "$V" > out', "x", True, env={"V": SHORT})
    line = terminal.typed_line(ShellTrap(report_exit=True), new_tag(), spec, True, "/w", None)
    assert len(line.encode()) <= terminal.MAX_TYPED_LINE
    assert line.isascii() and line[:-1].isprintable()


async def test_the_stand_in_terminal_edits_lines_like_an_interactive_shell(
    tmp_path: Path,
) -> None:
    """Keys typed into the stand-in's terminal reach a shell's line editor on a real
    PTY: Ctrl-U erases what came before it on the line, as on the real terminal (an
    interactive `$SHELL` on a PTY, handler/terminal/terminal.go)."""
    async with BlaxelServer(root=str(tmp_path), quirks=False) as srv:
        async with aiohttp.ClientSession() as http:
            headers = {
                "X-Blaxel-Authorization": f"Bearer {srv.api_key}",
                "X-Blaxel-Workspace": srv.workspace,
            }
            made = await http.post(
                srv.api_url + "/sandboxes", json={"metadata": {"name": "b"}}, headers=headers
            )
            assert made.status == 200
            url = srv.sandbox_url("b") + f"/terminal/ws?token={srv.api_key}"
            async with http.ws_connect(url) as ws:
                typed = "touch erased\x15touch kept; echo do''ne\n"
                await ws.send_str(json.dumps({"type": "input", "data": typed}))
                seen = ""
                while "done" not in seen:
                    msg = await ws.receive(timeout=20)
                    seen += json.loads(msg.data)["data"]
        await srv.close()
    assert (tmp_path / "kept").exists()
    assert not (tmp_path / "erased").exists()
    assert not (tmp_path / "erasedtouch").exists()
