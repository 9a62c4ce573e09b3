"""`sandbox run` without `--tty` streams: the output reaches the pipe or file as the command
prints it, stdout and stderr apart, nothing dropped whatever the volume; a reader that
leaves ends the run at once (141) and Ctrl-C keeps what was printed. The real CLI in a
subprocess, on unix_local."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
from pathlib import Path

from tests.helpers import describe_pids, eventually, host_pids_with_arg, unique_seconds

# The CLI with SIGINT as a terminal gives it (a runner may have changed it for us).
SANDBOX = [
    sys.executable,
    "-c",
    "import signal, sys\n"
    "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
    "from sandbox.cli.app import main\n"
    "sys.exit(main(sys.argv[1:]))\n",
]
WAIT_S = 60.0


def _gone(arg: str) -> bool:
    import asyncio

    return asyncio.run(eventually(lambda: not host_pids_with_arg(arg)))


def _read_until(fd: int, wanted: bytes) -> bytes:
    """Read the pipe `fd` until what was read holds `wanted` (fails after `WAIT_S`)."""
    got = b""
    while wanted not in got:
        ready, _, _ = select.select([fd], [], [], WAIT_S)
        assert ready, f"nothing more came within {WAIT_S}s; got {got!r}"
        piece = os.read(fd, 65536)
        assert piece, f"the pipe ended before {wanted!r}; got {got!r}"
        got += piece
    return got


def _start(tmp_path: Path, script: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [*SANDBOX, "run", "--workdir", str(tmp_path / "ws"), "--", script],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        process_group=0,
    )


def test_every_line_of_a_big_output_reaches_the_file(tmp_path: Path) -> None:
    # About 21 MB: more than the 16 MiB an `exec` keeps, so nothing may be cut.
    out_file = tmp_path / "out"
    script = "seq 1 3000000; echo err-line >&2; exit 3"
    with out_file.open("wb") as out:
        done = subprocess.run(
            [*SANDBOX, "run", "--workdir", str(tmp_path / "ws"), "--", script],
            stdout=out,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            timeout=120,
        )
    expected = subprocess.run(["seq", "1", "3000000"], capture_output=True, check=True).stdout
    assert done.returncode == 3
    assert done.stderr == b"err-line\n"
    assert out_file.read_bytes() == expected


def test_output_shows_while_the_command_runs(tmp_path: Path) -> None:
    marker = unique_seconds()
    proc = _start(tmp_path, f"echo a; echo b >&2; exec sleep {marker}")
    try:
        assert proc.stdout is not None and proc.stderr is not None
        assert _read_until(proc.stdout.fileno(), b"a\n") == b"a\n"
        assert _read_until(proc.stderr.fileno(), b"b\n") == b"b\n"
        assert proc.poll() is None  # shown while the command still runs
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=WAIT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert _gone(marker), describe_pids(host_pids_with_arg(marker))


def test_ctrl_c_keeps_what_was_printed(tmp_path: Path) -> None:
    marker = unique_seconds()
    proc = _start(tmp_path, f"echo line1; echo line2; exec sleep {marker}")
    try:
        assert proc.stdout is not None and proc.stderr is not None
        printed = _read_until(proc.stdout.fileno(), b"line2\n")
        proc.send_signal(signal.SIGINT)
        rest, err = proc.communicate(timeout=WAIT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert printed + rest == b"line1\nline2\n"
    assert proc.returncode == 130, err
    assert _gone(marker), describe_pids(host_pids_with_arg(marker))


def test_an_endless_command_piped_to_head_ends_at_once(tmp_path: Path) -> None:
    marker = unique_seconds()
    script = '{ "$@" 2>"$ERR"; echo $? >"$RC"; } | head -1'
    env = {**os.environ, "ERR": str(tmp_path / "err"), "RC": str(tmp_path / "rc")}
    ws = ["--workdir", str(tmp_path / "ws")]
    out = subprocess.run(
        ["sh", "-c", script, "sh", *SANDBOX, "run", *ws, "--", f"yes {marker}"],
        capture_output=True,
        timeout=WAIT_S,
        env=env,
        stdin=subprocess.DEVNULL,
    )
    assert out.stdout == f"{marker}\n".encode()
    assert (tmp_path / "err").read_text() == ""
    assert (tmp_path / "rc").read_text() == "141\n"
    assert _gone(marker), describe_pids(host_pids_with_arg(marker))
