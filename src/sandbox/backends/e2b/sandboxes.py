"""Creating, attaching to and killing E2B sandboxes, and finding one a create left
(`release`: the session's teardown of its sandbox), plus the checks of what a create is
given (`check_labels`; `refuse_limits`: E2B's create takes no resources).

Every create carries a metadata tag (`START_TAG`) and an idempotency key (the SDK's
`idempotency_key`, sent as the `Idempotency-Key` header): the SDK's transport retries a
create answered by a gateway error (502/503/504, `e2b.retry`), and without the key such
a retry makes a second sandbox that nobody holds. A create whose outcome is unknown (a
timeout, a dropped connection, a cancelled caller) is followed by `sweep`, which kills
every sandbox carrying its tag.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import Coroutine, Mapping
from typing import Any

from e2b import SandboxQuery

from ...backend import check_env
from ...errors import InvalidArgumentError, ProviderError
from ..toolkit import check_limits, refuse_unsupported
from .client import E2BClient
from .errors import GONE, REFUSED, SERVICE

# Metadata key that tags a sandbox with the start attempt that created it, so a create
# whose answer was lost can still be found and deleted.
START_TAG = "agent-sandbox-pty-start"
# Metadata key that marks a sandbox this library created, with the durable session's id:
# a resume checks it before it takes on the sandbox's deletion (`durable.check_created`).
SESSION_LABEL = "sandbox.session"


def refuse_limits(
    memory_limit_bytes: int | None, process_limit: int | None, cpu_limit: float | None
) -> None:
    """Refuse any resource limit (`UnsupportedOperationError`): E2B's create (e2b==2.63.0
    `AsyncSandbox.create`) takes no resources: CPU and memory belong to the template (set
    when it is built), processes are unlimited."""
    refuse_unsupported(
        check_limits(
            memory_limit_bytes=memory_limit_bytes,
            process_limit=process_limit,
            cpu_limit=cpu_limit,
        ),
        backend="e2b",
        supported=(),
        why="E2B sets CPU and memory per template (at build), not per sandbox",
    )


def check_labels(labels: object) -> dict[str, str] | None:
    """The `labels` option, checked (`check_env`), without the library's own key."""
    checked = check_env(labels, name="labels", variables=False)
    if checked and SESSION_LABEL in checked:
        raise InvalidArgumentError(
            f"labels[{SESSION_LABEL!r}] is the library's own mark of the sandboxes it "
            "creates: choose another key"
        )
    return checked


def new_start_token() -> str:
    """A fresh token for one start attempt (the tag's value and the idempotency key's)."""
    return secrets.token_hex(12)


def create_call(
    cls: Any,
    token: str,
    *,
    template: str | None,
    lifetime: int,
    metadata: Mapping[str, str],
    envs: Mapping[str, str],
    params: Mapping[str, Any],
    session_id: str,
) -> Coroutine[Any, Any, Any]:
    """The SDK's create, tagged with `token` and idempotent under the SDK's retries, and
    marked as this library's by the session's id (`SESSION_LABEL`)."""
    return cls.create(  # type: ignore[no-any-return]
        template=template,
        timeout=lifetime,
        metadata={**metadata, START_TAG: token, SESSION_LABEL: session_id},
        envs=dict(envs) or None,
        # Lowercase letters, digits and hyphens, as the SDK requires: the SDK's own
        # retries of this request then return the same sandbox, never a second one.
        idempotency_key=f"agent-sandbox-pty-{token}",
        **params,
    )


async def attach(
    client: E2BClient, cls: Any, sandbox_id: str, lifetime: int, params: Mapping[str, Any]
) -> Any:
    """`connect` to the sandbox `sandbox_id` (its lifetime set to `lifetime`), bounded by
    `start_timeout`."""
    connect = cls.connect(sandbox_id, timeout=lifetime, **params)
    try:
        return await client.bounded(connect, client.start_timeout)
    except Exception as exc:
        client.errors.fail(exc, f"attach to sandbox {sandbox_id}")


async def created(client: E2BClient, task: asyncio.Task[Any]) -> Any:
    """The sandbox the create `task` made, the task shielded: a cancelled caller leaves it
    running for the teardown (`release`), which waits for it and deletes what it made."""
    try:
        return await asyncio.shield(task)
    except Exception as exc:
        client.errors.fail(exc, "create a sandbox")


async def release(
    client: E2BClient,
    cls: Any,
    params: Mapping[str, Any],
    sandbox: Any,
    task: asyncio.Task[Any] | None,
    token: str | None,
    *,
    keep: bool,
) -> None:
    """Kill `sandbox` unless `keep`; after an unfinished start (its create `task` still
    held), whatever the create made, kept or not: the task's sandbox once it ends, or
    every sandbox tagged with `token` when its outcome is unknown (`sweep`)."""
    unfinished_start = task is not None
    if task is not None and sandbox is None:
        # The start failed or its caller was cancelled: the create's outcome decides.
        if not task.done():
            await asyncio.wait([task])
        failure = None if task.cancelled() else task.exception()
        if task.cancelled() or failure is not None:
            if token is not None and not isinstance(failure, REFUSED):
                await sweep(client, cls, token, params)
            return
        sandbox = task.result()
    if sandbox is None or (keep and not unfinished_start):
        return
    await kill_sandbox(client, sandbox, params)


async def kill_sandbox(client: E2BClient, sandbox: Any, params: Mapping[str, Any]) -> None:
    """Kill `sandbox` (bounded by `kill_timeout`); one already gone is fine."""
    try:
        await client.bounded(sandbox.kill(**params), client.kill_timeout)
    except GONE:
        pass
    except TimeoutError:
        raise client.errors.no_answer(
            f"kill sandbox {sandbox.sandbox_id} (it ends by itself at its lifetime)",
            client.kill_timeout,
        ) from None
    except Exception as exc:
        client.errors.fail(exc, f"kill sandbox {sandbox.sandbox_id}")


async def sweep(client: E2BClient, cls: Any, token: str, params: Mapping[str, Any]) -> None:
    """Kill any sandbox tagged with `token` (a create whose answer was lost)."""
    seconds = client.kill_timeout * 2
    try:
        async with asyncio.timeout(seconds):
            paginator = cls.list(query=SandboxQuery(metadata={START_TAG: token}), **params)
            while paginator.has_next:
                for info in await paginator.next_items():
                    with contextlib.suppress(*GONE):
                        await cls.kill(info.sandbox_id, **params)
    except TimeoutError:
        raise ProviderError(
            "could not check whether the failed start left a sandbox behind: "
            f"{SERVICE} did not answer within {seconds:g}s",
            retryable=True,
        ) from None
    except Exception as exc:
        client.errors.fail(exc, "look for a sandbox left by the failed start")
