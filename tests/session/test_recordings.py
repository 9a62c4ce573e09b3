"""`sandbox.session.recordings.Recordings`, alone: a real folder and real entries."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sandbox import arguments
from sandbox.errors import HostPathError, InvalidArgumentError, SessionClosedError
from sandbox.process_entry import ProcessSpec, PtyEntry
from sandbox.session.recordings import Recordings, record_name

CLOSED = SessionClosedError("the test session was closed")


def _entry(process_id: int = 4242) -> PtyEntry:
    command = arguments.build_command(("sh",), shell=False, env={"TERM": "vt100"}, cwd=None)
    return PtyEntry(process_id, ProcessSpec(command=command, tty=True, rows=10, cols=40))


def test_a_record_dir_must_be_a_path() -> None:
    with pytest.raises(InvalidArgumentError, match="record_dir must be a path"):
        Recordings(42)  # type: ignore[arg-type]
    assert Recordings(Path("/tmp")).record_dir == "/tmp"


def test_without_a_folder_nothing_is_recorded() -> None:
    recordings = Recordings(None)
    recordings.open()
    entry = _entry()
    recordings.start(entry, None, False, closed=CLOSED)
    assert entry.recorder is None and not recordings.name_taken(entry.process_id)


def test_a_recording_is_made_new_in_the_folder(tmp_path: Path) -> None:
    recordings = Recordings(tmp_path)
    recordings.open()
    entry = _entry()
    recordings.start(entry, None, True, closed=CLOSED)
    assert entry.recorder is not None
    assert recordings.name_taken(entry.process_id)
    entry.feed(b"hi")
    entry.close_terminal()
    header, *events = (tmp_path / record_name(4242)).read_text().splitlines()
    meta = json.loads(header)
    assert (meta["width"], meta["height"], meta["env"]["TERM"]) == (40, 10, "vt100")
    assert json.loads(events[0])[1:] == ["o", "hi"]
    # The same name again is refused: a recording never overwrites one.
    with pytest.raises(HostPathError):
        recordings.start(_entry(), None, False, closed=CLOSED)
    recordings.close()


def test_a_closed_folder_refuses_instead_of_not_recording(tmp_path: Path) -> None:
    recordings = Recordings(tmp_path)
    recordings.open()
    recordings.close()
    recordings.close()  # idempotent
    with pytest.raises(SessionClosedError):
        recordings.start(_entry(), None, False, closed=CLOSED)
    assert not recordings.name_taken(4242)


def test_a_process_s_own_record_path_needs_no_folder(tmp_path: Path) -> None:
    recordings = Recordings(None)
    entry = _entry()
    recordings.start(entry, tmp_path / "own.cast", False, closed=CLOSED)
    assert entry.recorder is not None
    entry.close_terminal()
    assert (tmp_path / "own.cast").read_text().startswith("{")
