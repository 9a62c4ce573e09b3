"""The Daytona client and sandbox of one session: create or attach, prepare, delete, and
the bounded, mapped provider calls every other module goes through.

- Start: `AsyncDaytona(DaytonaConfig(...))`, then `create()` a sandbox with a unique
  name, or `get(sandbox_id)` to attach (starting it when stopped). If creating fails or
  is cancelled half-way, the sandbox is looked up by that name and deleted, so nothing
  is left on the provider. A one-time `process.exec` learns the working directory and
  makes a private state directory (scripts too long to type go there).
- Every call made while tearing down is bounded by `teardown_timeout_s`, so a provider
  that stops answering cannot hang a terminate or the close; a kill the SDK says may
  succeed on a retry is tried once more (a kill not made leaves a process running).
"""

from __future__ import annotations

import asyncio
import logging
import posixpath
import secrets
import shlex
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from daytona import (
    CreateSandboxFromImageParams,
    CreateSandboxFromSnapshotParams,
    DaytonaConfig,
    DaytonaError,
    Resources,
    SandboxState,
)

from ...errors import ProviderError
from ..toolkit import Secret
from .errors import deadline_error, detail_of, is_not_found, is_retryable, provider_error, refused

logger = logging.getLogger("sandbox.daytona")

T = TypeVar("T")

_PREPARE = (
    'd="${TMPDIR:-/tmp}/.sandbox-pty-$(id -u)"; mkdir -p "$d" && chmod 700 "$d" '
    '&& printf "%s\\n%s\\n" "$d" "$PWD"'
)


@dataclass
class ClientOptions:
    """How to reach the service and make (or find) the sandbox."""

    api_key: Secret
    api_url: str | None
    target: str | None
    attach_id: str | None
    keep: bool
    snapshot: str | None
    image: str | None
    resources: Resources | None
    create_options: Mapping[str, Any]
    create_timeout_s: float
    teardown_timeout_s: float
    daytona_class: Callable[..., Any]
    call_timeout_s: float = 120.0
    labels: dict[str, str] = field(default_factory=lambda: {"created-by": "agent-sandbox-pty"})


# The label that marks a sandbox this library created, with the durable session's id: a
# resume checks it before it takes on the sandbox's deletion (`durable.check_created`).
SESSION_LABEL = "sandbox.session"


class DaytonaClient:
    """One session's client and sandbox. `sandbox` is the SDK's `AsyncSandbox` once
    started; `workdir` and `state_dir` are learned by `start`."""

    def __init__(self, options: ClientOptions) -> None:
        self.options = options
        self.client: Any = None
        self.sandbox: Any = None
        self.workdir = "/"
        self.state_dir = "/tmp"
        self._create_name: str | None = None
        self._created_id: str | None = None
        self._ready = False

    # ---- calls ----------------------------------------------------------------------

    @property
    def process(self) -> Any:
        """The sandbox's `process` API."""
        return self.sandbox.process

    @property
    def fs(self) -> Any:
        """The sandbox's `fs` API."""
        return self.sandbox.fs

    def error(self, exc: BaseException, what: str) -> ProviderError:
        """Our error for an SDK error raised while trying to `what`."""
        return provider_error(exc, what, [self.options.api_key])

    def describe(self, exc: BaseException) -> str:
        """A redacted, short text for `exc` (for a lost process's reason, a log)."""
        return detail_of(exc, [self.options.api_key])

    def teardown_error(self, exc: BaseException, what: str) -> BaseException:
        """Our error for a teardown step that failed (an SDK error or its bound)."""
        if isinstance(exc, DaytonaError):
            return self.error(exc, what)
        if isinstance(exc, TimeoutError):
            return deadline_error(what, self.options.teardown_timeout_s)
        return exc

    async def call(self, what: str, call: Awaitable[T], seconds: float | None = None) -> T:
        """`call` within `seconds` (default `call_timeout_s`), its SDK error mapped
        (never chained: it may hold request details)."""
        try:
            return await self.timed(what, call, seconds)
        except DaytonaError as exc:
            raise self.error(exc, what) from None

    async def timed(self, what: str, call: Awaitable[T], seconds: float | None = None) -> T:
        """`call` within `seconds` (default `call_timeout_s`), over the whole call: the
        SDK's HTTP timeouts bound each wait on the socket at most, which a peer trickling
        a byte at a time never trips. Beyond it: a retryable `ProviderError`; SDK errors
        pass through."""
        bound = self.options.call_timeout_s if seconds is None else seconds
        try:
            async with asyncio.timeout(bound):
                return await call
        except TimeoutError:
            raise deadline_error(what, bound) from None

    async def bounded(self, call: Awaitable[T]) -> T:
        """`call` within `teardown_timeout_s` (TimeoutError beyond)."""
        async with asyncio.timeout(self.options.teardown_timeout_s):
            return await call

    async def bounded_retry(self, make_call: Callable[[], Awaitable[T]]) -> T:
        """A bounded teardown call, tried once more when the SDK says a retry may help."""
        try:
            return await self.bounded(make_call())
        except DaytonaError as exc:
            if not is_retryable(exc):
                raise
            logger.debug("daytona: retrying a teardown call after: %s", self.describe(exc))
        return await self.bounded(make_call())

    def new_id(self, kind: str) -> str:
        """A fresh provider-side name (a session, a PTY)."""
        return f"sandbox-pty-{kind}-{secrets.token_hex(6)}"

    def cwd(self, cwd: str | None) -> str:
        """`cwd` resolved against the working directory."""
        return posixpath.join(self.workdir, cwd) if cwd else self.workdir

    # ---- lifecycle ------------------------------------------------------------------

    async def start(self, session_id: str) -> None:
        """Create the sandbox (labelled with `session_id`) or attach to one, then learn
        its directories."""
        opts = self.options
        config = DaytonaConfig(
            api_key=opts.api_key.reveal(), api_url=opts.api_url, target=opts.target
        )
        try:
            self.client = opts.daytona_class(config)
        except DaytonaError as exc:
            raise self.error(exc, "connect to the API") from None
        if opts.attach_id is not None:
            sandbox = await self.call(
                f"find sandbox {opts.attach_id!r}", self.client.get(opts.attach_id)
            )
            self.sandbox = sandbox
            if getattr(sandbox, "state", SandboxState.STARTED) != SandboxState.STARTED:
                await self.call(
                    "start the sandbox",
                    sandbox.start(timeout=opts.create_timeout_s),
                    opts.create_timeout_s + opts.call_timeout_s,
                )
        else:
            self._create_name = f"sandbox-pty-{secrets.token_hex(6)}"
            params: CreateSandboxFromSnapshotParams | CreateSandboxFromImageParams
            extra = dict(opts.create_options)
            # The caller's labels join ours (one `labels` keyword, not two); the session
            # label is always ours (the session refuses a caller's value for it).
            labels = {
                **opts.labels,
                **(extra.pop("labels", None) or {}),
                SESSION_LABEL: session_id,
            }
            if opts.image is None:
                params = CreateSandboxFromSnapshotParams(
                    name=self._create_name,
                    snapshot=opts.snapshot,
                    labels=labels,
                    **extra,
                )
            else:
                params = CreateSandboxFromImageParams(
                    name=self._create_name,
                    image=opts.image,
                    resources=opts.resources,
                    labels=labels,
                    **extra,
                )
            try:
                # The SDK's own timeout covers its polling for the started state; the
                # margin is for its requests around that.
                self.sandbox = await self.timed(
                    "create the sandbox",
                    self.client.create(params, timeout=opts.create_timeout_s),
                    opts.create_timeout_s + opts.call_timeout_s,
                )
            except DaytonaError as exc:
                self._created_id = getattr(exc, "sandbox_id", None)
                if refused(exc):  # nothing was created: nothing to look for
                    self._create_name = None
                raise self.error(exc, "create the sandbox") from None
        await self._prepare()
        self._ready = True

    async def _prepare(self) -> None:
        response = await self.call(
            "prepare the sandbox", self.process.exec(f"sh -c {shlex.quote(_PREPARE)}")
        )
        lines = (response.result or "").strip().splitlines()
        if response.exit_code != 0 or len(lines) < 2:
            detail = self.options.api_key.redact(response.result or "")[:300]
            raise ProviderError(
                f"could not prepare the sandbox: exit code {response.exit_code}: {detail}"
            )
        self.state_dir, self.workdir = lines[-2].strip(), lines[-1].strip()

    def deletes_sandbox(self) -> bool:
        """Whether stopping deletes the sandbox: a failed start undoes only what it
        created; a started session deletes unless kept."""
        if not self._ready:
            return self.options.attach_id is None
        return not self.options.keep

    async def stop(self) -> None:
        """Delete the sandbox unless kept (a half-created one is found by name and
        deleted), then close the client; every call bounded, the first failure raised."""
        client, sandbox = self.client, self.sandbox
        delete = self.deletes_sandbox()
        errors: list[BaseException] = []
        try:
            if client is not None and sandbox is None and self._create_name is not None:
                try:  # creating failed or was cancelled: the sandbox may exist anyway
                    sandbox = await self.bounded(self._find_created(client))
                except Exception as exc:
                    errors.append(exc)
            if sandbox is not None and delete:
                try:
                    await self.bounded(sandbox.delete())
                except DaytonaError as exc:
                    if not is_not_found(exc):
                        errors.append(exc)
                except Exception as exc:
                    errors.append(exc)
        finally:
            self.sandbox = self.client = None
            self._create_name = self._created_id = None
            self._ready = False
            if client is not None:
                try:
                    await self.bounded(client.close())
                except Exception as exc:
                    errors.append(exc)
        if errors:
            raise self.teardown_error(errors[0], "delete the sandbox")

    async def _find_created(self, client: Any) -> Any:
        for key in (self._created_id, self._create_name):
            if not key:
                continue
            try:
                return await client.get(key)
            except DaytonaError as exc:
                if not is_not_found(exc):
                    raise
        return None
