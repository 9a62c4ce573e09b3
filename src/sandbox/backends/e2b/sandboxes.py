"""Creating, attaching to and killing E2B sandboxes, and finding one a create left.

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

from ...errors import ProviderError
from .client import E2BClient
from .errors import GONE, SERVICE

# Metadata key that tags a sandbox with the start attempt that created it, so a create
# whose answer was lost can still be found and deleted.
START_TAG = "agent-sandbox-pty-start"
# Metadata key that marks a sandbox this library created, with the durable session's id:
# a resume checks it before it takes on the sandbox's deletion (`durable.check_created`).
SESSION_LABEL = "sandbox.session"


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
