"""Live suite for the `cloudflare` backend: runs against a real, user-deployed Sandbox
Worker.

Runs only with `-m integration` (`make test-integration`) and both
`CLOUDFLARE_SANDBOX_WORKER_URL` and `CLOUDFLARE_SANDBOX_API_KEY`; otherwise every test
skips and says why. One sandbox serves the whole module and is deleted at the end. For a
dry run, point both variables at a `CloudflareWorkerServer`.

The common flow is `LiveSuite` (tests/integration/live_flow.py).
"""

from __future__ import annotations

import re

import pytest

import sandbox
from tests.integration.live_flow import LiveSuite, Requirements, live_session

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="module")]

REQUIRES = Requirements(
    "Cloudflare",
    "cloudflare",
    {"aiohttp": "aiohttp"},
    ("CLOUDFLARE_SANDBOX_WORKER_URL", "CLOUDFLARE_SANDBOX_API_KEY"),
    unset="no Cloudflare Worker configured",
    suite="this suite",
)

live = live_session(REQUIRES, lambda: sandbox.open_session("cloudflare"))


class TestCloudflare(LiveSuite):
    exec_timeout_s = 3.0
    exec_timeout_bound_s = 20.0
    timeout_kills_tree = False  # never checked on the real service (the loopback passes)

    async def test_shell_quoting_with_cwd_and_env(self, live: sandbox.BaseSandboxSession) -> None:
        result = await live.exec("printf '%s|' a 'b c'", cwd="/", env={"X": "1"})
        assert result.stdout == b"a|b c|"

    async def test_wrong_key_is_an_auth_error_without_the_key(self) -> None:
        REQUIRES.skip_if_missing()
        wrong = "definitely-not-the-key-0c1d"
        session = sandbox.open_session("cloudflare", api_key=wrong)
        with pytest.raises(sandbox.ProviderError) as info:
            await session.start()
        assert not info.value.retryable
        assert wrong not in str(info.value) and wrong not in repr(session)

    async def test_two_ptys_at_once_keep_their_output_apart(
        self, live: sandbox.BaseSandboxSession
    ) -> None:
        """Each process has its own bridge session (one PTY per session upstream)."""
        a = await live.pty_exec_start("echo AAA-live; exec cat", tty=True, until="AAA-live")
        b = await live.pty_exec_start("echo BBB-live; exec cat", tty=True, until="BBB-live")
        assert a.process_id is not None and b.process_id is not None
        assert "AAA" not in b.output
        more = await live.pty_write_stdin(
            a.process_id, "only-a\n", until=re.compile("only-a.*only-a", re.S)
        )
        assert "BBB" not in more.output
        await live.pty_terminate(a.process_id)
        await live.pty_terminate(b.process_id)
        done = await live.pty_exec_start("exit 6", tty=True, yield_time_s=30)
        assert done.exit_code == 6, "the status comes back without an exit frame"

    async def test_relative_file_paths_mean_the_workspace(
        self, live: sandbox.BaseSandboxSession
    ) -> None:
        await live.write_file("notes-live.txt", b"hello")
        assert await live.read_file("notes-live.txt") == b"hello"
        assert await live.read_file("/workspace/notes-live.txt") == b"hello"
        assert (await live.exec("cat /workspace/notes-live.txt")).stdout == b"hello"
        with pytest.raises(sandbox.WorkspacePathError):
            await live.read_file("/etc/hostname")

    async def test_detached_terminal_is_reattached_with_what_it_printed(self) -> None:
        """The durable facts on the real Worker: a terminal session outlives the
        client, its ring replays what it printed meanwhile (docs/providers.md)."""
        REQUIRES.skip_if_missing()
        first = sandbox.open_session("cloudflare")
        await first.start()
        try:
            started = await first.pty_exec_start(
                "echo early-live; while [ ! -e go-live ]; do sleep 0.1; done; "
                "echo late-live; exit 4",
                until="early-live",
                yield_time_s=30,
            )
            ref = await first.detach()
        except BaseException:
            await first.aclose()
            raise
        async with sandbox.resume_session(ref) as resumed:
            await resumed.write_file("go-live", b"")
            update = await resumed.pty_write_stdin(started.process_id, "", yield_time_s=30)
            assert "late-live" in update.output and "early-live" not in update.output
            assert update.exit_code == 4
