"""The shell toolkit (sandbox.backends.toolkit.shell): its pure helpers (tags, the
wrapper's argv, the kill scripts' arguments, quoting and the kill report), then its
scripts against the real shells a provider may hand us.

Each script case runs the wrapper (and the kill scripts) locally, as a session leader (as a
Docker exec is), with the shell under test installed as `sh` first on PATH: dash, bash,
busybox ash, zsh and mksh (busybox also provides grep, sleep, setsid and env there, as
in a busybox image). Assertions: exit statuses, output without the waiting shell's
"Killed"/"Terminated" notices, and that no tagged process is left (/proc).
"""

from __future__ import annotations

import contextlib
import os
import select
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from sandbox.backends.toolkit import shell
from sandbox.testing import procfs
from tests.conftest import skip_or_fail

# ---- the pure helpers -----------------------------------------------------------------


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


def test_argv_builders_check_what_they_splice() -> None:
    tag = shell.new_tag()
    assert len(tag) == 32
    argv = shell.wrapper_argv(tag, ["echo", "hi"], rows=24, cols=80)
    assert argv[:2] == ["env", f"{shell.TAG_VARIABLE}={tag}"]
    assert argv[-4:] == ["24", "80", "echo", "hi"]
    assert shell.wrapper_argv(tag, ["x"], set_tag=False)[:2] == ["sh", "-c"]
    assert shell.tag_environment(tag) == {shell.TAG_VARIABLE: tag}
    for bad in ("", "short", "has space 12345", "$(reboot)12345", "x" * 65):
        with pytest.raises(ValueError):
            shell.check_tag(bad)
    with pytest.raises(ValueError):
        shell.wrapper_argv(tag, [])
    with pytest.raises(ValueError):
        shell.wrapper_argv(tag, ["x"], rows=24)
    with pytest.raises(ValueError):
        shell.kill_script([], ticks=1)
    with pytest.raises(ValueError):
        shell.kill_script([tag], ticks=-1)
    assert shell.kill_script([tag, tag], ticks=3)[-4:] == ["term", "3", tag, tag]
    assert shell.interrupt_script([tag])[-3:] == ["int", "0", tag]
    assert shell.grace_ticks(1.0) == 20 and shell.grace_ticks(0) == 0
    assert shell.command_line(["sh", "-c", "echo 'a b'"]) == "sh -c 'echo '\"'\"'a b'\"'\"''"
    assert shell.parse_kill_report("noise\nsandbox-kill: done\n") == "done"
    assert shell.parse_kill_report("sh: grep: not found") is None


# ---- the scripts in real shells --------------------------------------------------------

SHELLS = ("dash", "bash", "busybox", "zsh", "mksh")
BUSYBOX_TOOLS = ("grep", "sleep", "setsid", "env", "stty")
TIMEOUT_S = 10.0


@pytest.fixture(params=SHELLS)
def sh_path(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A PATH whose `sh` is the shell under test (skips, or fails in CI, when missing)."""
    name: str = request.param
    binary = shutil.which(name)
    if binary is None:
        skip_or_fail(f"{name} is not installed (scripts/system-deps.sh installs it)")
    assert binary is not None
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sh").symlink_to(binary)
    if name == "busybox":
        for tool in BUSYBOX_TOOLS:
            (bin_dir / tool).symlink_to(binary)
    return f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '/usr/bin:/bin')}"


def environment(path: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != shell.TAG_VARIABLE}
    env["PATH"] = path
    return env


# A command that says it is ready once it runs as itself (a shell that prints `$$`
# before `exec sleep` may get a signal while still the shell, and bash, zsh and busybox
# ash ignore SIGQUIT in themselves), with every signal at its default.
PAUSE = [
    sys.executable,
    "-c",
    "import os, signal; signal.signal(signal.SIGINT, signal.SIG_DFL); "
    "print(os.getpid(), flush=True); signal.pause()",
]


def start(
    path: str, tag: str, command: str | list[str], **kwargs: object
) -> subprocess.Popen[bytes]:
    """The wrapper running `command` (a list: as is; a str: `sh -c command`), as a
    session leader, tagged with `tag`."""
    argv = ["sh", "-c", command] if isinstance(command, str) else command
    return subprocess.Popen(
        shell.wrapper_argv(tag, argv),
        env=environment(path),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
        **kwargs,  # type: ignore[call-overload]
    )


def run_script(path: str, argv: Sequence[str]) -> str:
    """Run a kill/interrupt script in a session of its own; its report."""
    done = subprocess.run(
        argv,
        env=environment(path),
        capture_output=True,
        start_new_session=True,
        timeout=TIMEOUT_S,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    report = shell.parse_kill_report(done.stdout.decode())
    assert report is not None, done.stdout
    return report


def read_line(proc: subprocess.Popen[bytes]) -> str:
    assert proc.stdout is not None
    return proc.stdout.readline().decode().strip()


def finish(proc: subprocess.Popen[bytes]) -> tuple[int, bytes, bytes]:
    out, err = proc.communicate(timeout=TIMEOUT_S)
    return proc.returncode, out, err


def tagged_pids(tag: str) -> list[int]:
    """Live (non-zombie) processes whose environment carries `tag`."""
    return procfs.pids_with_env(shell.TAG_VARIABLE, tag)


def zombie(pid: int) -> bool:
    return not procfs.alive(pid)


def foreground_sleep(tag: str, timeout: float = TIMEOUT_S) -> bool:
    """Whether a tagged `sleep` runs (its exec done) within `timeout`: nothing signals
    an exec, so /proc is looked at every few milliseconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for pid in tagged_pids(tag):
            with contextlib.suppress(OSError):
                if Path(f"/proc/{pid}/comm").read_text().strip() == "sleep":
                    return True
        time.sleep(0.005)
    return False


def wait_gone(pid: int, timeout: float = TIMEOUT_S) -> bool:
    """Wait (on a pidfd: an event, not a poll loop) until `pid` has exited."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        return bool(poller.poll(timeout * 1000))
    finally:
        os.close(fd)


@contextlib.contextmanager
def cleanup(*procs: subprocess.Popen[bytes]) -> Iterator[None]:
    """Kill whatever a failed case leaves (the whole session of each wrapper)."""
    try:
        yield
    finally:
        for proc in procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate(timeout=TIMEOUT_S)


# ---- the wrapper ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("command", "expected"),
    [
        ("exit 3", 3),
        ("kill -TERM $$", 128 + signal.SIGTERM),
        ("kill -9 $$", 128 + signal.SIGKILL),
        ("kill -INT $$", 128 + signal.SIGINT),
    ],
    ids=["exit-3", "term-self", "kill-9-self", "int-self"],
)
def test_exit_status_and_no_notice(sh_path: str, command: str, expected: int) -> None:
    tag = shell.new_tag()
    proc = start(sh_path, tag, command)
    with cleanup(proc):
        code, out, err = finish(proc)
    assert (code, out, err) == (expected, b"", b"")
    assert tagged_pids(tag) == []


def test_a_child_killed_by_sigint_is_the_commands_business(sh_path: str) -> None:
    # Only the child got SIGINT: the command goes on and sees 130 for it.
    tag = shell.new_tag()
    proc = start(sh_path, tag, "sh -c 'kill -INT $$'; echo after=$?; exit 4")
    with cleanup(proc):
        code, out, _ = finish(proc)
    assert (code, out) == (4, b"after=130\n")


def test_output_is_kept_apart(sh_path: str) -> None:
    tag = shell.new_tag()
    proc = start(sh_path, tag, "echo out; echo err >&2; printf 'no newline'; exit 5")
    with cleanup(proc):
        assert finish(proc) == (5, b"out\nno newline", b"err\n")


# (No `kill -QUIT $$`: bash, zsh and busybox ash ignore SIGQUIT in themselves.)
@pytest.mark.parametrize(
    "signum", [signal.SIGKILL, signal.SIGTERM, signal.SIGSEGV, signal.SIGQUIT, signal.SIGINT]
)
def test_killed_from_outside_reports_128_plus_n_without_notice(
    sh_path: str, signum: signal.Signals
) -> None:
    tag = shell.new_tag()
    proc = start(sh_path, tag, PAUSE)
    with cleanup(proc):
        os.kill(int(read_line(proc)), signum)
        code, out, err = finish(proc)
    assert (code, out, err) == (128 + signum, b"", b"")


def test_the_wrapper_sweeps_leftovers_when_the_command_exits(sh_path: str) -> None:
    tag = shell.new_tag()
    # The escaped child reports its pid only once it runs in its own session: the
    # command must not exit (and the wrapper sweep) before its setsid() happened.
    proc = start(
        sh_path,
        tag,
        "sleep 1000 & echo $!; f=$(mktemp -u); "
        'setsid sh -c \'echo $$ >"$0"; exec sleep 1000\' "$f" & '
        'while [ ! -s "$f" ]; do sleep 0.01; done; cat "$f"; rm -f "$f"; exit 4',
    )
    with cleanup(proc):
        background = int(read_line(proc))
        escaped = int(read_line(proc))
        assert proc.wait(timeout=TIMEOUT_S) == 4
        assert wait_gone(background)
        # The setsid child left the wrapper's session (it holds the output open): that
        # one is the kill script's business.
        assert tagged_pids(tag) == [escaped]
        assert run_script(sh_path, shell.kill_script([tag], ticks=0)) == "done"
        _, _, err = finish(proc)
    assert err == b""
    assert tagged_pids(tag) == []


# ---- interrupt -----------------------------------------------------------------------


def test_interrupt_kills_a_plain_command_with_sigint(sh_path: str) -> None:
    tag = shell.new_tag()
    proc = start(sh_path, tag, PAUSE)
    with cleanup(proc):
        read_line(proc)
        assert run_script(sh_path, shell.interrupt_script([tag])) == str(proc.pid)
        code, out, err = finish(proc)
    assert (code, out, err) == (128 + signal.SIGINT, b"", b"")
    assert tagged_pids(tag) == []


def test_interrupt_reaches_the_commands_trap_and_its_foreground_child(sh_path: str) -> None:
    tag = shell.new_tag()
    command = 'trap "echo got-int; exit 7" INT; echo ready; while :; do sleep 1000; done'
    proc = start(sh_path, tag, command)
    with cleanup(proc):
        assert read_line(proc) == "ready"
        # Interrupted between its fork and the exec of sleep, the child is still a copy
        # of the shell, trap included, and would answer too: wait for the sleep itself.
        assert foreground_sleep(tag), "the shell never started its foreground sleep"
        run_script(sh_path, shell.interrupt_script([tag]))
        code, out, err = finish(proc)
    assert (code, out, err) == (7, b"got-int\n", b"")
    assert tagged_pids(tag) == []


def test_interrupt_of_nothing_reports_none(sh_path: str) -> None:
    assert run_script(sh_path, shell.interrupt_script([shell.new_tag()])) == "none"


# ---- tree kill -----------------------------------------------------------------------

TREE = (
    "sleep 1000 & echo $!; "  # a background job
    "setsid sleep 1000 & echo $!; "  # a child in a session of its own (still tagged)
    "env -i setsid sleep 1000 & echo $!; "  # ... with its environment scrubbed too
    "(sleep 1000 & echo $!); "  # a double fork: an orphan
    "echo ready; wait"
)


def test_kill_finds_the_whole_tree(sh_path: str) -> None:
    tag = shell.new_tag()
    proc = start(sh_path, tag, TREE)
    with cleanup(proc):
        pids = [int(read_line(proc)) for _ in range(4)]
        assert read_line(proc) == "ready"
        assert run_script(sh_path, shell.kill_script([tag], ticks=shell.grace_ticks(1.0))) == (
            "done"
        )
        finish(proc)
    assert all(wait_gone(pid, 0) for pid in [proc.pid, *pids])
    assert tagged_pids(tag) == []


def test_kill_escalates_to_sigkill_after_the_grace(sh_path: str) -> None:
    tag = shell.new_tag()
    # Ignored dispositions survive exec: only SIGKILL ends this sleep.
    proc = start(sh_path, tag, 'trap "" HUP TERM; echo $$; exec sleep 1000')
    with cleanup(proc):
        pid = int(read_line(proc))
        assert run_script(sh_path, shell.kill_script([tag], ticks=2)) == "done"
        code, _, err = finish(proc)
    assert wait_gone(pid, 0)
    assert tagged_pids(tag) == []
    # The wrapper did not report success. How it ended is the shell's own, and under
    # load it varies: dying of a signal, 128+N for its child (mksh), or zsh's HUP handler
    # exiting with the signal's number.
    assert code != 0 and err == b"", (code, err)


def test_kills_requested_together_are_one_script(sh_path: str) -> None:
    tags = [shell.new_tag() for _ in range(3)]
    procs = [start(sh_path, tag, "echo ready; sleep 1000 & wait") for tag in tags]
    bystander = start(sh_path, shell.new_tag(), "echo ready; exec sleep 1000")
    with cleanup(*procs, bystander):
        for proc in [*procs, bystander]:
            assert read_line(proc) == "ready"
        assert run_script(sh_path, shell.kill_script(tags, ticks=20)) == "done"
        for proc in procs:
            finish(proc)
        assert all(tagged_pids(tag) == [] for tag in tags)
        assert bystander.poll() is None  # another tag: untouched


def test_a_session_led_by_an_untagged_process_is_spared(sh_path: str) -> None:
    # A provider's daemon that started the wrapper without a session of its own: the
    # wrapper's tree goes, the daemon (its session's untagged leader) stays.
    tag = shell.new_tag()
    inner = shell.wrapper_argv(tag, ["sh", "-c", "echo ready; exec sleep 1000"])
    daemon = subprocess.Popen(
        ["sh", "-c", '"$@"; echo daemon-alive; exec sleep 1000', "daemon", *inner],
        env=environment(sh_path),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    with cleanup(daemon):
        assert read_line(daemon) == "ready"
        assert run_script(sh_path, shell.kill_script([tag], ticks=20)) == "done"
        assert read_line(daemon) == "daemon-alive"
        assert daemon.poll() is None
    assert tagged_pids(tag) == []


def test_running_tags_keeps_only_running_processes_with_a_safe_tag() -> None:
    """A ref is caller data: only a running process's tag that the kill script accepts
    may reach it (no missing, non-string or pattern-breaking tag)."""
    from sandbox.backend import ProcessRef
    from sandbox.backends.toolkit import running_tags

    def ref(pid: int, running: bool, tag: object) -> ProcessRef:
        handle = {} if tag is None else {"tag": tag}
        return ProcessRef(
            process_id=pid, command="sleep 1", tty=False, running=running, handle=handle
        )

    good = "a" * 32
    refs = [
        ref(1, True, good),
        ref(2, False, "b" * 32),
        ref(3, True, None),
        ref(4, True, 12345678),
        ref(5, True, "x|y*" + "c" * 10),
        ref(6, True, "short"),
    ]
    assert running_tags(refs) == [good]
