"""The toolkit's pure shell helpers (sandbox.backends.toolkit.shell): tags, the wrapper's
argv, the kill scripts' arguments, quoting and the kill report."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys

import pytest

from sandbox.backends.toolkit import shell


def test_new_tags_are_random_and_valid() -> None:
    tags = {shell.new_tag() for _ in range(50)}
    assert len(tags) == 50
    for tag in tags:
        assert len(tag) == 32
        assert shell.check_tag(tag) == tag


@pytest.mark.parametrize("tag", ["a" * 8, "Z" * 64, "0123abcdXYZ"])
def test_tags_of_8_to_64_letters_or_digits(tag: str) -> None:
    assert shell.check_tag(tag) == tag


@pytest.mark.parametrize(
    "bad", ["a" * 7, "a" * 65, "abcdefg-", "abcdefgh\n", "", "é" * 8, 12345678]
)
def test_other_tags_are_refused(bad: object) -> None:
    with pytest.raises(ValueError, match="8 to 64 letters or digits"):
        shell.check_tag(bad)  # type: ignore[arg-type]


def test_tag_environment() -> None:
    assert shell.tag_environment("abcdefgh") == {"SANDBOX_PROCESS_TAG": "abcdefgh"}
    with pytest.raises(ValueError):
        shell.tag_environment("bad tag")


def test_wrapper_argv_without_a_terminal() -> None:
    argv = shell.wrapper_argv("abcdefgh", ["echo", "a b"])
    assert argv == [
        "env",
        "SANDBOX_PROCESS_TAG=abcdefgh",
        "sh",
        "-c",
        shell.WRAPPER_SCRIPT,
        "sandbox-exec",
        "-",
        "-",
        "echo",
        "a b",
    ]


def test_wrapper_argv_with_a_terminal_and_no_env_program() -> None:
    argv = shell.wrapper_argv("abcdefgh", ["vi"], rows=24, cols=80, set_tag=False)
    assert argv == ["sh", "-c", shell.WRAPPER_SCRIPT, "sandbox-exec", "24", "80", "vi"]
    assert shell.wrapper_argv("abcdefgh", ["vi"], rows=1, cols=1)[-3:] == ["1", "1", "vi"]


def test_wrapper_argv_refuses_bad_input() -> None:
    with pytest.raises(ValueError, match="at least one argument"):
        shell.wrapper_argv("abcdefgh", [])
    with pytest.raises(ValueError, match="both rows and cols"):
        shell.wrapper_argv("abcdefgh", ["vi"], rows=24)
    with pytest.raises(ValueError, match="both rows and cols"):
        shell.wrapper_argv("abcdefgh", ["vi"], cols=80)
    with pytest.raises(ValueError, match="letters or digits"):
        shell.wrapper_argv("bad", ["vi"])


@pytest.mark.parametrize(
    ("grace", "ticks"), [(0, 0), (-1, 0), (0.05, 1), (0.051, 2), (0.1, 2), (1, 20), (0.01, 1)]
)
def test_grace_ticks_round_up(grace: float, ticks: int) -> None:
    assert shell.KILL_TICK_S == 0.05
    assert shell.grace_ticks(grace) == ticks


def test_kill_and_interrupt_scripts() -> None:
    tags = ["abcdefgh", "ijklmnop"]
    assert shell.kill_script(tags, ticks=3) == [
        "sh",
        "-c",
        shell.KILL_SCRIPT,
        "sandbox-kill",
        "term",
        "3",
        *tags,
    ]
    assert shell.kill_script(iter(tags), ticks=0)[5:] == ["0", *tags]
    assert shell.interrupt_script(tags) == [
        "sh",
        "-c",
        shell.KILL_SCRIPT,
        "sandbox-kill",
        "int",
        "0",
        *tags,
    ]


@pytest.mark.parametrize("ticks", [-1, True, 1.0, "2"])
def test_kill_script_refuses_bad_ticks(ticks: object) -> None:
    with pytest.raises(ValueError, match="ticks must be an int >= 0"):
        shell.kill_script(["abcdefgh"], ticks=ticks)  # type: ignore[arg-type]


def test_kill_scripts_need_valid_tags() -> None:
    with pytest.raises(ValueError, match="at least one tag"):
        shell.kill_script([], ticks=0)
    with pytest.raises(ValueError, match="at least one tag"):
        shell.interrupt_script([])
    with pytest.raises(ValueError, match="letters or digits"):
        shell.kill_script(["abcdefgh", "x;rm"], ticks=0)


@pytest.mark.parametrize(
    "argv", [["echo", "a b"], ["printf", "%s\n", "it's"], ["x", ""], ["$HOME", "`id`", 'a"b']]
)
def test_command_line_round_trips_through_a_shell_lexer(argv: list[str]) -> None:
    line = shell.command_line(argv)
    assert shlex.split(line) == argv
    assert "\n" not in line or "'" in line


def test_command_line_quotes_exactly() -> None:
    assert shell.command_line(["echo", "a b"]) == "echo 'a b'"
    assert shell.command_line(["printf", "it's"]) == "printf 'it'\"'\"'s'"
    assert shell.command_line(["x", ""]) == "x ''"
    assert shell.command_line(["ls", "-l"]) == "ls -l"  # safe words stay bare


# What a real shell must hand back intact: blanks, quotes, expansions, globs, operators,
# a newline, an empty word, a leading dash and a non-ASCII word.
_HOSTILE_WORDS = [
    "a b",
    "it's",
    'say "hi"',
    "$HOME",
    "`id`",
    "$(id)",
    "*",
    "~",
    "a;b|c&d>e<f",
    "line\nnext",
    "",
    "-n",
    "tab\there",
    "back\\slash",
    "caf\u00e9",
    "!x",
]


def test_command_line_reaches_a_real_shell_byte_for_byte() -> None:
    # The program prints its arguments NUL-separated, so the test sees the exact words
    # `sh -c` handed it, not a second lexer's opinion of them.
    echo_args = (
        "import os, sys; sys.stdout.buffer.write(b'\\0'.join(map(os.fsencode, sys.argv[1:])))"
    )
    line = shell.command_line([sys.executable, "-c", echo_args, *_HOSTILE_WORDS])
    done = subprocess.run(["sh", "-c", line], capture_output=True, check=True, cwd="/")
    assert done.stdout.split(b"\0") == [os.fsencode(word) for word in _HOSTILE_WORDS]
    assert done.stderr == b""


def test_kill_report_parsing() -> None:
    assert shell.parse_kill_report("sandbox-kill:done\n") == "done"
    assert shell.parse_kill_report("noise\nsandbox-kill: 12 34 \n") == "12 34"
    assert shell.parse_kill_report("sandbox-kill:none") == "none"
    # The last report counts (an earlier line could be the command's own output).
    assert shell.parse_kill_report("sandbox-kill:fake\nsandbox-kill:done\n") == "done"
    assert shell.parse_kill_report("") is None
    assert shell.parse_kill_report("killed\n") is None
    assert shell.parse_kill_report("sandbox-kill:") == ""


def test_wrapper_argv_passes_a_zero_size_through() -> None:
    # `cols or 0` only guards None: a given 0 stays 0 (stty reports it, not us).
    assert shell.wrapper_argv("abcdefgh", ["vi"], rows=5, cols=0)[-3:] == ["5", "0", "vi"]
