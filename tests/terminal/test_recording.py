"""`sandbox.terminal.recording`: asciicast v2 files, read back with asciinema's own parser."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from asciinema.asciicast import open_from_url

from sandbox.terminal.recording import AsciicastRecorder
from sandbox.terminal.screen import TerminalScreen
from tests.pty_harness import CURSES_PROGRAM, PtyProgram


def read_cast(path: Path) -> tuple[dict[str, Any], list[list[Any]]]:
    """Header and events, as `asciinema play` reads them."""
    with open_from_url(str(path)) as cast:
        assert cast.version == 2
        return cast.v2_header, list(cast.events())


def assert_times_monotonic(events: list[list[Any]]) -> None:
    times = [event[0] for event in events]
    assert all(isinstance(t, float) for t in times)
    assert times == sorted(times)
    assert not times or times[0] >= 0


def test_header_and_events_read_back_by_asciinema(tmp_path: Path) -> None:
    path = tmp_path / "session.cast"
    text = "prompt$ echo 漢字 🙂\r\n漢字 🙂\r\n\x1b[31mred\x1b[0m\r\n"
    data = text.encode()
    before = time.time()
    with AsciicastRecorder.open(
        path,
        rows=24,
        cols=80,
        term="xterm-256color",
        command="bash -i",
        title="a demo",
        shell="/bin/bash",
    ) as recorder:
        # Cuts inside multi-byte characters: each is written whole, in one event.
        for start in range(0, len(data), 5):
            recorder.output(data[start : start + 5])
        recorder.input(b"echo hi\r")  # not recorded: record_input is False
        recorder.resize(30, 100)
        recorder.output(b"after resize")
    assert recorder.closed
    assert oct(path.stat().st_mode & 0o777) == oct(0o600)
    header, events = read_cast(path)
    assert header["version"] == 2
    assert (header["width"], header["height"]) == (80, 24)
    assert before - 1 <= header["timestamp"] <= time.time()
    assert header["env"] == {"TERM": "xterm-256color", "SHELL": "/bin/bash"}
    assert header["command"] == "bash -i"
    assert header["title"] == "a demo"
    assert_times_monotonic(events)
    codes = [event[1] for event in events]
    assert "i" not in codes
    resize = codes.index("r")
    assert events[resize][2] == "100x30"
    assert "".join(event[2] for event in events[:resize]) == text
    assert all("\ufffd" not in event[2] for event in events)
    assert events[resize + 1 :] == [[events[-1][0], "o", "after resize"]]
    # Every line is one complete JSON value (what a killed writer leaves too).
    lines = path.read_bytes().split(b"\n")
    assert lines[-1] == b""
    assert [json.loads(line) for line in lines[1:-1]] == events


def test_input_is_recorded_only_when_asked(tmp_path: Path) -> None:
    path = tmp_path / "input.cast"
    with AsciicastRecorder.open(path, rows=24, cols=80, record_input=True) as recorder:
        recorder.input("ls 漢".encode()[:4])
        recorder.output(b"ls")
        recorder.input("ls 漢".encode()[4:] + b"\r")
    header, events = read_cast(path)
    assert header["env"] == {}
    assert "command" not in header and "title" not in header
    assert [event[1:] for event in events] == [["i", "ls "], ["o", "ls"], ["i", "漢\r"]]


def test_invalid_utf8_and_a_character_cut_by_close(tmp_path: Path) -> None:
    path = tmp_path / "bad.cast"
    recorder = AsciicastRecorder.open(path, rows=5, cols=20)
    recorder.output(b"ok \xff\xfe then")
    recorder.output(b" cut \xe6\xbc")  # the close comes before the character's end
    recorder.close()
    recorder.close()  # idempotent
    recorder.output(b"ignored after close")
    _, events = read_cast(path)
    assert [event[1:] for event in events] == [
        ["o", "ok \ufffd\ufffd then"],
        ["o", " cut "],
        ["o", "\ufffd"],
    ]


KILLED_WRITER = """
import os, sys
from sandbox.terminal.recording import AsciicastRecorder

recorder = AsciicastRecorder.open(sys.argv[1], rows=24, cols=80, command="flood")
while True:
    data = os.read(0, 65536)
    if not data:
        break
    recorder.output(data)
    os.write(1, b"+")
"""


def test_a_recording_cut_by_sigkill_is_valid_to_its_last_line(tmp_path: Path) -> None:
    path = tmp_path / "killed.cast"
    stream = b"".join(
        b"%05d \xe6\xbc\xa2\xe5\xad\x97 \x1b[1mbold\x1b[0m\r\n" % i for i in range(20_000)
    )
    chunks = [stream[i : i + 997] for i in range(0, len(stream), 997)]  # cuts characters
    writer = subprocess.Popen(
        [sys.executable, "-c", KILLED_WRITER, str(path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    assert writer.stdin is not None and writer.stdout is not None
    try:
        acked = 0
        for chunk in chunks[:50]:  # one at a time: each is one read, one event
            writer.stdin.write(chunk)
            writer.stdin.flush()
            assert writer.stdout.read(1) == b"+"
            acked += len(chunk)
        # Then as fast as the pipe takes them: the kill lands mid-stream.
        for chunk in chunks[50:300]:
            writer.stdin.write(chunk)
        writer.stdin.flush()
        writer.send_signal(signal.SIGKILL)
        assert writer.wait(timeout=30) == -signal.SIGKILL
    finally:
        writer.kill()
        writer.wait()
        writer.stdin.close()
        writer.stdout.close()
    header, events = read_cast(path)
    assert header["command"] == "flood"
    assert_times_monotonic(events)
    recorded = "".join(event[2] for event in events)
    sent = stream[: 300 * 997].decode(errors="replace")
    assert len(recorded.encode()) >= acked
    # Whole characters only; the last event may end before a character that was cut.
    assert sent.startswith(recorded)
    assert path.read_bytes().endswith(b"\n")


async def test_a_cancelled_recording_task_leaves_a_valid_file(tmp_path: Path) -> None:
    path = tmp_path / "cancelled.cast"
    program = "import itertools\nfor i in itertools.count(): print('line', i, '漢字', flush=True)"
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-c", program, stdout=asyncio.subprocess.PIPE
    )
    assert child.stdout is not None
    recorder = AsciicastRecorder.open(path, rows=24, cols=80)
    enough = asyncio.Event()

    async def record() -> None:
        assert child.stdout is not None
        received = 0
        while data := await child.stdout.read(4096):
            recorder.output(data)
            received += len(data)
            if received > 100_000:
                enough.set()

    task = asyncio.create_task(record())
    try:
        await enough.wait()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    finally:
        child.kill()
        await child.wait()
    # Read before close(): the owner was cancelled, nothing more will be written.
    _, events = read_cast(path)
    recorder.close()
    lines = "".join(event[2] for event in events).split("\n")
    assert len(lines) > 1000
    assert lines[:-1] == [f"line {i} 漢字" for i in range(len(lines) - 1)]


FULL_DISK_WRITER = """
import resource, signal, sys
from sandbox.terminal.recording import AsciicastRecorder

signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # writes past the limit fail with EFBIG
resource.setrlimit(resource.RLIMIT_FSIZE, (3000, 3000))
recorder = AsciicastRecorder.open(sys.argv[1], rows=24, cols=80)
for i in range(1000):
    recorder.output(b"event %d " % i * 20)
    if recorder.closed:
        break
recorder.output(b"ignored")
recorder.close()
print(recorder.error.errno, i)
"""


def test_a_failed_write_cuts_the_file_back_to_its_last_line(tmp_path: Path) -> None:
    path = tmp_path / "full.cast"
    result = subprocess.run(
        [sys.executable, "-c", FULL_DISK_WRITER, str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    code, last = map(int, result.stdout.split())
    assert code == errno.EFBIG
    assert "recording" in result.stderr and "stopped" in result.stderr  # the warning
    assert os.path.getsize(path) <= 3000
    _, events = read_cast(path)
    assert path.read_bytes().endswith(b"\n")
    assert [event[2] for event in events] == [f"event {i} " * 20 for i in range(last)]


def test_a_real_terminal_session_replays_to_the_same_screen(tmp_path: Path) -> None:
    (tmp_path / "demo.py").write_text(CURSES_PROGRAM)
    path = tmp_path / "curses.cast"
    recorder = AsciicastRecorder.open(
        path, rows=24, cols=80, term="xterm-256color", command="demo.py", record_input=True
    )
    program = PtyProgram(
        [sys.executable, "demo.py"], cwd=str(tmp_path), seed=6, on_output=recorder.output
    )
    try:
        program.wait_for(lambda s: "press a key>" in s.text())
        live_running = program.screen.snapshot()
        program.write("x")
        recorder.input(b"x")
        assert program.wait_exit() == 0
    finally:
        program.close()
        recorder.close()
    _, events = read_cast(path)
    assert_times_monotonic(events)
    assert [event[2] for event in events if event[1] == "i"] == ["x"]
    screen = TerminalScreen(24, 80)
    snapshots = []
    for _, code, text in events:
        if code == "o":
            screen.feed(text.encode())
            while not screen.process():
                pass
            snapshots.append(screen.snapshot())
    assert live_running in snapshots  # the curses screen, title and all
    assert snapshots[-1] == program.screen.snapshot()


def test_bad_sizes_are_rejected(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        AsciicastRecorder.open(tmp_path / "x.cast", rows=0, cols=80)
    assert not (tmp_path / "x.cast").exists()
