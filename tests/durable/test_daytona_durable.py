"""Daytona: a pipe process's log, written while no client was attached, after a resume."""

from __future__ import annotations

import pytest

pytest.importorskip("daytona")

import sandbox
from sandbox.testing.daytona_fake import FakeDaytona
from tests.backend_fixtures.daytona import API_KEY


async def test_output_written_while_detached_is_returned_once(tmp_path):
    async with FakeDaytona(api_key=API_KEY, root=tmp_path) as fake:
        options = {"api_key": API_KEY, "daytona_class": fake.AsyncDaytona}
        session = sandbox.open_session("daytona", **options)
        await session.start()
        started = await session.pty_exec_start(
            "echo early; sleep 0.5; echo late; exit 4", until="early", yield_time_s=10
        )
        assert "early" in started.output
        ref = await session.detach()
        assert API_KEY not in ref.to_json()
        # "late" is printed with no client attached (or, on a slow machine, after the
        # resume): either way the log gives it once, and never "early" again.
        async with sandbox.resume_session(ref, **options) as resumed:
            update = await resumed.pty_write_stdin(started.process_id, "", yield_time_s=10)
            assert "late" in update.output and "early" not in update.output
            assert update.exit_code == 4


async def test_a_second_detach_keeps_counting_from_the_first_byte(tmp_path):
    async with FakeDaytona(api_key=API_KEY, root=tmp_path) as fake:
        options = {"api_key": API_KEY, "daytona_class": fake.AsyncDaytona}
        session = sandbox.open_session("daytona", **options)
        await session.start()
        started = await session.pty_exec_start(
            "echo one; while [ ! -e go ]; do sleep 0.02; done; echo two; "
            "while [ ! -e go2 ]; do sleep 0.02; done; echo three",
            until="one",
            yield_time_s=10,
        )
        ref = await session.detach()
        async with sandbox.resume_session(ref, **options) as resumed:
            await resumed.write_file("go", b"")
            update = await resumed.pty_write_stdin(started.process_id, "", until="two")
            assert "two" in update.output and "one" not in update.output
            second = await resumed.detach()
        async with sandbox.resume_session(second, **options) as last:
            await last.write_file("go2", b"")
            update = await last.pty_write_stdin(started.process_id, "", yield_time_s=10)
            assert "three" in update.output
            assert "one" not in update.output and "two" not in update.output
