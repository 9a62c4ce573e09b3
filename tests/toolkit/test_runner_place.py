"""`sandbox.backends.toolkit.runner_place`: what a sandbox reports about the runner is
checked before it is used, and a link whose runner does not answer ends cleanly."""

from __future__ import annotations

import asyncio
import hashlib
import os
import platform
import shutil
import subprocess
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from sandbox.backends.toolkit import (
    MAX_RUNNER_BYTES,
    RUNNER_PREPARE_SCRIPT,
    SandboxPlace,
    StderrTail,
    checked_digest,
    checked_folder,
    hello_through,
    parse_prepare,
    place_runner,
    read_packaged,
    runner_name,
    sandbox_environment,
    write_then_install,
)
from sandbox.errors import ProviderError, UnsupportedOperationError
from sandbox.runner import LinkWriter, RunnerBinary, runner_binary


class SinkExec(LinkWriter):
    """A provider's exec that takes what is sent and never answers."""

    def __init__(self) -> None:
        super().__init__()
        self.sent = bytearray()
        self.ended = False

    async def _send(self, data: bytes) -> None:
        self.sent += data

    def _ended(self) -> bool:
        return self.ended

    async def _end(self) -> None:
        self.ended = True


def test_a_digest_is_64_lowercase_hex_or_none() -> None:
    good = "ab" * 32
    assert checked_digest(good.encode()) == good
    for bad in (b"-", b"AB" * 32, good.encode() + b"0", b"zz" * 32, b"\xff" * 64):
        assert checked_digest(bad) is None


def test_a_folder_is_absolute_one_line_and_bounded() -> None:
    assert checked_folder(b"/tmp/x", "runner folder", "the pod") == "/tmp/x"
    for bad in (b"tmp", b"/a\nb", b"/" + b"a" * 5000, b""):
        with pytest.raises(ProviderError, match="the pod gave no usable runner folder"):
            checked_folder(bad, "runner folder", "the pod")


def test_the_environment_is_bounded_and_drops_the_shells_own() -> None:
    # (The kill script's tag too: a process through the runner must not carry it.)
    items = [b"A=1", b"PWD=/x", b"_=/bin/sh", b"noequals", b"=v", b"B=x=y"]
    items.append(b"SANDBOX_PROCESS_TAG=t-1")
    assert sandbox_environment(items) == {"A": "1", "B": "x=y"}
    many = [f"V{i}=1".encode() for i in range(10_000)]
    assert len(sandbox_environment(many)) == 4096


def test_the_runner_is_named_by_its_content() -> None:
    binary = RunnerBinary(path=Path("/x"), sha256="c" * 64, size=1)
    assert runner_name(binary) == ".sandbox-runner-" + "c" * 16


async def test_a_runner_that_answers_garbage_is_a_provider_error_and_the_link_ends() -> None:
    reader = asyncio.StreamReader()
    reader.feed_data(b"\xff" * 64)  # not a frame
    reader.feed_eof()
    writer = SinkExec()
    with pytest.raises(ProviderError, match=r"the runner in the pod did not answer.*: no exec"):
        await hello_through(
            reader, writer, stderr=lambda: "no exec\n", close=writer.wait_closed, where="the pod"
        )
    assert writer.sent  # our HELLO went out first


async def test_a_cancelled_hello_closes_the_link() -> None:
    reader = asyncio.StreamReader()  # never answers
    writer = SinkExec()
    closed = asyncio.Event()

    async def close() -> None:
        closed.set()

    hello = asyncio.ensure_future(
        hello_through(reader, writer, stderr=lambda: "", close=close, where="the sandbox")
    )
    while not writer.sent:  # HELLO written: the hello waits for the answer now
        await asyncio.sleep(0)
    hello.cancel()
    with pytest.raises(asyncio.CancelledError):
        await hello
    assert closed.is_set()


def test_a_bridges_stderr_is_kept_up_to_its_bound() -> None:
    tail = StderrTail(limit=5)
    for chunk in ("abc", "defg", "hij"):
        tail.keep(chunk)
    assert tail.text == "abcde"


async def test_the_runner_is_uploaded_only_where_the_sandbox_lacks_its_bytes() -> None:
    binary = runner_binary()
    if binary is None:
        pytest.skip("this install has no runner build")
    uploads: list[str] = []

    def answer(digest: str) -> Callable[[list[str]], Awaitable[SandboxPlace]]:
        async def prepare(names: list[str]) -> SandboxPlace:
            assert names == [runner_name(binary)]
            return SandboxPlace("/tmp", platform.machine(), {names[0]: digest}, {"A": "1"})

        return prepare

    async def upload(built: RunnerBinary, path: str) -> None:
        uploads.append(path)

    placed = await place_runner(answer("0" * 64), upload, required=True)
    assert placed is not None and uploads == [placed.path]
    assert placed.path == f"/tmp/{runner_name(binary)}" and placed.sock == placed.path + ".sock"
    assert placed.env == {"A": "1"}
    again = await place_runner(answer(binary.sha256), upload, required=True)
    assert again == placed and uploads == [placed.path]  # the same bytes: no second upload


async def test_no_build_for_the_sandboxs_machine_is_none_or_refused() -> None:
    async def prepare(names: list[str]) -> SandboxPlace:
        return SandboxPlace("/tmp", "riscv64", {n: None for n in names}, {})

    async def upload(built: RunnerBinary, path: str) -> None:
        raise AssertionError("nothing to upload")

    if runner_binary() is None:
        pytest.skip("this install has no runner build")
    assert await place_runner(prepare, upload, required=False) is None
    with pytest.raises(UnsupportedOperationError, match="riscv64"):
        await place_runner(prepare, upload, required=True)


def test_the_packaged_bytes_are_checked_before_they_go_anywhere(tmp_path: Path) -> None:
    data = b"\x7fELF runner"
    built = tmp_path / "sandbox-runner"
    built.write_bytes(data)
    binary = RunnerBinary(built, hashlib.sha256(data).hexdigest(), len(data))
    assert read_packaged(binary) == data
    built.write_bytes(b"\x7fELF another build")  # replaced under a running install
    with pytest.raises(ProviderError, match="changed while in use") as info:
        read_packaged(binary)
    assert info.value.retryable
    huge = RunnerBinary(built, binary.sha256, MAX_RUNNER_BYTES + 1)
    with pytest.raises(ProviderError, match="larger than any runner"):
        read_packaged(huge)


async def test_write_then_install_writes_beside_the_path_then_runs_the_install_script(
    tmp_path: Path,
) -> None:
    """The real install script, run here: the bytes land at the path, executable, and
    the temporary name is gone; bytes that are not the runner's are refused."""
    data = b"#!/bin/sh\necho installed\n"
    built = tmp_path / "sandbox-runner"
    built.write_bytes(data)
    binary = RunnerBinary(built, hashlib.sha256(data).hexdigest(), len(data))
    folder = tmp_path / "sandbox"
    folder.mkdir()
    written: list[str] = []

    async def write(temporary: str, payload: bytes) -> None:
        written.append(temporary)
        Path(temporary).write_bytes(payload)

    async def run(argv: list[str]) -> tuple[int, str, str]:
        done = await asyncio.create_subprocess_exec(
            *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
        )
        out, err = await done.communicate()
        return int(done.returncode or 0), out.decode(), err.decode()

    path = str(folder / runner_name(binary))
    await write_then_install(binary, path, write, run)
    assert Path(path).read_bytes() == data and os.access(path, os.X_OK)
    [temporary] = written
    assert temporary.startswith(path + ".") and not Path(temporary).exists()

    async def corrupt(temporary: str, payload: bytes) -> None:
        Path(temporary).write_bytes(payload[:-1] + b"?")

    with pytest.raises(ProviderError):
        await write_then_install(binary, path + "-2", corrupt, run)
    assert not Path(path + "-2").exists() and len(list(folder.iterdir())) == 1


@pytest.mark.parametrize("shell", ["sh", "busybox"])
def test_the_prepare_script_hashes_only_a_file_no_one_else_may_rewrite(
    tmp_path: Path, shell: str
) -> None:
    """The real prepare script, under the host's sh and busybox's: the user's own file
    (0755) and root's are hashed; one its group or others may write, another uid's, a
    symlink and a FIFO are reported as nothing there ("-"), so the runner is put in
    again rather than trusted."""
    argv0 = ["busybox", "sh"] if shell == "busybox" else ["sh"]
    if shutil.which(argv0[0]) is None:
        pytest.skip(f"{argv0[0]} is not installed")
    data = b"runner bytes"
    digest = hashlib.sha256(data).hexdigest()
    names = ["own", "group-writable", "world-writable", "others", "link", "fifo", "missing"]
    for name in names[:4]:
        (tmp_path / name).write_bytes(data)
        (tmp_path / name).chmod(0o755)
    (tmp_path / "group-writable").chmod(0o775)
    (tmp_path / "world-writable").chmod(0o757)
    root = os.geteuid() == 0
    if root:
        os.chown(tmp_path / "others", 54321, 54321)
    (tmp_path / "link").symlink_to(tmp_path / "own")
    os.mkfifo(tmp_path / "fifo")
    script = [*argv0, "-c", RUNNER_PREPARE_SCRIPT, "sandbox-runner-prepare", *names]
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "SANDBOX_RUNNER_DIR": str(tmp_path)}
    done = subprocess.run(script, capture_output=True, env=env, timeout=30, check=True)
    place = parse_prepare(done.stdout, names)
    assert place.folder == str(tmp_path)
    assert place.digests["own"] == digest
    expected_none = ["group-writable", "world-writable", "link", "fifo", "missing"]
    if root:
        expected_none.append("others")
    assert all(place.digests.get(name) is None for name in expected_none), place.digests
