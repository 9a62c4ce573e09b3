"""The calls around a Modal sandbox's life that are not hooks: the token, finding a
sandbox a cut-short create left, and the calls made while stopping (each bounded by
`STOP_TIMEOUT_S`)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from typing import Any

from modal import exception as modal_exception

from ...errors import CredentialsMissingError
from ..toolkit import Secret, require_credential
from .errors import SANDBOX_GONE, SDK_ERRORS, ModalErrors

logger = logging.getLogger("sandbox.modal")

STOP_TIMEOUT_S = 60.0  # each call made while stopping the sandbox
TOKEN_ID_ENV = "MODAL_TOKEN_ID"
TOKEN_SECRET_ENV = "MODAL_TOKEN_SECRET"
# The tag that marks a sandbox this library created, with the durable session's id: a
# resume checks it (`Sandbox.get_tags`) before it takes on the sandbox's termination.
SESSION_LABEL = "sandbox.session"


def credentials(token_id: Secret | None, token_secret: Secret | None) -> tuple[Secret, Secret]:
    """The token id and secret (options first, then the environment), through the
    shared lookup; one error naming every variable that is missing."""
    found: list[Secret] = []
    missing: list[str] = []
    for option, variable, what in (
        (token_id, TOKEN_ID_ENV, "a Modal token id"),
        (token_secret, TOKEN_SECRET_ENV, "a Modal token secret"),
    ):
        given = option.reveal() if option is not None else None
        try:
            found.append(Secret(require_credential(given, variable, backend="modal", what=what)))
        except CredentialsMissingError as exc:
            missing.append(str(exc))
    if missing:
        raise CredentialsMissingError("; ".join(missing) + " (or pass client=)")
    return found[0], found[1]


async def find_created_sandbox(
    sdk: Any, errors: ModalErrors, app_name: str, name: str, client: Any
) -> Any:
    """The sandbox a failed or cancelled create named `name` may have left, or None."""
    try:
        async with asyncio.timeout(STOP_TIMEOUT_S):
            return await sdk.Sandbox.from_name.aio(app_name, name, client=client)
    except modal_exception.NotFoundError:
        return None
    except SDK_ERRORS as exc:
        raise errors.map("find the sandbox of a failed start", exc) from None


async def terminate(errors: ModalErrors, sandbox: Any) -> None:
    """Terminate the sandbox; one already gone is fine."""
    try:
        async with asyncio.timeout(STOP_TIMEOUT_S):
            await sandbox.terminate.aio()
    except SANDBOX_GONE:
        return
    except SDK_ERRORS as exc:
        raise errors.map("terminate the sandbox", exc) from None


async def quietly(errors: ModalErrors, call: Awaitable[Any], what: str) -> None:
    """A call whose failure changes nothing for the caller (the sandbox is terminated
    or kept either way): logged, never raised."""
    try:
        async with asyncio.timeout(STOP_TIMEOUT_S):
            await call
    except Exception as exc:
        logger.debug("%s failed: %s", what, errors.describe(exc))


async def remove_dir(sandbox: Any, path: str) -> None:
    """Remove a directory we made in a kept sandbox (its markers)."""
    process = await sandbox.exec.aio("rm", "-rf", path, text=False)
    await process.wait.aio()
