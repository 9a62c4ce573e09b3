"""The provider calls around a Modal sandbox's life, which the session's `_start_backend`
and `_stop_backend` make in order: the token and the client (`open_client`: the given
one, or `connect`), attaching (`attach`) or creating (`lookup_app`, `create_sandbox`),
and at the end `shut_down`: the runner's link closed, `release_sandbox` (terminate, also
a sandbox a cut-short create left, found by its name; or, kept, remove our markers;
then detach) and `close_client`. The calls made while stopping are each bounded by
`STOP_TIMEOUT_S`."""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Awaitable, Mapping
from typing import Any

from modal import exception as modal_exception

from ...errors import CredentialsMissingError
from ..toolkit import Secret, require_credential
from .errors import SANDBOX_GONE, SDK_ERRORS, ModalErrors
from .runner_link import SandboxRunner

logger = logging.getLogger("sandbox.modal")

STOP_TIMEOUT_S = 60.0  # each call made while stopping the sandbox
TOKEN_ID_ENV = "MODAL_TOKEN_ID"
TOKEN_SECRET_ENV = "MODAL_TOKEN_SECRET"
TOKEN_ENVS = (TOKEN_ID_ENV, TOKEN_SECRET_ENV)
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


async def connect(
    sdk: Any, errors: ModalErrors, token_id: Secret | None, token_secret: Secret | None
) -> Any:
    """A client opened with the token (`credentials`): the caller closes it."""
    found_id, found_secret = credentials(token_id, token_secret)
    return await errors.call(
        "connect to Modal",
        sdk.Client.from_credentials.aio,
        found_id.reveal(),
        found_secret.reveal(),
    )


async def open_client(
    sdk: Any,
    errors: ModalErrors,
    given: Any,
    token_id: Secret | None,
    token_secret: Secret | None,
) -> tuple[Any, bool]:
    """The client and whether we opened it (then the stop closes it): the `given` one
    (the `client` option), else one opened with the token (`connect`)."""
    if given is not None:
        return given, False
    return await connect(sdk, errors, token_id, token_secret), True


async def attach(sdk: Any, errors: ModalErrors, sandbox_id: str, client: Any) -> Any:
    """The existing sandbox `sandbox_id` (`Sandbox.from_id`)."""
    return await errors.call(
        "attach to the sandbox", sdk.Sandbox.from_id.aio, sandbox_id, client=client
    )


async def lookup_app(sdk: Any, errors: ModalErrors, app_name: str, client: Any) -> Any:
    """The app a new sandbox belongs to, created if missing."""
    return await errors.call(
        "look up the app", sdk.App.lookup.aio, app_name, create_if_missing=True, client=client
    )


def sandbox_name() -> str:
    """A unique name for a new sandbox: it lets a start that fails or is cancelled while
    the create call is in flight find, and terminate, a sandbox the provider created
    anyway (`find_created_sandbox`)."""
    return f"sandbox-pty-{secrets.token_hex(8)}"


async def create_sandbox(
    sdk: Any,
    errors: ModalErrors,
    *,
    app: Any,
    name: str,
    image: Any,
    client: Any,
    lifetime_s: int,
    workdir: str,
    create_options: Mapping[str, Any],
    session_id: str,
    timeout_s: float,
) -> Any:
    """`Sandbox.create` within `timeout_s` (it may build the image first), with the
    caller's tags and ours: `SESSION_LABEL`, the durable session's id (the caller's
    value for it was refused with the options)."""
    options = dict(create_options)
    options["tags"] = {**(options.get("tags") or {}), SESSION_LABEL: session_id}
    return await errors.timed_call(
        "create the sandbox",
        timeout_s,
        sdk.Sandbox.create.aio,
        app=app,
        name=name,
        image=image,
        timeout=lifetime_s,
        workdir=workdir,
        client=client,
        **options,
    )


async def shut_down(
    sdk: Any,
    errors: ModalErrors,
    sandbox: Any,
    *,
    runner: SandboxRunner | None,
    client: Any,
    owns_client: bool,
    keep: bool,
    app_name: str,
    create_name: str | None,
    markers: str | None,
) -> None:
    """The session's stop: close the runner's link (the runner lives on in a kept
    sandbox; a terminated one ends it), release the sandbox whatever became of the link
    (`release_sandbox`), and close `client` if we opened it (`owns_client`) whatever
    became of the sandbox."""
    try:
        try:
            if runner is not None:
                await runner.aclose()
        finally:
            await release_sandbox(
                sdk,
                errors,
                sandbox,
                keep=keep,
                app_name=app_name,
                create_name=create_name,
                client=client,
                markers=markers,
            )
    finally:
        if owns_client and client is not None:
            await close_client(errors, client)


async def release_sandbox(
    sdk: Any,
    errors: ModalErrors,
    sandbox: Any,
    *,
    keep: bool,
    app_name: str,
    create_name: str | None,
    client: Any,
    markers: str | None,
) -> None:
    """Terminate `sandbox` unless kept (with none, the one a failed or cancelled create
    named `create_name` may have left); a kept one loses the directory of our
    `markers` (None: none was left). Then detach from it."""
    if not keep:
        if sandbox is None and create_name is not None:
            sandbox = await find_created_sandbox(sdk, errors, app_name, create_name, client)
        if sandbox is not None:
            await terminate(errors, sandbox)
    elif sandbox is not None and markers is not None:
        await quietly(errors, remove_dir(sandbox, markers), "removing markers")
    if sandbox is not None:
        await quietly(errors, sandbox.detach.aio(), "detaching from the sandbox")


async def close_client(errors: ModalErrors, client: Any) -> None:
    """Close a client we opened (`connect`); a failure is only logged."""
    await quietly(errors, client.close.aio(), "closing the Modal client")


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
