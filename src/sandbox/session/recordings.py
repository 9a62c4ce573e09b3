"""`Recordings`: the session's `record_dir` and the recording each tty process gets.

The folder is opened once, by `start()` (before the sandbox runs anything, its
symlinks followed as the caller named them), so later swaps of the path cannot
redirect it; each recording is then created new relative to that fd
(`sandbox.files.host`). A process's own `record` path is opened the same way, alone.
"""

from __future__ import annotations

import os
from typing import Any

from ..errors import HostPathError, InvalidArgumentError, SessionClosedError
from ..files.host import HostDirectory
from ..process_entry import H, PtyEntry
from ..terminal.recording import AsciicastRecorder


def record_name(process_id: int) -> str:
    """The name of a process's recording in `record_dir`."""
    return f"{process_id}.cast"


class Recordings:
    """Where a session's tty processes are recorded (`record_dir`, or none)."""

    def __init__(self, record_dir: str | os.PathLike[str] | None) -> None:
        if record_dir is not None and not isinstance(record_dir, str | os.PathLike):
            raise InvalidArgumentError(f"record_dir must be a path, not {record_dir!r}")
        self.record_dir = None if record_dir is None else os.fspath(record_dir)
        # `record_dir`'s fd: opened by `open()`, closed by a failed start or the close.
        self._folder: HostDirectory | None = None

    def open(self) -> None:
        """Open `record_dir` (once; `HostPathError` if it is no folder we may use)."""
        if self.record_dir is not None and self._folder is None:
            self._folder = HostDirectory.open(self.record_dir, what="record to")

    def close(self) -> None:
        """Close the folder's fd (a failed start, the close). Idempotent."""
        folder, self._folder = self._folder, None
        if folder is not None:
            folder.close()

    def name_taken(self, process_id: int) -> bool:
        """Whether `process_id`'s recording name is already used in the folder."""
        folder = self._folder
        return folder is not None and folder.contains(record_name(process_id))

    def start(
        self,
        entry: PtyEntry[H],
        record: str | os.PathLike[str] | None,
        record_input: bool,
        *,
        closed: SessionClosedError,
    ) -> None:
        """Open the entry's recording (its own file, else one in `record_dir`), always a
        new file: what is at its name already is refused (`HostPathError`). Raises
        `closed` when the close already released the folder (never unrecorded)."""
        if record is None and self.record_dir is None:
            return
        if record is None and self._folder is None:
            raise closed
        env = entry.spec.command.env or {}
        options: dict[str, Any] = {
            "rows": entry.spec.rows,
            "cols": entry.spec.cols,
            "term": env.get("TERM", "xterm-256color"),
            "command": entry.spec.command.display,
            "record_input": bool(record_input),
        }
        try:
            if record is not None:
                entry.recorder = AsciicastRecorder.open(record, **options)
            elif self._folder is not None:
                name = record_name(entry.process_id)
                entry.recorder = AsciicastRecorder.open_in(self._folder, name, **options)
        except OSError as exc:  # the header's write failed (the file was made)
            shown = os.fspath(record) if record is not None else self.record_dir or ""
            raise HostPathError(
                f"cannot record to {shown!r}: {exc.strerror or exc}", path=str(shown)
            ) from None
