"""`sandbox cp`, driven as a person would (real subprocesses): folders as archives both
ways, files streamed, a folder DST receiving a file under its name, bad usage, and the
progress line on a terminal; a file and a folder into a real docker container and back."""

from __future__ import annotations

import asyncio
import io
import os
import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandbox.cli.copy import PROGRESS_FROM, Progress
from tests.backend_fixtures import docker as docker_fixture
from tests.conftest import skip_or_fail
from tests.test_cli import run_cli


def _tree(root: Path) -> dict[str, object]:
    found: dict[str, object] = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(folder) / name
            rel = str(path.relative_to(root))
            if path.is_symlink():
                found[rel] = ("link", os.readlink(path))
            elif path.is_dir():
                found[rel] = ("dir",)
            else:
                found[rel] = ("file", path.read_bytes(), path.stat().st_mode & 0o777)
    return found


def _source(root: Path) -> Path:
    (root / "deep" / "er").mkdir(parents=True)
    (root / "empty").mkdir()
    (root / "deep" / "data.bin").write_bytes(bytes(range(256)) * 100)
    (root / "run.sh").write_bytes(b"#!/bin/sh\n")
    (root / "run.sh").chmod(0o750)
    (root / "alias").symlink_to("deep/data.bin")
    return root


def test_a_folder_travels_in_and_back_out(tmp_path: Path) -> None:
    source = _source(tmp_path / "src")
    workspace = tmp_path / "ws"
    into = run_cli("cp", "--workdir", str(workspace), str(source), ":landed")
    assert into.returncode == 0, into.stderr
    assert _tree(workspace / "landed") == _tree(source)
    back = run_cli("cp", "--workdir", str(workspace), ":landed", str(tmp_path / "back"))
    assert back.returncode == 0, back.stderr
    assert _tree(tmp_path / "back") == _tree(source)


def test_files_and_folder_targets(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    (workspace / "box").mkdir(parents=True)
    (tmp_path / "note.txt").write_bytes(b"a note")
    assert (
        run_cli("cp", "--workdir", str(workspace), str(tmp_path / "note.txt"), ":box").returncode
        == 0
    )
    assert (workspace / "box" / "note.txt").read_bytes() == b"a note"
    out = tmp_path / "out"
    out.mkdir()
    assert run_cli("cp", "--workdir", str(workspace), ":box/note.txt", str(out)).returncode == 0
    assert (out / "note.txt").read_bytes() == b"a note"
    renamed = run_cli("cp", "--workdir", str(workspace), ":box/note.txt", str(out / "r.txt"))
    assert renamed.returncode == 0 and (out / "r.txt").read_bytes() == b"a note"


def test_bad_usage_and_missing_sources(tmp_path: Path) -> None:
    both = run_cli("cp", str(tmp_path / "a"), str(tmp_path / "b"))
    assert both.returncode == 2 and "exactly one side" in both.stderr
    missing = run_cli("cp", "--workdir", str(tmp_path / "ws"), str(tmp_path / "nope"), ":x")
    assert missing.returncode == 1 and "no such file on the host" in missing.stderr
    inside = run_cli("cp", "--workdir", str(tmp_path / "ws"), ":nope", str(tmp_path / "x"))
    assert inside.returncode == 1 and "nope" in inside.stderr
    assert "Traceback" not in both.stderr + missing.stderr + inside.stderr


def test_a_link_out_of_the_workspace_is_refused_on_the_host(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    (workspace / "bad").mkdir(parents=True)
    (workspace / "bad" / "out").symlink_to("/etc")
    result = run_cli("cp", "--workdir", str(workspace), ":bad", str(tmp_path / "dest"))
    assert result.returncode == 2 and "'out' refused" in result.stderr
    assert not (tmp_path / "dest" / "out").exists()


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_line_only_for_large_copies_on_a_terminal() -> None:
    async def pump(stream: io.StringIO, size: int) -> Progress:
        progress = Progress(stream, "a -> b")

        async def chunks():  # type: ignore[no-untyped-def]
            for _ in range(size // 2**20):
                yield b"x" * 2**20

        async for _ in progress.count(chunks()):
            pass
        progress.done()
        return progress

    terminal = _Terminal()
    asyncio.run(pump(terminal, PROGRESS_FROM * 2))
    assert "\ra -> b: " in terminal.getvalue() and terminal.getvalue().endswith("done\n")
    small = _Terminal()
    asyncio.run(pump(small, PROGRESS_FROM // 2))
    assert small.getvalue() == ""
    plain = io.StringIO()
    assert asyncio.run(pump(plain, PROGRESS_FROM * 2)).total == PROGRESS_FROM * 2
    assert plain.getvalue() == ""


# ---- docker: into a real container and back ------------------------------------------


@pytest.fixture
def container_workdir() -> Iterator[list[str]]:
    """The backend options of `sandbox cp` for the shared test container (built locally
    by the docker fixture), in a fresh folder removed afterwards; skips without docker."""
    if reason := docker_fixture.skip_reason():
        skip_or_fail(f"docker: {reason}")
    container = docker_fixture.shared_container()
    workdir = f"/tmp/cp-{secrets.token_hex(6)}"
    try:
        yield ["--backend", "docker", "--container", container, "--opt", f"workdir={workdir}"]
    finally:
        api = docker_fixture._client()
        api.exec_start(api.exec_create(container, ["rm", "-rf", workdir])["Id"])


def _in_container(options: list[str], command: str) -> str:
    result = run_cli("run", *options, "--", command)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_docker_a_file_travels_in_and_back_byte_exact(
    tmp_path: Path, container_workdir: list[str]
) -> None:
    data = bytes(range(256)) * 4096 + b"\0tail\r\n"  # 1 MiB of every byte value
    (tmp_path / "blob.bin").write_bytes(data)
    into = run_cli("cp", *container_workdir, str(tmp_path / "blob.bin"), ":blob.bin")
    assert into.returncode == 0, into.stderr
    assert _in_container(container_workdir, "wc -c < blob.bin").strip() == str(len(data))
    back = run_cli("cp", *container_workdir, ":blob.bin", str(tmp_path / "back.bin"))
    assert back.returncode == 0, back.stderr
    assert (tmp_path / "back.bin").read_bytes() == data


def test_docker_a_folder_travels_in_and_back_byte_exact(
    tmp_path: Path, container_workdir: list[str]
) -> None:
    source = _source(tmp_path / "src")
    into = run_cli("cp", *container_workdir, str(source), ":landed")
    assert into.returncode == 0, into.stderr
    # In the container itself: the symlink is a symlink, the empty folder is there.
    listing = _in_container(
        container_workdir,
        "readlink landed/alias; test -d landed/empty && echo empty-dir; stat -c %a landed/run.sh",
    )
    assert listing.split() == ["deep/data.bin", "empty-dir", "750"]
    back = run_cli("cp", *container_workdir, ":landed", str(tmp_path / "back"))
    assert back.returncode == 0, back.stderr
    assert _tree(tmp_path / "back") == _tree(source)
