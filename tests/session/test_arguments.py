"""Argument checks (sandbox.arguments): the boundaries of every option, and the message."""

from __future__ import annotations

import math

import pytest

from sandbox import arguments as a
from sandbox.errors import InvalidArgumentError
from sandbox.process_entry import CommandSpec

NOT_NUMBERS = [True, False, "1", None, [1], 1j]


def test_the_window_constants() -> None:
    assert (a.START_YIELD_S, a.WRITE_YIELD_S) == (10.0, 0.25)
    assert (a.MIN_YIELD_S, a.MAX_YIELD_S, a.EMPTY_POLL_MIN_YIELD_S) == (0.25, 30.0, 5.0)
    assert a.MAX_TERMINAL_SIDE == 1000


# --- yield_window ----------------------------------------------------------------------


def test_yield_window_clamps_to_the_floor_and_the_ceiling() -> None:
    assert a.yield_window(None, 10.0) == 10.0
    assert a.yield_window(None, 100.0) == a.MAX_YIELD_S
    assert a.yield_window(0, 10.0) == a.MIN_YIELD_S
    assert a.yield_window(0.25, 10.0) == 0.25
    assert a.yield_window(0.3, 10.0) == 0.3
    assert a.yield_window(30, 10.0) == 30.0
    assert a.yield_window(30.5, 10.0) == 30.0
    assert a.yield_window(1, 10.0, floor=5.0) == 5.0
    assert a.yield_window(6, 10.0, floor=5.0) == 6.0
    result = a.yield_window(2, 10.0)
    assert type(result) is float


@pytest.mark.parametrize("bad", [True, "1", [1]])
def test_yield_window_refuses_non_numbers(bad: object) -> None:
    with pytest.raises(InvalidArgumentError, match="must be a number of seconds"):
        a.yield_window(bad, 10.0)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [-0.001, -1, math.nan])
def test_yield_window_refuses_negative_and_nan(bad: float) -> None:
    with pytest.raises(InvalidArgumentError, match=">= 0 seconds"):
        a.yield_window(bad, 10.0)


# --- check_max_tokens ---------------------------------------------------------------------


def test_max_tokens_accepts_none_and_positive_ints() -> None:
    assert a.check_max_tokens(None) is None
    assert a.check_max_tokens(1) == 1
    assert a.check_max_tokens(10**9) == 10**9


@pytest.mark.parametrize("bad", [0, -1, True, 1.5, "3"])
def test_max_tokens_refuses_the_rest(bad: object) -> None:
    with pytest.raises(InvalidArgumentError, match="positive int or None"):
        a.check_max_tokens(bad)  # type: ignore[arg-type]


# --- check_terminal_size ------------------------------------------------------------------


def test_terminal_sides_from_one_to_the_maximum() -> None:
    assert a.check_terminal_size(1, 1) == (1, 1)
    assert a.check_terminal_size(1000, 1000) == (1000, 1000)
    assert a.check_terminal_size(24, 80) == (24, 80)


@pytest.mark.parametrize(
    ("rows", "cols", "message"),
    [
        (0, 80, "rows must be between 1 and 1000, got 0"),
        (24, 0, "cols must be between 1 and 1000, got 0"),
        (1001, 80, "rows must be between 1 and 1000, got 1001"),
        (24, 1001, "cols must be between 1 and 1000, got 1001"),
        (True, 80, "rows must be an int"),
        (24, 80.0, "cols must be an int"),
    ],
)
def test_terminal_sides_outside_are_refused(rows: object, cols: object, message: str) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        a.check_terminal_size(rows, cols)  # type: ignore[arg-type]
    assert str(info.value).startswith(message)


# --- check_timeout ---------------------------------------------------------------------


def test_timeout_is_none_or_positive_and_finite() -> None:
    assert a.check_timeout(None) is None
    assert a.check_timeout(1) == 1.0
    assert type(a.check_timeout(1)) is float
    assert a.check_timeout(0.001) == 0.001


@pytest.mark.parametrize("bad", [0, -1, math.inf, math.nan])
def test_timeout_out_of_range(bad: float) -> None:
    with pytest.raises(InvalidArgumentError, match="positive, finite"):
        a.check_timeout(bad)


@pytest.mark.parametrize("bad", [True, "5"])
def test_timeout_not_a_number(bad: object) -> None:
    with pytest.raises(InvalidArgumentError, match="number of seconds"):
        a.check_timeout(bad)  # type: ignore[arg-type]


# --- check_seconds ---------------------------------------------------------------------


def test_seconds_accepts_positive_and_zero_where_allowed() -> None:
    assert a.check_seconds("grace_s", 2) == 2.0
    assert type(a.check_seconds("grace_s", 2)) is float
    assert a.check_seconds("grace_s", 0, allow_zero=True) == 0.0
    assert a.check_seconds("grace_s", None, allow_none=True) is None


def test_seconds_refuses_zero_by_default_and_names_the_bound() -> None:
    with pytest.raises(InvalidArgumentError, match=r"grace_s must be a finite number > 0, got 0"):
        a.check_seconds("grace_s", 0)
    with pytest.raises(InvalidArgumentError, match=r"must be a finite number >= 0, got -1"):
        a.check_seconds("grace_s", -1, allow_zero=True)
    with pytest.raises(InvalidArgumentError, match=r"> 0, got -0.5"):
        a.check_seconds("grace_s", -0.5)
    for bad in (math.inf, math.nan):
        with pytest.raises(InvalidArgumentError, match="finite"):
            a.check_seconds("grace_s", bad, allow_zero=True)


def test_seconds_refuses_none_unless_allowed_and_non_numbers() -> None:
    with pytest.raises(InvalidArgumentError) as info:
        a.check_seconds("grace_s", None)
    assert str(info.value) == "grace_s must be a number of seconds, not NoneType"
    with pytest.raises(InvalidArgumentError) as info:
        a.check_seconds("grace_s", "1", allow_none=True)
    assert str(info.value) == "grace_s must be a number of seconds or None, not str"
    with pytest.raises(InvalidArgumentError, match="not bool"):
        a.check_seconds("grace_s", True)


# --- check_output_limit ------------------------------------------------------------------


def test_output_limit_is_an_int_from_zero() -> None:
    assert a.check_output_limit("max_output_bytes", 0) == 0
    assert a.check_output_limit("max_output_bytes", 5) == 5
    for bad in (-1, True, 1.0, None):
        with pytest.raises(InvalidArgumentError, match=r"max_output_bytes must be an int >= 0"):
            a.check_output_limit("max_output_bytes", bad)


# --- text, str, env --------------------------------------------------------------------


def test_text_refuses_nul_and_lone_surrogates_without_quoting_it() -> None:
    assert a.check_text("v", "") == ""
    assert a.check_text("v", "é 漢 \U0001f600") == "é 漢 \U0001f600"
    with pytest.raises(InvalidArgumentError) as info:
        a.check_text("password", "se\x00cret")
    assert "secret" not in str(info.value) and "password" in str(info.value)
    for surrogate in ("\ud800", "x\udfff"):
        with pytest.raises(InvalidArgumentError, match="lone surrogate"):
            a.check_text("v", surrogate)
    assert a.check_text("v", "\ud7ff\ue000") == "\ud7ff\ue000"  # just outside the range


def test_str_is_non_empty_and_none_only_where_allowed() -> None:
    assert a.check_str("cwd", None) is None
    assert a.check_str("cwd", "/w") == "/w"
    for bad in ("", 3, b"x"):
        with pytest.raises(InvalidArgumentError, match="non-empty str"):
            a.check_str("cwd", bad)
    with pytest.raises(InvalidArgumentError, match="non-empty str"):
        a.check_str("cwd", None, allow_none=False)
    with pytest.raises(InvalidArgumentError, match="NUL"):
        a.check_str("cwd", "a\x00")


def test_env_variables_take_portable_names() -> None:
    assert a.check_env(None) is None
    assert a.check_env({}) == {}
    assert a.check_env({"_A1": "v", "b": ""}) == {"_A1": "v", "b": ""}
    for name in ("1A", "A-B", "", "A B", "é", "A\n"):
        with pytest.raises(InvalidArgumentError, match="invalid variable name"):
            a.check_env({name: "v"})
    with pytest.raises(InvalidArgumentError, match="invalid variable name"):
        a.check_env({1: "v"})


def test_env_labels_take_any_name_without_equals() -> None:
    labels = {"my label.x/y": "v", "1": "w"}
    assert a.check_env(labels, name="labels", variables=False) == labels
    for bad in ("", "a=b", "a\x00", "\udc80", 3):
        with pytest.raises(InvalidArgumentError) as info:
            a.check_env({bad: "v"}, name="labels", variables=False)
        assert str(info.value).startswith("labels has an invalid name")


def test_env_values_are_str_without_nul_and_never_quoted() -> None:
    with pytest.raises(InvalidArgumentError) as info:
        a.check_env({"TOKEN": 5})
    assert str(info.value) == "env['TOKEN'] must be a str, not int"
    with pytest.raises(InvalidArgumentError) as info:
        a.check_env({"TOKEN": "hunter2\x00"})
    assert "hunter2" not in str(info.value)
    with pytest.raises(InvalidArgumentError) as info:
        a.check_env([("A", "b")])
    assert str(info.value) == "env must be a mapping of variable names to str values, not list"
    with pytest.raises(InvalidArgumentError, match=r"^labels must be a mapping"):
        a.check_env("x", name="labels")


# --- to_input_bytes -------------------------------------------------------------------


def test_input_bytes() -> None:
    assert a.to_input_bytes("é\r") == "é\r".encode()
    assert a.to_input_bytes(b"\xff") == b"\xff"
    assert a.to_input_bytes(bytearray(b"ab")) == b"ab"
    assert type(a.to_input_bytes(bytearray(b"ab"))) is bytes
    assert a.to_input_bytes("\udcff") == b"\xff"  # surrogateescape stands for the byte
    with pytest.raises(InvalidArgumentError, match="lone surrogate"):
        a.to_input_bytes("\ud800")
    with pytest.raises(InvalidArgumentError, match="chars must be str or bytes, not int"):
        a.to_input_bytes(3)  # type: ignore[arg-type]


# --- build_command --------------------------------------------------------------------


def test_argv_commands() -> None:
    spec = a.build_command(["echo", "a b"], shell=False, env={"A": "1"}, cwd="/w")
    assert spec == CommandSpec(
        argv=("echo", "a b"),
        shell_command="echo 'a b'",
        display="echo 'a b'",
        shell=False,
        env={"A": "1"},
        cwd="/w",
    )


def test_shell_commands_one_string_or_quoted_parts() -> None:
    one = a.build_command(["echo $HOME | wc"], shell=True, env=None, cwd=None)
    assert one.argv == ("sh", "-c", "echo $HOME | wc")
    assert (one.shell_command, one.display, one.shell) == ("echo $HOME | wc",) * 2 + (True,)
    assert one.env is None and one.cwd is None
    several = a.build_command(["printf", "%s", "a b"], shell=True, env=None, cwd="")
    assert several.argv == ("sh", "-c", "printf %s 'a b'")
    assert several.cwd is None  # "" is the default directory


@pytest.mark.parametrize(
    ("command", "shell", "message"),
    [
        ([], False, "a command is required"),
        ([], True, "a command is required"),
        ([" \t"], True, "the command is empty"),
        ([""], False, "the program name is empty"),
        (["ls", 3], False, "command parts must be str, not int"),
        (["ls", "a\x00"], False, "a command part must not contain NUL"),
    ],
)
def test_bad_commands(command: list[object], shell: bool, message: str) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        a.build_command(command, shell=shell, env=None, cwd=None)  # type: ignore[arg-type]
    assert str(info.value).startswith(message)


def test_bad_cwd_and_env_in_a_command() -> None:
    with pytest.raises(InvalidArgumentError, match="cwd must be a str, not bytes"):
        a.build_command(["ls"], shell=False, env=None, cwd=b"/w")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="cwd must not contain NUL"):
        a.build_command(["ls"], shell=False, env=None, cwd="/w\x00")
    with pytest.raises(InvalidArgumentError, match="invalid variable name"):
        a.build_command(["ls"], shell=False, env={"1": "x"}, cwd=None)


def test_a_shell_command_of_one_empty_part_and_one_real_part() -> None:
    spec = a.build_command(["", "x"], shell=True, env=None, cwd=None)
    assert spec.argv == ("sh", "-c", "'' x")


def test_an_empty_program_name_is_refused_even_with_arguments() -> None:
    with pytest.raises(InvalidArgumentError, match="the program name is empty"):
        a.build_command(["", "x"], shell=False, env=None, cwd=None)
