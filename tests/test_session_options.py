"""Session options are checked when the session is opened, on every backend.

A bad option must raise `InvalidArgumentError` from `open_session` naming the option,
never a raw `TypeError` at the first use or, worse, at teardown. Each backend gets the
options its conformance fixture passes (with placeholder credentials: nothing connects
before `start()`) plus one bad option.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import sandbox
from sandbox.backends import BACKENDS, load_backend
from sandbox.backends.toolkit import RENAMED
from sandbox.session.options import option_names


def _usual(name: str, tmp_path: Path) -> dict[str, Any]:
    """The options the conformance fixture of `name` passes (credentials are dummies)."""
    ws = str(tmp_path / "ws")
    return {
        "unix_local": lambda: {"workdir": ws, "terminate_grace_s": 0.5},
        "docker": lambda: {"container": "c0ffee", "workdir": "/tmp/ws", "terminate_grace_s": 0.5},
        "blaxel": lambda: {
            "workdir": ws,
            "terminate_grace_s": 0.5,
            "api_key": "k",
            "workspace": "w",
            "api_url": "http://127.0.0.1:9",
        },
        "cloudflare": lambda: {"worker_url": "http://127.0.0.1:9", "api_key": "k"},
        "daytona": lambda: {"api_key": "k", "terminate_grace_s": 0.5, "teardown_timeout_s": 10.0},
        "e2b": lambda: {"api_key": "k", "teardown_timeout_s": 5.0},
        "kubernetes": lambda: {
            "kubeconfig": str(tmp_path / "kubeconfig"),
            "image": "busybox",
            "terminate_grace_s": 0.5,
        },
        "modal": lambda: {
            "token_id": "i",
            "token_secret": "s",
            "workdir": ws,
            "state_dir": str(tmp_path / "state"),
            "terminate_grace_s": 0.5,
        },
    }[name]()


# (backend, bad option, its value). Every backend also gets the base session's options.
BAD: list[tuple[str, str, object]] = [
    (name, option, value)
    for name in BACKENDS
    for option, value in (
        ("exec_output_limit_bytes", -1),
        ("exec_output_limit_bytes", "16M"),
    )
] + [
    ("unix_local", "terminate_grace_s", "x"),
    ("unix_local", "terminate_grace_s", -1),
    ("unix_local", "env", {"A": 1}),
    ("unix_local", "env", ["A=1"]),
    ("unix_local", "env", {"A": "x\0y"}),
    ("unix_local", "inherit_env", "no"),
    ("unix_local", "workdir", "/etc/passwd"),
    ("unix_local", "workdir", "/etc/passwd/sub"),
    ("unix_local", "workdir", 7),
    ("unix_local", "readonly_paths", "/usr"),
    ("docker", "terminate_grace_s", "x"),
    ("docker", "call_timeout_s", 0),
    ("docker", "env", {"A": 1}),
    ("docker", "cpu_limit", "two"),
    ("docker", "cpu_limit", 0),
    ("docker", "cpu_limit", float("nan")),
    ("docker", "process_limit", 1.5),
    ("docker", "process_limit", 0),
    ("docker", "memory_limit_bytes", "512m"),
    ("docker", "memory_limit_bytes", -1),
    ("docker", "memory_limit_bytes", True),
    ("docker", "user", 1000),
    ("blaxel", "terminate_grace_s", "x"),
    ("blaxel", "call_timeout_s", -1),
    ("blaxel", "connect_timeout_s", "30"),
    ("blaxel", "heartbeat_s", float("nan")),
    ("blaxel", "max_response_bytes", 0),
    ("blaxel", "max_terminal_frame_bytes", "1M"),
    ("blaxel", "memory_limit_bytes", 1.5),
    ("cloudflare", "call_timeout_s", "60"),
    ("cloudflare", "heartbeat_s", -1),
    ("daytona", "terminate_grace_s", "x"),
    ("daytona", "teardown_timeout_s", "x"),
    ("daytona", "create_timeout_s", 0),
    ("daytona", "create_options", ["x"]),
    ("e2b", "start_timeout_s", "x"),
    ("e2b", "env", {"A": 1}),
    ("e2b", "labels", {"A": None}),
    ("modal", "terminate_grace_s", "x"),
    ("modal", "sandbox_timeout_s", "1h"),
    ("modal", "env", {"A": b"x"}),
    ("modal", "state_dir", ""),
]


def _installed(name: str) -> None:
    if not BACKENDS[name].installed:
        pytest.skip(f"the {name} backend is not installed")


@pytest.mark.parametrize("name", list(BACKENDS))
def test_usual_options_open(name: str, tmp_path: Path) -> None:
    _installed(name)
    session = sandbox.open_session(name, **_usual(name, tmp_path))
    assert session.state is sandbox.SessionState.NEW


@pytest.mark.parametrize(("name", "option", "value"), BAD, ids=lambda v: repr(v)[:30])
def test_bad_option_is_refused_at_open(
    name: str, option: str, value: object, tmp_path: Path
) -> None:
    _installed(name)
    (tmp_path / "a-file").touch()
    options = {**_usual(name, tmp_path), option: value}
    with pytest.raises(sandbox.InvalidArgumentError) as info:
        sandbox.open_session(name, **options)
    message = str(info.value)
    assert option in message, message
    assert "x\0y" not in message, "values are not echoed (they may be secrets)"


def test_workspace_under_a_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "a-file").touch()
    with pytest.raises(sandbox.InvalidArgumentError, match=r"is inside .* not a directory"):
        sandbox.open_session("unix_local", workdir=tmp_path / "a-file" / "ws")
    with pytest.raises(sandbox.InvalidArgumentError, match="exists and is not a directory"):
        sandbox.open_session("unix_local", workdir=tmp_path / "a-file")


@pytest.mark.parametrize(
    "option,value",
    [
        ("max_processes", "64"),
        ("max_processes", 3),
        ("output_limit_bytes", 1.5),
        ("teardown_concurrency", "x"),
        ("teardown_concurrency", 0),
        ("teardown_concurrency", True),
    ],
)
def test_base_session_options_are_checked_at_open(option: str, value: object) -> None:
    with pytest.raises(sandbox.InvalidArgumentError, match=option):
        sandbox.open_session("unix_local", **{option: value})


# An earlier name a backend still takes, in a meaning of its own (not the renamed
# concept): blaxel's `workspace` is its account's workspace, e2b's `start_timeout_s`
# bounds a process's start as well as the create.
OWN_MEANING = {("blaxel", "workspace"), ("e2b", "start_timeout_s")}


@pytest.mark.parametrize("name", list(BACKENDS))
def test_no_backend_takes_an_earlier_name(name: str) -> None:
    _installed(name)
    taken = {(name, old) for old in option_names(load_backend(name)) if old in RENAMED}
    assert taken <= OWN_MEANING, f"an earlier name taken again (a shim?): {taken - OWN_MEANING}"


@pytest.mark.parametrize("old", sorted(RENAMED))
@pytest.mark.parametrize("name", list(BACKENDS))
def test_an_earlier_name_is_refused_naming_the_new_one(name: str, old: str, tmp_path: Path) -> None:
    _installed(name)
    if (name, old) in OWN_MEANING:
        pytest.skip(f"{old} is an option of {name} in a meaning of its own")
    new = RENAMED[old]
    with pytest.raises(sandbox.InvalidArgumentError) as info:
        sandbox.open_session(name, **{**_usual(name, tmp_path), old: "x\0y"})
    message = str(info.value)
    if new in option_names(load_backend(name)):
        assert f"{old}= is now {new}=" in message, message
    else:  # the backend has no such concept: an unknown option like any other
        assert f"unknown option {old!r}" in message, message
    assert "x\0y" not in message, "values are not echoed (they may be secrets)"


# ---- docs/providers.md, "Options": the one table of names ------------------------------

PROVIDERS_MD = Path(__file__).resolve().parents[1] / "docs" / "providers.md"


def _options_section() -> str:
    text = PROVIDERS_MD.read_text()
    start = text.index("\n## Options\n")
    return text[start : text.index("\n## ", start + 1)]


def _table_rows(section: str, header: str) -> list[list[str]]:
    lines = section[section.index(header) :].splitlines()[2:]
    rows = []
    for line in lines:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split("|")])
    return rows


def _ticked(cell: str) -> list[str]:
    return [name for name in cell.split("`")[1::2]]


def _backend_options() -> dict[str, set[str]]:
    base = set(option_names(sandbox.BaseSandboxSession))
    found = {}
    for name in BACKENDS:
        if BACKENDS[name].installed:
            found[name] = set(option_names(load_backend(name))) - base
    return found


def test_the_options_table_names_each_concept_once_with_the_backends_taking_it() -> None:
    options = _backend_options()
    listed: set[str] = set()
    for _concept, names, backends, _notes in _table_rows(
        _options_section(), "| concept | option |"
    ):
        said = {b.strip() for b in backends.split(",")}
        for option in _ticked(names):
            assert option not in listed, f"{option} in two rows"
            listed.add(option)
            taking = {b for b, taken in options.items() if option in taken}
            assert taking == said & set(options), (option, sorted(taking), sorted(said))


def test_the_earlier_names_table_is_renamed() -> None:
    rows = _table_rows(_options_section(), "| earlier name | now |")
    table = {old: _ticked(new)[0] for olds, new in rows for old in _ticked(olds)}
    assert table == dict(RENAMED)


def test_every_backend_option_is_in_the_options_section() -> None:
    section = _options_section()
    shared = {o for row in _table_rows(section, "| concept | option |") for o in _ticked(row[1])}
    for name, taken in _backend_options().items():
        line = next(x for x in section.split("\n- ")[1:] if x.startswith(f"{name}:"))
        own = set(_ticked(line))
        missing = taken - shared - own
        assert not missing, f"docs/providers.md, Options: add {sorted(missing)} to {name}'s"
        assert not own - taken, f"docs/providers.md, Options: {name} has no {own - taken}"
