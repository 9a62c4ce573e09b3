"""Guidance (issue 34, item 6): a misspelt option is named with its closest valid one,
the CLI speaks its own spelling (flags, `--opt name=value`), `cp` into a sandbox that
would be deleted at once is refused, `sandbox backends` probes what really works and says
why not, a fork the process limit refused gets a note, and `--help` speaks to users."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

import sandbox
from sandbox.backends.unix_local import cgroup_limits
from sandbox.errors import InvalidArgumentError

SANDBOX = [sys.executable, "-m", "sandbox.cli"]


def run_cli(
    *args: str, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*SANDBOX, *args], capture_output=True, text=True, timeout=timeout, env=env
    )


def _options_listed(message: str) -> list[str]:
    listed = re.search(r"\(its options: ([^)]*)\)", message)
    assert listed is not None, message
    return listed.group(1).split(", ")


# ---- 1. unknown options ----------------------------------------------------------------


def test_a_misspelt_option_names_the_closest_valid_one_and_all_of_them(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgumentError) as caught:
        sandbox.open_session("unix_local", workdri=str(tmp_path))
    message = str(caught.value)
    assert message.startswith("unknown option 'workdri' for the unix_local backend; ")
    assert "did you mean 'workdir'?" in message
    listed = _options_listed(message)
    assert listed == sorted(listed)
    # The backend's own options and the base session's, read from the signatures.
    assert {"workdir", "confine", "process_limit", "max_processes", "ref_file"} <= set(listed)
    assert "unexpected keyword" not in message


def test_an_option_far_from_every_name_gets_no_suggestion() -> None:
    with pytest.raises(InvalidArgumentError) as caught:
        sandbox.open_session("docker", zzzqqq=1)
    message = str(caught.value)
    assert message.startswith("unknown option 'zzzqqq' for the docker backend (its options: ")
    assert "did you mean" not in message
    assert {"image", "container", "pull", "keep"} <= set(_options_listed(message))


async def test_resume_names_a_misspelt_option_the_same_way(tmp_path: Path) -> None:
    session = sandbox.open_session("unix_local", workdir=str(tmp_path))
    await session.start()
    ref = await session.detach()
    with pytest.raises(InvalidArgumentError) as caught:
        sandbox.resume_session(ref, terminate_grace=2.0)
    message = str(caught.value)
    assert message.startswith("unknown option 'terminate_grace' for the unix_local backend; ")
    assert "did you mean 'terminate_grace_s'?" in message
    async with sandbox.resume_session(ref):
        pass  # resumed and closed: nothing left running


# ---- 2. the CLI's spelling -------------------------------------------------------------


def test_cli_suggests_the_flag_for_a_misspelt_option(tmp_path: Path) -> None:
    out = run_cli("run", "--opt", f"workdri={tmp_path}", "--", "true")
    assert out.returncode == 2, out.stderr
    assert "unknown option 'workdri' for the unix_local backend; did you mean --workdir?" in (
        out.stderr
    )
    assert out.stderr.count("\n") == 1


@pytest.mark.parametrize("command", ["run", "shell", "mcp"])
def test_an_earlier_flag_is_a_usage_error_naming_the_new_one(command: str, tmp_path: Path) -> None:
    out = run_cli(command, "--workspace", str(tmp_path), *(["--", "true"] * (command == "run")))
    assert out.returncode == 2 and "--workspace is now --workdir" in out.stderr, out.stderr


def test_an_earlier_option_name_is_a_usage_error_naming_the_new_one() -> None:
    out = run_cli("run", "--backend", "docker", "--opt", "keep_container=true", "--", "true")
    assert out.returncode == 2, out.stderr
    assert "keep_container= is now --opt keep=" in out.stderr, out.stderr


def test_cli_names_options_by_their_flags() -> None:
    out = run_cli("run", "--backend", "docker", "--", "true")
    assert out.returncode == 2, out.stderr
    assert "needs exactly one of --image (start a fresh container) or --container (" in (out.stderr)
    assert "image=" not in out.stderr and "container=" not in out.stderr


@pytest.mark.skipif(
    subprocess.run(["docker", "info"], capture_output=True).returncode != 0,
    reason="needs a Docker engine",
)
def test_cli_says_opt_pull_true_where_the_library_says_pull_true() -> None:
    image = "sandbox-guidance-test-no-such-image:never"
    out = run_cli("run", "--backend", "docker", "--image", image, "--", "true")
    assert out.returncode == 1, out.stderr
    assert "pull or build it first, or pass --opt pull=true" in out.stderr
    assert "pull=True" not in out.stderr


def test_cli_message_spells_values_flags_and_bare_names() -> None:
    from sandbox.cli.spelling import cli_message

    sandbox.backends.load_backend("docker")  # the backend in use: its options are known
    assert cli_message("pass api_url='tcp://h:1' to resume it") == (
        "pass --opt api_url=tcp://h:1 to resume it"
    )
    assert cli_message("with ports=[8080] on a bridge") == "with --opt ports=[8080] on a bridge"
    assert cli_message("memory_limit_bytes needs the cgroup") == "--memory-limit needs the cgroup"
    assert cli_message("give image='alpine' or confine=True") == (
        "give --image alpine or --confine"
    )
    # Not an option of a session (an argument of a call): left as the library said it.
    assert cli_message("(pass recursive=True)") == "(pass recursive=True)"


# ---- 3. cp into a throwaway sandbox ----------------------------------------------------


def test_cp_into_a_fresh_sandbox_is_refused_with_what_to_do(tmp_path: Path) -> None:
    source = tmp_path / "f"
    source.write_text("data")
    out = run_cli("cp", str(source), ":f")
    assert out.returncode == 2, out.stderr
    assert out.stderr.count("\n") == 1, out.stderr
    assert "`sandbox open > ref.json`" in out.stderr
    assert "`sandbox cp --session ref.json SRC :DST`" in out.stderr
    assert "--workdir DIR" in out.stderr


def test_cp_into_a_workspace_that_stays_still_copies(tmp_path: Path) -> None:
    source = tmp_path / "f"
    source.write_text("data")
    workspace = tmp_path / "ws"
    out = run_cli("cp", "--workdir", str(workspace), str(source), ":f")
    assert out.returncode == 0, out.stderr
    assert (workspace / "f").read_text() == "data"


# ---- 4. sandbox backends ---------------------------------------------------------------


def _unix_local_notes(env: dict[str, str] | None = None) -> str:
    out = run_cli("backends", env=env)
    assert out.returncode == 0, out.stderr
    return next(line for line in out.stdout.splitlines() if line.startswith("unix_local"))


def test_backends_says_whether_the_native_extension_is_in_use() -> None:
    notes = _unix_local_notes(dict(os.environ, SANDBOX_NO_EXTENSIONS="1"))
    assert (
        "native extension (clone3 start helper): not in use (SANDBOX_NO_EXTENSIONS is set): "
        "processes start through the slower Popen path"
    ) in notes
    env = {key: value for key, value in os.environ.items() if key != "SANDBOX_NO_EXTENSIONS"}
    notes = _unix_local_notes(env)
    if importlib.util.find_spec("sandbox._native._spawn") is not None:
        assert "native extension (clone3 start helper): in use" in notes
    else:
        assert "not in use (not built at install time" in notes


async def test_backends_reports_the_limits_a_session_really_gets(tmp_path: Path) -> None:
    notes = _unix_local_notes()
    wanted = {"memory_limit_bytes": 1 << 30, "process_limit": 512, "cpu_limit": 1.0}
    for option, value in wanted.items():
        try:
            async with sandbox.open_session(
                "unix_local", workdir=str(tmp_path), **{option: value}
            ) as session:
                how = session.limits_enforced[option]
        except sandbox.UnsupportedOperationError:
            assert f"{option} unusable (" in notes
        else:
            assert f"{option} ({how})" in notes


def _nobody_can_run_python() -> bool:
    if os.geteuid() != 0:
        return False
    probe = subprocess.run(
        # Importing the package, not only starting Python: a checkout in a private
        # folder (`mktemp -d` makes it 0700) is out of nobody's reach.
        [
            "setpriv",
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            sys.executable,
            "-c",
            "import sandbox.cli",
        ],
        capture_output=True,
    )
    return probe.returncode == 0


@pytest.mark.skipif(
    not _nobody_can_run_python(),
    reason="needs root, and a Python and a checkout that nobody (uid 65534) can read",
)
def test_backends_as_a_user_without_cgroup_rights_says_why_not() -> None:
    # Not under tmp_path: pytest's folder is root's alone, and this home is nobody's.
    with tempfile.TemporaryDirectory() as home:
        os.chown(home, 65534, 65534)
        out = subprocess.run(
            ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *SANDBOX, "backends"],
            capture_output=True,
            text=True,
            env=dict(os.environ, HOME=home),
            timeout=120,
        )
    assert out.returncode == 0, out.stderr
    notes = next(line for line in out.stdout.splitlines() if line.startswith("unix_local"))
    assert "memory_limit_bytes unusable (" in notes
    assert "run in a delegated cgroup" in notes


# ---- 5. the process limit's note -------------------------------------------------------

needs_pids = pytest.mark.skipif(
    cgroup_limits.support()["process_limit"] is None, reason="no pids controller we may use"
)


@needs_pids
async def test_a_fork_the_process_limit_refused_gets_a_note(tmp_path: Path) -> None:
    async with sandbox.open_session(
        "unix_local", workdir=str(tmp_path), process_limit=4
    ) as session:
        result = await session.exec("for i in 1 2 3 4 5 6 7 8; do sleep 5 & done; wait")
        assert result.exit_code != 0
        assert b"[sandbox: the session's process limit (process_limit) refused a new process]" in (
            result.stderr
        )
        # The counter is read once per exit: a later failure of its own gets no note.
        again = await session.exec("exit 3")
        assert again.exit_code == 3 and b"process limit" not in again.stderr


# ---- 6. help ---------------------------------------------------------------------------


def test_help_speaks_to_users_and_lists_every_command() -> None:
    out = run_cli("--help")
    assert out.returncode == 0
    for internal in ("EXIT_", "std_streams", "`signals`", "The `sandbox` command:"):
        assert internal not in out.stdout
    listed = re.findall(r"^    (\w+) ", out.stdout, re.MULTILINE)
    assert listed == ["run", "shell", "open", "close", "cp", "backends", "demo", "mcp"]
    assert "124                --timeout elapsed" in out.stdout


def test_run_help_shows_the_default_backend() -> None:
    out = run_cli("run", "--help")
    assert "backend to use (default: unix_local)" in " ".join(out.stdout.split())


def test_backends_says_whether_the_runner_is_built_for_the_backends_that_use_it() -> None:
    from sandbox.cli.backends_report import RUNNER_BACKENDS, backend_rows, runner_note
    from sandbox.runner import runner_binary, unavailable_reason

    binary = runner_binary()
    notes = {name: row_notes for name, _, _, row_notes in backend_rows()}
    for name in RUNNER_BACKENDS:
        assert name in RUNNER_BACKENDS
        if binary is not None:
            assert (
                f"runner: built ({binary.size // 1024} KiB, sha256 {binary.sha256[:12]})"
                in (notes[name])
            )
        else:
            assert "the runner is not available, per-exec path" in notes[name]
            assert str(unavailable_reason()).removeprefix("runner: ") in notes[name]
    # Every backend can use it; a name that is no backend of the runner's says nothing.
    assert set(RUNNER_BACKENDS) == set(notes)
    assert runner_note("no-such-backend") == ""
