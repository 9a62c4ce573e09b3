"""The flow every live provider suite runs, written once against the public API.

A provider's suite (`test_<provider>_live.py`) keeps only what is its own:

- a `Requirements`: the modules and credential variables it needs, and the skip reason
  it gives when they are missing;
- its `live` fixture, made by `live_session(requirements, open_session)`: ONE sandbox for
  the whole module, started once and always closed (deleted) at the end;
- a `LiveSuite` subclass (named `Test...`, so pytest collects it). It inherits the common
  tests below, sets the class attributes where the provider differs (which exit codes it
  reports, whether it can resize, how it kills trees), and adds its own tests.

The process checks look into the sandbox's /proc through `exec` (with the shell, `tr` and
nothing else, so they work in minimal images); every test marks its processes with a
`sleep` argument nobody else uses.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pytest
import pytest_asyncio

import sandbox
from tests.helpers import unique_seconds

WINDOW_S = 20  # the collection window of a call expected to end early (exit or `until`)
SETTLE_S = 20  # how long processes may take to appear or (where they may lag) go


@dataclass(frozen=True)
class Requirements:
    """What the live suite of `provider` needs to run; `reason()` says why it cannot
    (the skip reason).

    `modules` maps each importable module to how the message names it, `extra` is the
    package extra that installs them; `env` lists the credential variables. A missing
    variable gives `"{unset}: set A and B to run {suite}"`, by default
    `"no <provider> credentials: set A and B to run the live <provider> suite"`.
    """

    provider: str
    extra: str
    modules: Mapping[str, str]
    env: Sequence[str]
    unset: str = ""
    suite: str = ""

    def reason(self) -> str | None:
        """Why the suite cannot run here, or None when it can."""
        for module, label in self.modules.items():
            if importlib.util.find_spec(module) is None:
                return f"{label} is not installed (pip install 'agent-sandbox-pty[{self.extra}]')"
        missing = [name for name in self.env if not os.environ.get(name)]
        if missing:
            unset = self.unset or f"no {self.provider} credentials"
            suite = self.suite or f"the live {self.provider} suite"
            return f"{unset}: set {' and '.join(missing)} to run {suite}"
        return None

    def skip_if_missing(self) -> None:
        """Skip the calling test (or fixture) with `reason()` when it is not None."""
        reason = self.reason()
        if reason:
            pytest.skip(reason)


def live_session(
    requirements: Requirements,
    open_session: Callable[[], sandbox.BaseSandboxSession],
    *,
    after_close: Callable[[str], Awaitable[None]] | None = None,
) -> Any:
    """The module-scoped `live` fixture of a suite: skips with the requirements' reason,
    else opens one session, starts it, and always closes it (which deletes its sandbox)
    once the module is done. `after_close(sandbox_id)` may then check that it is gone."""

    @pytest_asyncio.fixture(scope="module", loop_scope="module", name="live")
    async def live() -> AsyncIterator[sandbox.BaseSandboxSession]:
        requirements.skip_if_missing()
        session = open_session()
        sandbox_id: str | None = None
        try:
            await session.start()
            sandbox_id = getattr(session, "sandbox_id", None)
            yield session
        finally:
            await session.aclose()
            if after_close is not None and sandbox_id is not None:
                await after_close(sandbox_id)

    return live


async def sleepers(session: sandbox.BaseSandboxSession, mark: str) -> list[str]:
    """The command lines (NULs and newlines made spaces, stripped) of the sandbox's
    processes that mention `sleep <mark>`: the sleeps themselves and the shells running
    them. The pattern is split in two so the searching shell never matches itself."""
    script = (
        "for d in /proc/[0-9]*; do "
        "c=$(tr '\\000\\n' '  ' < \"$d/cmdline\" 2>/dev/null); "
        f'case "$c" in *"slee""p {mark}"*) echo "$c";; esac; '
        "done; true"
    )
    return [line.strip() for line in (await session.exec(script)).stdout.decode().splitlines()]


async def assert_sleeping(session: sandbox.BaseSandboxSession, mark: str, count: int) -> None:
    """Exactly `count` processes are `sleep <mark>` (not counting the shells that mention
    it) within `SETTLE_S`: a child started in the background may print nothing
    before it has exec'd `sleep`, so the first look can come too early."""
    deadline = time.monotonic() + SETTLE_S
    while (found := (await sleepers(session, mark)).count(f"sleep {mark}")) != count:
        assert time.monotonic() < deadline, f"{found} processes are `sleep {mark}`, not {count}"
        await asyncio.sleep(0.2)


async def assert_gone(session: sandbox.BaseSandboxSession, mark: str, *, at_once: bool) -> None:
    """Nothing mentioning `sleep <mark>` runs any more: right now if `at_once` (the
    provider's kill returns only when the tree is gone), else within `SETTLE_S`."""
    deadline = time.monotonic() + (0 if at_once else SETTLE_S)
    while left := await sleepers(session, mark):
        assert time.monotonic() < deadline, f"processes were left behind: {left}"
        await asyncio.sleep(0.2)


class LiveSuite:
    """The common tests. Subclasses set the class attributes where their provider
    differs (see the module docstring); every test uses the module's `live` session and
    leaves no process of its own running."""

    # `(command, exit code)` pairs run on a terminal and on pipes by `test_exit_codes`.
    exit_codes: tuple[tuple[str, int], ...] = (("true", 0), ("exit 3", 3), ("kill -9 $$", 137))
    can_resize = True  # else `pty_resize` must raise UnsupportedOperationError
    exec_timeout_s = 2.0
    exec_timeout_bound_s = 30.0  # how long the timed-out `exec` may take in all
    timeout_kills_tree = True  # check that a timed-out exec left none of its processes
    kills_at_once = False  # terminate (and exec's timeout) return only once the tree is gone
    tree_escape = ""  # prefix of the second sleep of `test_terminate_kills_the_tree`
    # A pipe command's signal death shows a shell's report (`Killed`) in its output.
    pipes_show_signal_reports = False

    def pytest_generate_tests(self, metafunc: pytest.Metafunc) -> None:
        """Parametrize `test_exit_codes` with this provider's `exit_codes`."""
        if {"command", "code"} <= set(metafunc.fixturenames):
            metafunc.parametrize(("command", "code"), self.exit_codes)

    async def test_exec(self, live: sandbox.BaseSandboxSession) -> None:
        result = await live.exec("echo out; echo err >&2; exit 7")
        assert result == sandbox.ExecResult(stdout=b"out\n", stderr=b"err\n", exit_code=7)
        result = await live.exec("echo $GREETING; pwd", env={"GREETING": "hola"}, cwd="/tmp")
        assert result.stdout == b"hola\n/tmp\n"
        result = await live.exec("printf", "%s|", "a b", "$HOME", shell=False)
        assert result.stdout == b"a b|$HOME|"

    async def test_exec_timeout_kills_the_command_not_the_sandbox(
        self, live: sandbox.BaseSandboxSession
    ) -> None:
        mark = unique_seconds()
        started = time.monotonic()
        with pytest.raises(sandbox.ExecTimeoutError) as info:
            await live.exec(
                f"echo before; sleep {mark} & sleep {mark}; wait", timeout=self.exec_timeout_s
            )
        assert time.monotonic() - started < self.exec_timeout_bound_s
        assert b"before" in info.value.stdout
        if self.timeout_kills_tree:
            await assert_gone(live, mark, at_once=self.kills_at_once)
        assert (await live.exec("echo still-here")).stdout == b"still-here\n", "it survived"

    async def test_files(self, live: sandbox.BaseSandboxSession) -> None:
        payload = bytes(range(256)) * 400
        await live.write_file("sub/dir/data.bin", payload)
        assert await live.read_file("sub/dir/data.bin") == payload
        assert (await live.exec("wc -c < sub/dir/data.bin")).stdout.strip() == b"102400"
        with pytest.raises(sandbox.SandboxFileNotFoundError):
            await live.read_file("no/such/file")

    @pytest.mark.parametrize("tty", [True, False], ids=["tty", "pipes"])
    async def test_exit_codes(
        self, live: sandbox.BaseSandboxSession, command: str, code: int, tty: bool
    ) -> None:
        update = await live.pty_exec_start(command, tty=tty, yield_time_s=WINDOW_S)
        assert (update.process_id, update.exit_code) == (None, code)
        if tty or code < 128 or not self.pipes_show_signal_reports:
            assert update.output == "", "nothing a wrapper or shell trap adds shows"

    @pytest.mark.parametrize("tty", [True, False], ids=["tty", "pipes"])
    async def test_nothing_added_shows_in_the_output(
        self, live: sandbox.BaseSandboxSession, tty: bool
    ) -> None:
        update = await live.pty_exec_start("echo hi", tty=tty, yield_time_s=WINDOW_S)
        assert (update.output, update.exit_code) == ("hi\r\n" if tty else "hi\n", 0)
        word = "y" * 3000  # a long command line reaches the command whole
        update = await live.pty_exec_start(f"echo {word} | wc -c", tty=tty, yield_time_s=WINDOW_S)
        assert update.output.strip() == "3001"

    async def test_terminal_round_trip_size_and_utf8(
        self, live: sandbox.BaseSandboxSession
    ) -> None:
        update = await live.pty_exec_start(
            "stty size", tty=True, rows=33, cols=91, yield_time_s=WINDOW_S
        )
        assert "33 91" in update.output
        start = (
            "echo ready; read x; stty size; exec cat" if self.can_resize else "echo ready; exec cat"
        )
        update = await live.pty_exec_start(start, tty=True, until="ready", yield_time_s=WINDOW_S)
        pid = update.process_id
        assert pid is not None
        if self.can_resize:
            await live.pty_resize(pid, rows=40, cols=120)
            update = await live.pty_write_stdin(pid, "\n", until="40 120", yield_time_s=WINDOW_S)
            assert "40 120" in update.output
        else:
            with pytest.raises(sandbox.UnsupportedOperationError):
                await live.pty_resize(pid, rows=40, cols=120)
        update = await live.pty_write_stdin(
            pid,
            "h\u00e9llo\n",
            until=re.compile("h\u00e9llo\r?\n.*h\u00e9llo", re.S),
            yield_time_s=WINDOW_S,
        )
        assert update.output.count("h\u00e9llo") == 2
        await live.pty_terminate(pid)
        assert live.pty_processes() == []

    @pytest.mark.parametrize("tty", [True, False], ids=["tty", "pipes"])
    async def test_interrupt(self, live: sandbox.BaseSandboxSession, tty: bool) -> None:
        mark = unique_seconds()
        update = await live.pty_exec_start(
            f"echo ready; exec sleep {mark}", tty=tty, until="ready", yield_time_s=WINDOW_S
        )
        pid = update.process_id
        assert pid is not None
        if not tty:
            with pytest.raises(sandbox.StdinClosedError):
                await live.pty_write_stdin(pid, "x\n")
        await live.pty_interrupt(pid)
        final = await live.pty_write_stdin(pid, "", yield_time_s=WINDOW_S)
        assert (final.process_id, final.exit_code) == (None, 130)
        await assert_gone(live, mark, at_once=False)

    async def test_terminate_kills_the_tree(self, live: sandbox.BaseSandboxSession) -> None:
        marks = [unique_seconds(), unique_seconds()]
        pids = []
        for tty, mark in zip((True, False), marks, strict=True):
            update = await live.pty_exec_start(
                f"sleep {mark} & {self.tree_escape} sleep {mark} >/dev/null 2>&1 & "
                f"echo ready; sleep {mark}; wait",
                tty=tty,
                until="ready",
                yield_time_s=WINDOW_S,
            )
            assert update.process_id is not None
            pids.append(update.process_id)
        for mark in marks:
            await assert_sleeping(live, mark, 3)
        await live.pty_terminate(pids[0])
        await assert_gone(live, marks[0], at_once=self.kills_at_once)
        await live.pty_terminate_all()
        await assert_gone(live, marks[1], at_once=self.kills_at_once)
        assert live.pty_processes() == []

    async def test_output_is_complete(self, live: sandbox.BaseSandboxSession) -> None:
        update = await live.pty_exec_start("seq 1 100000", yield_time_s=30)
        assert update.exit_code == 0
        assert update.output == "".join(f"{i}\n" for i in range(1, 100001))
