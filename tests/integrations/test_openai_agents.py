"""The OpenAI Agents SDK's real `Runner.run` driving our sessions.

The model is scripted (`sandbox.testing.openai_agents_model.ScriptedModel`, an
implementation of the SDK's `Model` interface that emits tool calls and reads back the
tool outputs it gets; no network); the tools are the SDK's own
(`exec_command`, `write_stdin`, `apply_patch`) plus our `Terminal`. Runs on every
conformance fixture (unix_local, docker, the stand-ins) through a live session, and on
unix_local and docker through `SandboxClient` (create, resume, delete).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("agents.sandbox", reason="the openai-agents extra is not installed")

from agents import ModelSettings, RunConfig, Runner
from agents.run_config import SandboxRunConfig
from agents.sandbox import SandboxAgent
from agents.sandbox.capabilities import Filesystem, Shell
from openai.types.responses import ResponseCustomToolCall

import sandbox
from sandbox.integrations.openai_agents import (
    AgentsSessionAdapter,
    SandboxClient,
    SandboxClientOptions,
    Terminal,
)
from sandbox.testing import conformance
from sandbox.testing.conformance import eventually
from sandbox.testing.openai_agents_model import ScriptedModel, call, say


def agent(model: ScriptedModel, *, terminal: bool = False) -> SandboxAgent[Any]:
    capabilities = [Filesystem(), Shell()]
    if terminal:
        capabilities.append(Terminal())
    return SandboxAgent(
        name="tester",
        instructions="test",
        model=model,
        model_settings=ModelSettings(),
        capabilities=capabilities,
    )


def session_id_in(output: str) -> int:
    found = re.search(r"session ID (\d+)", output)
    assert found, output
    return int(found.group(1))


def last(outputs: dict[str, str]) -> str:
    assert outputs, "the model got no tool output"
    return list(outputs.values())[-1]


@pytest.fixture
async def live(session: sandbox.BaseSandboxSession[Any]) -> AgentsSessionAdapter:
    """An adapter over a started session of each backend (the conftest's `session`
    fixture closes and leak-checks it after the test)."""
    return await AgentsSessionAdapter.around(session)


async def run(
    model: ScriptedModel, adapter: AgentsSessionAdapter, *, terminal: bool = False
) -> str:
    result = await Runner.run(
        agent(model, terminal=terminal),
        "go",
        run_config=RunConfig(sandbox=SandboxRunConfig(session=adapter), tracing_disabled=True),
    )
    return str(result.final_output)


async def test_a_shell_command_through_exec_command(live: AgentsSessionAdapter) -> None:
    model = ScriptedModel(
        [
            lambda _: [call("exec_command", cmd="echo hello from $((6*7)); exit 3")],
            lambda out: [say(last(out))],
        ]
    )
    final = await run(model, live)
    assert "hello from 42" in final
    assert "Process exited with code 3" in final
    assert "exec_command" in model.tool_names and "write_stdin" in model.tool_names


async def test_a_pty_round_trip_through_write_stdin(live: AgentsSessionAdapter) -> None:
    model = ScriptedModel(
        [
            lambda _: [call("exec_command", cmd="cat", tty=True, yield_time_ms=500)],
            lambda out: [call("write_stdin", session_id=session_id_in(last(out)), chars="ping\n")],
            lambda out: [say(last(out))],
        ]
    )
    final = await run(model, live)
    assert "ping" in final
    assert "Process running with session ID" in final
    await live.pty_terminate_all()
    assert live.sandbox_session.pty_processes() == []


async def test_write_stdin_to_a_pipes_process_gives_the_sdk_hint(
    live: AgentsSessionAdapter,
) -> None:
    model = ScriptedModel(
        [
            lambda _: [call("exec_command", cmd="sleep 30", yield_time_ms=300)],
            lambda out: [call("write_stdin", session_id=session_id_in(last(out)), chars="x")],
            lambda out: [say(last(out))],
        ]
    )
    final = await run(model, live)
    assert "tty" in final.lower(), final
    with pytest.raises(RuntimeError) as caught:
        pid = live.sandbox_session.pty_processes()[0].process_id
        await live.pty_write_stdin(session_id=pid, chars="x")
    assert str(caught.value) == "stdin is not available for this process"
    await live.pty_terminate_all()


async def test_an_unknown_session_id_is_the_sdks_not_found(live: AgentsSessionAdapter) -> None:
    from agents.sandbox.errors import PtySessionNotFoundError

    with pytest.raises(PtySessionNotFoundError):
        await live.pty_write_stdin(session_id=999_999, chars="x")


async def test_the_file_editing_tool_writes_through_our_files(live: AgentsSessionAdapter) -> None:
    patch = "*** Begin Patch\n*** Add File: notes/hello.txt\n+hello\n+world\n*** End Patch\n"

    def edit(_: dict[str, str]) -> list[Any]:
        ident = f"call_{os.urandom(6).hex()}"
        return [
            ResponseCustomToolCall(
                id=f"ctc_{ident}",
                call_id=ident,
                name="apply_patch",
                input=patch,
                type="custom_tool_call",
            )
        ]

    model = ScriptedModel([edit, lambda out: [say(last(out))]])
    await run(model, live)
    data = await live.sandbox_session.read_file("notes/hello.txt")
    assert data == b"hello\nworld"  # the SDK's patch tool ends the file without a newline


async def test_terminal_capability_waits_and_shows_the_screen(live: AgentsSessionAdapter) -> None:
    model = ScriptedModel(
        [
            lambda _: [call("exec_command", cmd="cat", tty=True, yield_time_ms=500)],
            lambda out: [
                call(
                    "send_keys",
                    session_id=session_id_in(last(out)),
                    chars="marker-1\n",
                    until="marker-1\r\nmarker-1",
                )
            ],
            lambda out: [
                call("view_screen", session_id=live.sandbox_session.pty_processes()[0].process_id)
            ],
            lambda out: [say(last(out))],
        ]
    )
    final = await run(model, live, terminal=True)
    assert "marker-1" in final and "Screen of session" in final
    assert {"view_screen", "send_keys", "interrupt", "resize", "terminate"} <= set(model.tool_names)
    await live.pty_terminate_all()


async def test_cancelling_a_run_mid_tool_leaves_no_process(
    live: AgentsSessionAdapter, backend: conformance.Backend
) -> None:
    lister = backend.processes_with_arg
    if lister is None:
        pytest.skip(f"{backend.name} has no process lister")
    seconds = conformance.unique_seconds()
    model = ScriptedModel(
        [
            lambda _: [call("exec_command", cmd=f"exec sleep {seconds}", yield_time_ms=30_000)],
            lambda out: [say("unreachable")],
        ]
    )
    task = asyncio.create_task(run(model, live))
    # Mid-tool: the tool's process is running (a process table is looked at, not waited on).
    assert await eventually(lambda: bool(lister(seconds)) or task.done(), timeout=30)
    assert not task.done() and lister(seconds)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    # The cancelled start tore its process down: the caller never learned its id.
    assert live.sandbox_session.pty_processes() == []
    assert await eventually(lambda: not lister(seconds)), f"sleep {seconds} outlived the run"


# ---- through SandboxClient: create, resume, delete ----


def client_backends() -> list[str]:
    from sandbox.backends import BACKENDS

    return [n for n in ("unix_local", "docker") if BACKENDS[n].installed]


def backend_options(name: str) -> dict[str, Any]:
    if name == "docker":
        from sandbox.testing.docker_image import ensure_busybox_image

        return {"image": ensure_busybox_image()}
    return {}


@pytest.mark.parametrize("backend", client_backends())
async def test_client_run_then_resume_from_serialized_state(backend: str) -> None:
    client = SandboxClient()
    options = SandboxClientOptions(backend=backend, backend_options=backend_options(backend))
    session = await client.create(options=options)
    await session.start()
    try:
        model = ScriptedModel(
            [
                lambda _: [call("exec_command", cmd="echo kept > kept.txt; echo written")],
                lambda out: [say(last(out))],
            ]
        )
        result = await Runner.run(
            agent(model),
            "go",
            run_config=RunConfig(sandbox=SandboxRunConfig(session=session), tracing_disabled=True),
        )
        assert "written" in str(result.final_output)
        payload = client.serialize_session_state(session.state)
        assert json.loads(json.dumps(payload)) == payload
        # The state names the same sandbox through our SessionRef.
        ref = sandbox.SessionRef.from_dict(payload["session_ref"])  # type: ignore[arg-type]
        assert ref.backend == backend
        fresh = SandboxClient()
        resumed = await fresh.resume(fresh.deserialize_session_state(payload))
        await resumed.start()
        try:
            reply = await resumed.exec("cat kept.txt")
            assert reply.stdout == b"kept\n"
            # One owner: the first client lost the sandbox to the resumed one.
            with pytest.raises(sandbox.SessionTakenOverError):
                await session._inner.sandbox_session.exec("true")
        finally:
            await resumed.shutdown()
            await fresh.delete(resumed)
    finally:
        await session.shutdown()
        await client.delete(session)


async def test_serialized_state_holds_no_secret(tmp_path: Path) -> None:
    client = SandboxClient()
    secret = "sk-live-" + os.urandom(8).hex()
    options = SandboxClientOptions(
        backend="unix_local",
        backend_options={"workdir": str(tmp_path), "api_key": secret, "env": {"A": "1"}},
    )
    session = await client.create(options=options)
    payload = json.dumps(client.serialize_session_state(session.state))
    assert secret not in payload
    assert secret not in repr(options) and secret not in str(options)
    assert secret not in repr(session.state) and secret not in repr(client)
    assert str(tmp_path) in payload
    await client.delete(session)


async def test_delete_removes_only_a_workspace_the_client_made(tmp_path: Path) -> None:
    client = SandboxClient()
    made = await client.create(options=SandboxClientOptions(backend="unix_local"))
    await made.start()
    root = Path(made.state.manifest.root)
    assert root.is_dir()
    await made.shutdown()
    await client.delete(made)
    assert not root.exists()

    given = await client.create(
        options=SandboxClientOptions(
            backend="unix_local", backend_options={"workdir": str(tmp_path)}
        )
    )
    await given.start()
    await given.shutdown()
    await client.delete(given)
    assert tmp_path.is_dir()


async def test_delete_never_removes_a_folder_a_forged_state_claims(tmp_path: Path) -> None:
    victim = tmp_path / "precious"
    victim.mkdir()
    (victim / "keep.txt").write_text("keep")
    client = SandboxClient()
    made = await client.create(options=SandboxClientOptions(backend="unix_local"))
    payload = client.serialize_session_state(made.state)
    await client.delete(made)
    payload["workspace_root_owned"] = True
    payload["manifest"]["root"] = str(victim)  # type: ignore[index]
    forged = await client.resume(client.deserialize_session_state(payload))
    with pytest.raises(sandbox.RefNotTrustedError):
        await client.delete(forged)
    assert (victim / "keep.txt").read_text() == "keep"


def test_options_refuse_an_unknown_backend() -> None:
    with pytest.raises(ValueError, match="unknown backend"):
        SandboxClientOptions(backend="nope")


def test_importing_sandbox_does_not_import_the_sdk() -> None:
    import subprocess
    import sys

    code = "import sys, sandbox; print('agents' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_the_docs_example_names_what_exists() -> None:
    """docs/openai-agents.md's example compiles and imports only names that exist."""
    import ast
    import importlib

    text = (Path(__file__).resolve().parents[2] / "docs" / "openai-agents.md").read_text()
    block = re.findall(r"```python\n(.*?)```", text, re.S)[0]
    tree = ast.parse(block)
    compile(tree, "openai-agents.md", "exec")
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            module = importlib.import_module(node.module)
            for alias in node.names:
                assert hasattr(module, alias.name), f"{node.module}.{alias.name}"


async def test_the_sdk_persists_and_hydrates_through_our_archives(
    live: AgentsSessionAdapter, session: sandbox.BaseSandboxSession[Any]
) -> None:
    """The SDK's `persist_workspace`/`hydrate_workspace` ride on ours (issue 22)."""
    await session.write_file("kept/notes.txt", b"persisted by the SDK")
    # The caller owns the spooled archive: closed once hydrated (pytest is strict).
    with await live.persist_workspace() as spooled:
        await session.remove("kept", recursive=True)
        await live.hydrate_workspace(spooled)
    assert await session.read_file("kept/notes.txt") == b"persisted by the SDK"
