"""Files the host creates on the sandbox's behalf (`sandbox.files.host`): recordings.

A process in the sandbox (unix_local, plain and confined when bubblewrap works) plants
symlinks to a victim file outside the workspace, FIFOs, old files and swapped folders
at every name a recording could take; then a tty process starts. The victim is never
touched, nothing blocks the event loop (a watchdog thread opens the planted FIFOs for
reading if a start stays stuck, and the test then fails), nothing is created outside,
and the start fails with a `HostPathError` before any process runs.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest

import sandbox
from sandbox import BaseSandboxSession, HostPathError
from sandbox.backends.unix_local import confine
from sandbox.files.host import HostDirectory, create_new_file
from sandbox.session import ID_RANGE
from sandbox.terminal.recording import AsciicastRecorder
from sandbox.testing import procfs
from tests.conftest import skip_or_fail
from tests.terminal.test_recording import read_cast

VICTIM_TEXT = b"the host's own file\n"
# Only a safety net: a start stuck on a FIFO's open is freed after this, then fails.
STUCK_AFTER_S = 30.0

PLANT = r"""
import os, sys
folder, kind, target, low, high, step = sys.argv[1:7]
for pid in range(int(low), int(high), int(step)):
    name = os.path.join(folder, f"{pid}.cast")
    try:
        os.unlink(name)
    except FileNotFoundError:
        pass
    if kind == "mixed":  # a symlink at even ids, a FIFO at odd ones
        if pid % 2:
            os.mkfifo(name)
        else:
            os.symlink(target, name)
    else:  # an empty regular file, in one system call
        os.mknod(name)
"""


@pytest.fixture(params=["plain", "confined"])
def confined(request: pytest.FixtureRequest) -> bool:
    """Each test runs in a plain unix_local session and in a bubblewrap jail."""
    if request.param == "confined":
        ok, reason = confine.availability()
        if not ok:
            skip_or_fail(f"confinement unavailable: {reason}")
        return True
    return False


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    """A host file outside the workspace that the sandbox wants overwritten."""
    path = tmp_path / "outside" / "victim.txt"
    path.parent.mkdir()
    path.write_bytes(VICTIM_TEXT)
    return path


@pytest.fixture
def ws() -> Iterator[Path]:
    """The workspace, with a `casts` folder: on tmpfs where there is one (planting a
    name for each of the 99,000 ids is several times faster there)."""
    shm = "/dev/shm"
    base = shm if os.path.isdir(shm) and os.access(shm, os.W_OK) else None
    path = Path(tempfile.mkdtemp(prefix="sandbox-host-files-", dir=base))
    (path / "casts").mkdir()
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@contextlib.asynccontextmanager
async def open_local(
    ws: Path, confined: bool, **options: object
) -> AsyncIterator[BaseSandboxSession]:
    async with sandbox.open_session(
        "unix_local", workdir=ws, confine=confined, terminate_grace_s=0.5, **options
    ) as session:
        yield session


async def plant(
    session: BaseSandboxSession, folder: Path, kind: str, target: str = "", step: int = 1
) -> None:
    """The sandbox itself plants `kind` at `<id>.cast` for every `step`-th process id."""
    low, high = ID_RANGE
    argv = ["python3", "-c", PLANT, str(folder), kind, target, str(low), str(high), str(step)]
    result = await session.exec(*argv, shell=False, timeout=120)
    assert result.exit_code == 0, result.stderr


async def sandbox_sh(session: BaseSandboxSession, script: str) -> None:
    result = await session.exec(script, timeout=60)
    assert result.exit_code == 0, result.stderr


def open_fds() -> set[str]:
    return set(procfs.open_fds())


@contextlib.contextmanager
def fifo_watchdog(fifos: Callable[[], list[Path]]) -> Iterator[threading.Event]:
    """Set the event, and free a writer stuck in the open of any of `fifos` (by opening
    each for reading), if the block runs past `STUCK_AFTER_S`."""
    fired = threading.Event()

    def rescue() -> None:
        fired.set()
        for path in fifos():
            with contextlib.suppress(OSError):
                os.close(os.open(path, os.O_RDONLY | os.O_NONBLOCK))

    timer = threading.Timer(STUCK_AFTER_S, rescue)
    timer.start()
    try:
        yield fired
    finally:
        timer.cancel()
        timer.join()


def every_cast(folder: Path) -> Callable[[], list[Path]]:
    low, high = ID_RANGE
    return lambda: [folder / f"{pid}.cast" for pid in range(low, high)]


async def refused_tty_start(session: BaseSandboxSession, **options: object) -> HostPathError:
    """A tty start that must fail with `HostPathError`, leaving no process or fd."""
    before = open_fds()
    with pytest.raises(HostPathError, match="cannot record to") as caught:
        await session.pty_exec_start("echo recorded", tty=True, **options)  # type: ignore[arg-type]
    assert session.pty_processes() == []
    assert open_fds() == before
    return caught.value


# ---- record_dir --------------------------------------------------------------------------


async def test_symlinks_and_fifos_at_every_record_dir_name_are_refused(
    ws: Path, victim: Path, confined: bool
) -> None:
    casts = ws / "casts"
    async with open_local(ws, confined, record_dir=casts) as session:
        await plant(session, casts, "mixed", str(victim))
        with fifo_watchdog(every_cast(casts)) as stuck:
            for _ in range(4):  # each start picks its id at random: a symlink or a FIFO
                error = await refused_tty_start(session)
                assert victim.read_bytes() == VICTIM_TEXT
                found = "a symlink" if "a symlink already" in str(error) else "a FIFO"
                assert f"{found} already exists there" in str(error)
        assert not stuck.is_set(), "a start blocked on a FIFO's open"
        # A plain process still starts: only the recording was refused.
        update = await session.pty_exec_start("echo fine", yield_time_s=20, until="fine")
        assert "fine" in update.output
    assert victim.read_bytes() == VICTIM_TEXT


async def test_a_record_dir_swapped_after_start_does_not_redirect_recordings(
    tmp_path: Path, ws: Path, confined: bool
) -> None:
    elsewhere = tmp_path / "outside"
    elsewhere.mkdir()
    async with open_local(ws, confined, record_dir=ws / "casts") as session:
        await sandbox_sh(session, f"mv casts casts.old && ln -s {elsewhere} casts")
        update = await session.pty_exec_start(
            "echo recorded; sleep 60", tty=True, until="recorded", yield_time_s=20
        )
        await session.pty_terminate_all()
    assert list(elsewhere.iterdir()) == []
    (cast,) = (ws / "casts.old").iterdir()
    assert cast.name == f"{update.process_id}.cast"
    _, events = read_cast(cast)
    assert "recorded" in "".join(e[2] for e in events if e[1] == "o")


async def test_earlier_recordings_in_record_dir_are_kept(ws: Path) -> None:
    casts = ws / "casts"
    async with open_local(ws, False, record_dir=casts) as session:
        # Half the names hold an earlier session's recordings (every even id).
        await plant(session, casts, "file", step=2)
        for _ in range(16):
            await session.pty_exec_start("true", tty=True, yield_time_s=20)
    low, high = ID_RANGE
    old = [casts / f"{pid}.cast" for pid in range(low, high, 2)]
    assert all(os.stat(p).st_size == 0 for p in old)
    new = [p for p in casts.iterdir() if int(p.stem) % 2]
    assert len(new) == 16
    for path in new:
        header, _ = read_cast(path)
        assert header["command"] == "true"


async def test_record_dir_that_is_missing_or_a_file_fails_the_start(tmp_path: Path) -> None:
    casts = tmp_path / "casts"
    casts.mkdir()
    before = open_fds()
    # The folder's fd lives from the start to the close, and a failed start closes it.
    failing = sandbox.open_session(
        "unix_local", workdir=tmp_path / "not-a-folder", record_dir=casts
    )
    (tmp_path / "not-a-folder").write_text("x")  # the backend's start fails now
    with pytest.raises(sandbox.InvalidArgumentError, match="workspace"):
        await failing.start()
    assert open_fds() == before
    async with sandbox.open_session(
        "unix_local", workdir=tmp_path / "ws", record_dir=casts
    ) as session:
        assert len(open_fds() - before) >= 1
    assert session.state is sandbox.SessionState.CLOSED and open_fds() == before
    for bad, reason in (
        (tmp_path / "missing", "does not exist"),
        (tmp_path / "file", "not a folder"),
    ):
        if bad.name == "file":
            bad.write_text("x")
        session = sandbox.open_session("unix_local", workdir=tmp_path / "ws", record_dir=bad)
        with pytest.raises(HostPathError, match=reason):
            await session.start()
        assert session.state is sandbox.SessionState.NEW
        await session.aclose()


# ---- record=PATH ---------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["symlink", "dangling", "fifo", "file"])
async def test_record_path_with_something_planted_there_is_refused(
    ws: Path, victim: Path, confined: bool, kind: str
) -> None:
    target = ws / "out" / "run.cast"
    fresh = victim.parent / "new.cast"
    async with open_local(ws, confined) as session:
        plants = {
            "symlink": f"ln -s {victim} out/run.cast",
            "dangling": f"ln -s {fresh} out/run.cast",
            "fifo": "mkfifo out/run.cast",
            "file": "printf 'kept' > out/run.cast",
        }
        await sandbox_sh(session, f"mkdir out && {plants[kind]}")
        with fifo_watchdog(lambda: [target]) as stuck:
            error = await refused_tty_start(session, record=target)
        assert not stuck.is_set(), "the start blocked on a FIFO's open"
        assert "already exists there" in str(error) and error.path == str(target)
    assert victim.read_bytes() == VICTIM_TEXT
    assert not fresh.exists()
    if kind == "file":
        assert target.read_bytes() == b"kept"


async def test_a_symlinked_folder_swapped_into_a_record_path_is_refused(
    ws: Path, victim: Path, confined: bool
) -> None:
    target = ws / "out" / "run.cast"
    async with open_local(ws, confined) as session:
        await sandbox_sh(session, f"ln -s {victim.parent} out")
        error = await refused_tty_start(session, record=target)
        assert f"{str(ws / 'out')!r} is a symlink" in str(error)
        # The same path with a real folder records.
        await sandbox_sh(session, "rm out && mkdir out")
        update = await session.pty_exec_start("echo ok", tty=True, record=target, until="ok")
        assert "ok" in update.output
        await session.pty_terminate_all()
    assert sorted(p.name for p in victim.parent.iterdir()) == ["victim.txt"]
    assert victim.read_bytes() == VICTIM_TEXT
    read_cast(target)


# ---- the module itself -----------------------------------------------------------------


def test_recorder_open_creates_new_files_only(tmp_path: Path) -> None:
    path = tmp_path / "a.cast"
    with AsciicastRecorder.open(path, rows=24, cols=80) as recorder:
        recorder.output(b"first")
    before = path.read_bytes()
    with pytest.raises(HostPathError, match="a regular file already exists there"):
        AsciicastRecorder.open(path, rows=24, cols=80)
    assert path.read_bytes() == before
    assert os.stat(path).st_mode & 0o777 == 0o600


def test_relative_paths_and_dotdot_are_walked_without_symlinks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "c").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "a")
    monkeypatch.chdir(tmp_path / "c")
    os.close(create_new_file("../a/b/../x.cast"))
    assert (tmp_path / "a" / "x.cast").is_file()
    with pytest.raises(HostPathError, match=re.escape("'../link' is a symlink")):
        create_new_file("../link/y.cast")
    assert not (tmp_path / "a" / "y.cast").exists()
    (tmp_path / "a" / "f").write_text("x")
    with pytest.raises(HostPathError, match="is a regular file, not a folder"):
        create_new_file("../a/f/z.cast")
    with pytest.raises(HostPathError, match="does not exist"):
        create_new_file("../nope/z.cast")


@pytest.mark.parametrize("bad", ["", "dir/", ".", "..", "a/..", "nul\0byte", "\udcff\ud800"])
def test_bad_paths_are_a_host_path_error(tmp_path: Path, bad: str) -> None:
    with pytest.raises(HostPathError):
        create_new_file(os.path.join(tmp_path, bad) if bad else bad)


def test_host_directory_refuses_names_that_are_not_one_component(tmp_path: Path) -> None:
    with HostDirectory.open(tmp_path) as folder:
        for name in ("", ".", "..", "a/b", "x\0"):
            with pytest.raises(HostPathError):
                folder.create_file(name)
            assert folder.contains(name)  # never "free"
        assert not folder.contains("free.cast")
    assert folder.closed and "closed" in repr(folder)
    assert list(tmp_path.iterdir()) == []


def test_a_walked_folder_follows_no_symlink_and_keeps_its_fd(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    with pytest.raises(HostPathError, match="is a symlink"):
        HostDirectory.walk(tmp_path / "link")
    with HostDirectory.walk(tmp_path / "real") as folder:
        (tmp_path / "real").rename(tmp_path / "moved")
        (tmp_path / "real").symlink_to(tmp_path / "link")
        os.close(folder.create_file("kept.cast"))
    assert (tmp_path / "moved" / "kept.cast").is_file()
    assert not (tmp_path / "link" / "kept.cast").exists()
