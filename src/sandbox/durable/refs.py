"""`SessionRef`: a frozen, versioned, JSON value that finds a sandbox and its processes.

A ref holds what a later client needs to attach to the same sandbox: the backend's
name, where the sandbox is (`sandbox`: a container id, a workspace path...), the options
that are not secrets, and for each process its id, command, terminal, the provider's
handle for it and the output position the client had reached. It never holds a secret:
each backend lists the options a ref keeps (an allow-list, never a filter), and
credentials are given again, or read from the environment, at resume.

Equality and hashing are by value (the canonical JSON text); `to_json()` of equal refs
is the same string.

A ref read back as JSON (`from_json`, `from_dict`, a ref file) is untrusted: a sandbox
can write the file it lives in. So `to_dict()`/`to_json()` add a `seal` (an HMAC under
this user's key, `sandbox.durable.seal`) and reading one back checks it: a ref this
user's library did not write, or one changed since, raises `RefNotTrustedError`. A
`SessionRef` made in code is the caller's own and needs no seal.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import InvalidArgumentError, RefNotTrustedError
from . import seal

REF_VERSION = 1
# A ref file or a ref passed on a command line is caller data: bounded before parsing.
MAX_REF_BYTES = 1 << 20
# Handles are small objects; a deeper one is not a ref this library wrote (and deep
# nesting would exhaust the stack of the recursive copy below).
MAX_REF_DEPTH = 32

# Session ids key lease files and in-sandbox paths: kept to a safe alphabet.
SESSION_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")

JSONValue = None | bool | int | float | str | list["JSONValue"] | dict[str, "JSONValue"]


def _plain(value: object, where: str, depth: int = 0) -> Any:
    """`value` as plain JSON data (dicts with str keys, lists, scalars), copied."""
    if depth > MAX_REF_DEPTH:
        raise InvalidArgumentError(f"{where} is nested more than {MAX_REF_DEPTH} levels deep")
    if value is None or isinstance(value, bool | str):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise InvalidArgumentError(f"{where} holds a non-finite number")
        return value
    if isinstance(value, list | tuple):
        return [_plain(item, where, depth + 1) for item in value]
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise InvalidArgumentError(f"{where} has a key that is not a str: {key!r}")
            out[key] = _plain(item, where, depth + 1)
        return out
    raise InvalidArgumentError(f"{where} holds a {type(value).__name__}, not JSON data")


def _field(data: Mapping[str, Any], name: str, kind: type | tuple[type, ...], where: str) -> Any:
    if name not in data:
        raise InvalidArgumentError(f"{where} has no {name!r}")
    value = data[name]
    if isinstance(value, bool) and kind in (int, float, (int, float)):
        raise InvalidArgumentError(f"{where}: {name!r} must be a number, not a bool")
    if not isinstance(value, kind):
        raise InvalidArgumentError(f"{where}: {name!r} has the wrong type")
    return value


@dataclass(frozen=True)
class ProcessRef:
    """One process in a `SessionRef`.

    `process_id` is the id the session gave it (kept at resume); `command` how
    `pty_processes()` shows it; `handle` the provider's own handle (a pid, a name, a
    session id: JSON data, never a secret); `output_position` how many bytes of its
    output the client had reached; `running` False when it had ended, with
    `exit_code` (None if unknown) and `note` (why it ended, when the client did not
    see it end by itself). `stdin` True: a pipe process started with `stdin=True` whose
    stdin was still open (no `pty_close_stdin` asked), so a resumed client may write to
    it and close it.
    """

    process_id: int
    command: str
    tty: bool
    rows: int = 24
    cols: int = 80
    stdin: bool = False
    started_at: float = 0.0
    running: bool = True
    exit_code: int | None = None
    note: str | None = None
    output_position: int = 0
    handle: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "handle", _plain(self.handle, "a process handle"))

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON data."""
        return {
            "process_id": self.process_id,
            "command": self.command,
            "tty": self.tty,
            "rows": self.rows,
            "cols": self.cols,
            "stdin": self.stdin,
            "started_at": self.started_at,
            "running": self.running,
            "exit_code": self.exit_code,
            "note": self.note,
            "output_position": self.output_position,
            "handle": _plain(self.handle, "a process handle"),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ProcessRef:
        """Rebuild from `to_dict()`'s data; `InvalidArgumentError` when it is malformed."""
        where = "a process in the ref"
        if not isinstance(data, Mapping):
            raise InvalidArgumentError(f"{where} is not an object")
        exit_code = data.get("exit_code")
        note = data.get("note")
        if exit_code is not None and (
            isinstance(exit_code, bool) or not isinstance(exit_code, int)
        ):
            raise InvalidArgumentError(f"{where}: 'exit_code' must be an int or null")
        if note is not None and not isinstance(note, str):
            raise InvalidArgumentError(f"{where}: 'note' must be a str or null")
        handle = data.get("handle", {})
        if not isinstance(handle, Mapping):
            raise InvalidArgumentError(f"{where}: 'handle' must be an object")
        stdin = data.get("stdin", False)  # absent from refs made before open stdin
        if not isinstance(stdin, bool):
            raise InvalidArgumentError(f"{where}: 'stdin' must be a bool")
        return cls(
            process_id=_field(data, "process_id", int, where),
            command=_field(data, "command", str, where),
            tty=_field(data, "tty", bool, where),
            rows=_field(data, "rows", int, where),
            cols=_field(data, "cols", int, where),
            stdin=stdin,
            started_at=float(_field(data, "started_at", (int, float), where)),
            running=_field(data, "running", bool, where),
            exit_code=exit_code,
            note=note,
            output_position=_field(data, "output_position", int, where),
            handle=handle,
        )

    def __hash__(self) -> int:
        return hash(json.dumps(self.to_dict(), sort_keys=True))


@dataclass(frozen=True)
class SessionRef:
    """What finds a session's sandbox and processes again (see the module docstring).

    Make one with `session.ref()` or `await session.detach()`; use it with
    `sandbox.resume_session(ref, **options)`. `session_id` names the session across
    every client that owns it in turn (it keys the lease: `sandbox.durable.lease`);
    `sandbox` is the backend's locator and `options` the non-secret options to reopen
    with.
    """

    backend: str
    session_id: str
    sandbox: Mapping[str, Any] = field(default_factory=dict)
    options: Mapping[str, Any] = field(default_factory=dict)
    processes: tuple[ProcessRef, ...] = ()
    keeps_processes: bool = False
    version: int = REF_VERSION

    def __post_init__(self) -> None:
        if not isinstance(self.session_id, str) or not SESSION_ID.fullmatch(self.session_id):
            raise InvalidArgumentError("a session ref's session_id must be 1-64 of [A-Za-z0-9_-]")
        object.__setattr__(self, "sandbox", _plain(self.sandbox, "the ref's sandbox"))
        object.__setattr__(self, "options", _plain(self.options, "the ref's options"))
        object.__setattr__(self, "processes", tuple(self.processes))

    def _unsealed(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "backend": self.backend,
            "session_id": self.session_id,
            "sandbox": _plain(self.sandbox, "the ref's sandbox"),
            "options": _plain(self.options, "the ref's options"),
            "keeps_processes": self.keeps_processes,
            "processes": [p.to_dict() for p in self.processes],
        }

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON data with its `seal` (`from_dict` reads it back)."""
        data = self._unsealed()
        data["seal"] = seal.seal(seal.REF_PURPOSE, _canonical(data).encode())
        return data

    def to_json(self) -> str:
        """The ref as one line of canonical JSON (keys sorted), sealed."""
        return _canonical(self.to_dict())

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SessionRef:
        """Rebuild a ref from `to_dict()`'s data. `RefNotTrustedError` when its seal does
        not match (not written by this user's library, or changed since);
        `InvalidArgumentError` for malformed data or another version."""
        if not isinstance(data, Mapping):
            raise InvalidArgumentError("a session ref must be a JSON object")
        version = data.get("version")
        if version != REF_VERSION:
            raise InvalidArgumentError(
                f"this session ref has version {version!r}; this library reads version "
                f"{REF_VERSION}"
            )
        unsealed = {k: v for k, v in data.items() if k != "seal"}
        try:
            text = _canonical(_plain(unsealed, "the session ref"))
        except (TypeError, ValueError):
            raise InvalidArgumentError("the session ref is not JSON data") from None
        if not seal.is_sealed(seal.REF_PURPOSE, text.encode(), data.get("seal")):
            raise RefNotTrustedError(
                "this session ref was not written by this user's sandbox library, or was "
                "changed since (its seal does not match): refusing to use it. A process in "
                "the sandbox may have rewritten the file; refs are sealed with the key in "
                f"{seal.state_folder()!r}"
            )
        where = "the session ref"
        processes = data.get("processes", [])
        if not isinstance(processes, list):
            raise InvalidArgumentError(f"{where}: 'processes' must be a list")
        sandbox = _field(data, "sandbox", Mapping, where)
        options = _field(data, "options", Mapping, where)
        refs = tuple(ProcessRef.from_dict(p) for p in processes)
        if len({p.process_id for p in refs}) != len(refs):
            raise InvalidArgumentError(f"{where} lists a process id twice")
        return cls(
            backend=_field(data, "backend", str, where),
            session_id=_field(data, "session_id", str, where),
            sandbox=sandbox,
            options=options,
            processes=refs,
            keeps_processes=bool(data.get("keeps_processes", False)),
        )

    @classmethod
    def from_json(cls, text: str | bytes) -> SessionRef:
        """Parse `to_json()`'s text (bounded: at most 1 MiB; the seal checked)."""
        if not isinstance(text, str | bytes):
            raise InvalidArgumentError("a session ref must be given as JSON text")
        if len(text) > MAX_REF_BYTES:
            raise InvalidArgumentError("this session ref is larger than 1 MiB")
        try:
            data = json.loads(text)
        except (ValueError, UnicodeDecodeError) as exc:
            raise InvalidArgumentError(f"not a session ref (bad JSON: {exc})") from None
        except RecursionError:
            raise InvalidArgumentError("not a session ref (JSON nested too deeply)") from None
        return cls.from_dict(data)

    def __hash__(self) -> int:
        return hash(_canonical(self._unsealed()))

    def __repr__(self) -> str:
        return (
            f"<SessionRef backend={self.backend!r} session_id={self.session_id!r} "
            f"processes={len(self.processes)}>"
        )


def _canonical(data: Mapping[str, Any]) -> str:
    return json.dumps(data, sort_keys=True, separators=(",", ":"))


class ProcessNotReattached(Exception):
    """Raised by a backend's `_reattach_process`: the provider no longer has the process
    (or never keeps one past its client). `note` says why (shown to the caller, so no
    secret); `exit_code` is its status when the provider knows it."""

    def __init__(self, note: str, exit_code: int | None = None) -> None:
        super().__init__(note)
        self.note = note
        self.exit_code = exit_code
