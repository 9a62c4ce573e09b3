"""Durable sessions on every fixture: ref round trip, detach/resume, reattach, takeover,
gone sandbox, and cancellation at every await point of detach and resume.

Backends without durable hooks yet are skipped with the reason (UnsupportedOperationError
from `ref()`), never passed.
"""

from __future__ import annotations

import asyncio
import importlib
import posixpath
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import sandbox
from tests.helpers import HookGate

WAIT_FOR_FILE = "while [ ! -e {name} ]; do sleep 0.02; done; echo {word}"


def _fixture(backend: Any) -> ModuleType:
    """The fixture module of `backend` (for its test credentials)."""
    return importlib.import_module(f"tests.backend_fixtures.{backend.name}")


def _resume_options(backend: Any, session: sandbox.BaseSandboxSession) -> dict[str, Any]:
    """What a resume in this test needs besides the ref: the credentials and the fake's
    class (a ref never holds them; a real caller gives them again too)."""
    if backend.name in ("e2b", "e2b_runner"):
        return {"api_key": _fixture(backend).API_KEY, "sandbox_class": session._sandbox_class}
    if backend.name in ("daytona", "daytona_runner"):
        return {
            "api_key": _fixture(backend).API_KEY,
            "daytona_class": session._client.options.daytona_class,
        }
    if backend.name in ("cloudflare", "cloudflare_runner"):
        return {"worker_url": session._worker_url, "api_key": session._client.key.reveal()}
    if backend.name in ("modal", "modal_runner"):
        return {
            "sdk": session._sdk,
            "token_id": session._token_id.reveal(),
            "token_secret": session._token_secret.reveal(),
            "state_dir": posixpath.dirname(session._commands.state_dir),
        }
    if backend.name in ("blaxel", "blaxel_runner"):
        client = session._client
        return {
            "api_key": client._api_key.reveal(),
            "workspace": client._workspace.reveal(),
            "api_url": client._api_url,  # a ref's endpoint is never taken from the ref
        }
    if backend.name in ("kubernetes", "kubernetes_exec"):
        # A kubeconfig (it can run an exec plugin) is never taken from a ref.
        return {"kubeconfig": session._kubeconfig}
    return {}


def _secrets(backend: Any, session: sandbox.BaseSandboxSession) -> list[str]:
    """The credentials this test's session was given (none may reach a ref)."""
    options = _resume_options(backend, session)
    return [str(options[k]) for k in ("api_key", "token_id", "token_secret") if k in options]


def _ref_or_skip(backend: Any, session: sandbox.BaseSandboxSession) -> sandbox.SessionRef:
    try:
        return session.ref()
    except sandbox.UnsupportedOperationError as exc:
        pytest.skip(f"{backend.name}: {exc}")


def _resume(backend: Any, old: sandbox.BaseSandboxSession, ref: sandbox.SessionRef) -> Any:
    return sandbox.resume_session(ref, **_resume_options(backend, old))


async def test_ref_round_trip(backend: Any, tmp_path: Path) -> None:
    async with backend.session(tmp_path) as s:
        ref = _ref_or_skip(backend, s)
        assert sandbox.SessionRef.from_json(ref.to_json()) == ref
        assert sandbox.SessionRef.from_dict(ref.to_dict()) == ref
        assert ref.backend == s.backend_name and backend.name.startswith(ref.backend)
        assert ref.keeps_processes is s.keeps_processes
        for secret in _secrets(backend, s):
            assert secret not in ref.to_json() and secret not in repr(ref)
        await s.aclose()


async def test_detach_then_resume(backend: Any, tmp_path: Path) -> None:
    async with backend.session(tmp_path) as s:
        _ref_or_skip(backend, s)
        await s.write_file("kept.txt", b"kept")
        started = await s.pty_exec_start("sleep 600", yield_time_s=0.2)
        ref = await s.detach()
        with pytest.raises(sandbox.SessionClosedError):
            await s.exec("true")
        [proc] = ref.processes
        assert proc.process_id == started.process_id
        assert proc.running is s.keeps_processes
        async with _resume(backend, s, ref) as resumed:
            assert await resumed.read_file("kept.txt") == b"kept"
            [info] = resumed.pty_processes()
            assert info.process_id == started.process_id
            assert info.running is s.keeps_processes
            if not info.running:
                last = await resumed.pty_write_stdin(started.process_id, "")
                assert last.process_id is None
            assert (await resumed.exec("echo", "ok")).stdout == b"ok\n"


async def test_reattached_process_reports_its_output_and_exit(backend: Any, tmp_path: Path) -> None:
    async with backend.session(tmp_path) as s:
        _ref_or_skip(backend, s)
        if not s.keeps_processes:
            pytest.skip(f"{backend.name}: processes cannot outlive their client")
        command = "echo early; " + WAIT_FOR_FILE.format(name="go", word="late") + "; exit 5"
        started = await s.pty_exec_start(command, yield_time_s=5, until="early")
        ref = await s.detach()
        async with _resume(backend, s, ref) as resumed:
            await resumed.write_file("go", b"")
            last = await resumed.pty_write_stdin(started.process_id, "", yield_time_s=30)
            assert "late" in last.output and last.exit_code == 5


async def test_takeover_locks_out_the_old_client(backend: Any, tmp_path: Path) -> None:
    async with backend.session(tmp_path) as old:
        ref = _ref_or_skip(backend, old)
        async with _resume(backend, old, ref) as new:
            with pytest.raises(sandbox.SessionTakenOverError):
                await old.exec("true")
            await old.aclose()  # lets go: the sandbox is the new owner's
            assert (await new.exec("echo", "mine")).stdout == b"mine\n"


async def test_resume_of_a_closed_session_is_gone(backend: Any, tmp_path: Path) -> None:
    async with backend.session(tmp_path) as s:
        ref = _ref_or_skip(backend, s)
        options = _resume_options(backend, s)
        await s.aclose()
        with pytest.raises(sandbox.SessionGoneError) as caught:
            async with sandbox.resume_session(ref, **options):
                pass
        assert caught.value.retryable is False


@pytest.mark.parametrize("hook", ["durability.detach", "durability.release"])
@pytest.mark.parametrize("after", [False, True])
async def test_cancelled_detach_leaves_the_ref_the_owner(
    backend: Any, tmp_path: Path, hook: str, after: bool
) -> None:
    async with backend.session(tmp_path) as s:
        _ref_or_skip(backend, s)
        await s.pty_exec_start("sleep 600", yield_time_s=0.2)
        if hook == "durability.release" and not s.keeps_processes:
            hook = "_terminate_pty_entry"  # nothing is released: the process is torn down
        gate = HookGate(s, hook, after=after)
        detaching = asyncio.ensure_future(s.detach())
        await gate.reached.wait()
        detaching.cancel()
        gate.release()
        with pytest.raises(asyncio.CancelledError):
            await detaching
        assert s.state is sandbox.SessionState.CLOSED
        ref = s.ref()  # the detach completed: its ref owns the sandbox
        async with _resume(backend, s, ref) as resumed:
            assert len(resumed.pty_processes()) == 1


@pytest.mark.parametrize("hook", ["durability.resume", "durability.reattach"])
@pytest.mark.parametrize("after", [False, True])
async def test_cancelled_resume_leaves_the_ref_the_owner(
    backend: Any, tmp_path: Path, hook: str, after: bool
) -> None:
    async with backend.session(tmp_path) as s:
        _ref_or_skip(backend, s)
        await s.write_file("kept.txt", b"kept")
        await s.pty_exec_start("sleep 600", yield_time_s=0.2)
        ref = await s.detach()
        if hook == "durability.reattach" and not s.keeps_processes:
            pytest.skip(f"{backend.name}: the ref's processes ended at detach: none reattached")
        resumed = _resume(backend, s, ref)
        gate = HookGate(resumed, hook, after=after)
        starting = asyncio.ensure_future(resumed.start())
        await gate.reached.wait()
        starting.cancel()
        gate.release()
        with pytest.raises(asyncio.CancelledError):
            await starting
        assert resumed.state is sandbox.SessionState.NEW
        async with _resume(backend, s, ref) as again:
            assert await again.read_file("kept.txt") == b"kept"
            [info] = again.pty_processes()
            assert info.running is s.keeps_processes
