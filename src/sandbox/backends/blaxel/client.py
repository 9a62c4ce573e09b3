"""One session's way to Blaxel: its credentials (each in a `Secret`), the SDK calls made
with them, the sandbox's SDK instance and the aiohttp session the terminals use.

The API key travels in headers and in the terminal URL (`?token=`): every provider text
is redacted of it (in each form a URL may carry) and SDK exceptions are never chained.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar
from urllib.parse import quote, urlencode, urlsplit, urlunsplit

import aiohttp
import yarl

from ...errors import SandboxError, SessionGoneError
from ..toolkit import Secret, redact, transport_error
from .bounds import answer_limit, bound_client
from .errors import SERVICE, BlaxelAPIError, map_error
from .sdk import (
    SandboxInstance,
    configure_sdk,
    pool_generated_clients,
    release_shared_client,
    track_loop,
)

T = TypeVar("T")

# Sandbox statuses (blaxel==0.4.24 `client/models/status.py`) after which nothing it ran
# is left to resume.
GONE_STATUSES = frozenset({"TERMINATED", "DELETING", "FAILED"})
# The label that marks a sandbox this library created, with the durable session's id: a
# resume checks it before it takes on the sandbox's deletion (`durable.check_created`).
SESSION_LABEL = "sandbox.session"


class BlaxelClient:
    """The credentials and clients of one session (see the module docstring)."""

    def __init__(
        self,
        *,
        api_key: str,
        workspace: str,
        api_url: str | None,
        api_timeout_s: float,
        max_response_bytes: int,
    ) -> None:
        self._api_key = Secret(api_key)
        self._workspace = Secret(workspace)
        self._api_url = api_url
        self.api_timeout_s = api_timeout_s
        self.max_response_bytes = max_response_bytes
        self.http: aiohttp.ClientSession | None = None
        self.instance: SandboxInstance | None = None
        self.sandbox_url: str | None = None

    @property
    def secrets(self) -> tuple[str, ...]:
        """Every form of the API key a provider text may echo (raw, percent-encoded)."""
        key = self._api_key.reveal()
        return (key, quote(key, safe=""), quote(key))

    def redact(self, text: str) -> str:
        """`text` with every form of the API key replaced by the toolkit's marker."""
        return redact(text, self.secrets)

    def auth_headers(self) -> dict[str, str]:
        """The headers that authenticate a call to the sandbox."""
        return {
            "X-Blaxel-Authorization": f"Bearer {self._api_key.reveal()}",
            "X-Blaxel-Workspace": self._workspace.reveal(),
        }

    def apply_sdk_config(self) -> None:
        """Make the SDK's process-wide credentials this session's (see `sdk`)."""
        configure_sdk(
            api_key=self._api_key.reveal(),
            workspace=self._workspace.reveal(),
            api_url=self._api_url,
        )

    def sandbox(self) -> SandboxInstance:
        """The SDK's instance for this sandbox (after `open`)."""
        if self.instance is None:
            raise SandboxError("the blaxel session is not started")
        return self.instance

    async def call(
        self,
        what: str,
        fn: Callable[[], Awaitable[T]],
        *,
        timeout: float | None = None,
        max_bytes: int | None = None,
    ) -> T:
        """Run one SDK call (trying to `what`) with this session's credentials applied,
        bounded by `timeout` (default `api_timeout_s`) as a whole, each answer by
        `max_bytes` (default `max_response_bytes`; see `bounds`), every failure mapped
        by `errors.map_error` and raised outside the `except` block (not chained)."""
        self.apply_sdk_config()
        limit = self.api_timeout_s if timeout is None else timeout
        error: SandboxError
        try:
            with answer_limit(self.max_response_bytes if max_bytes is None else max_bytes):
                async with asyncio.timeout(None if math.isinf(limit) else limit):
                    return await fn()
        except TimeoutError:
            error = transport_error(None, what, service=SERVICE, timed_out=True)
        except Exception as exc:
            error = map_error(exc, what, self.secrets)
        raise error

    def prepare(self) -> None:
        """Open the terminals' aiohttp session and note the loop (before a create, an
        attach or a fork; `close` undoes it)."""
        track_loop(self)
        self.http = aiohttp.ClientSession()

    async def open(self, name: str, config: dict[str, Any], create_timeout: int | None) -> None:
        """Create (or attach to) the sandbox `name` and bind an instance to its URL with
        this session's headers. `close` undoes a half-done open."""
        self.prepare()
        created = await self.call(
            f"create the Blaxel sandbox {name!r}",
            lambda: SandboxInstance.create_if_not_exists(config, timeout=create_timeout),
        )
        self.bind(created)

    def labels(self) -> dict[str, str]:
        """The sandbox's labels as Blaxel last answered them (its `metadata.labels`: the
        create's, or the attach's `SandboxInstance.get`)."""
        metadata = getattr(self.sandbox(), "metadata", None)
        labels: Any = getattr(metadata, "labels", None)
        if hasattr(labels, "to_dict"):  # the SDK's `MetadataLabels`
            labels = labels.to_dict()
        if not isinstance(labels, dict):  # UNSET or None: no labels
            return {}
        return {str(k): v for k, v in labels.items() if isinstance(v, str)}

    def bind(self, found: SandboxInstance) -> None:
        """Keep an instance bound to the sandbox's URL with this session's headers."""
        # `process.url` honours the sandbox's own URL and BL_SANDBOXES_<NAME>_URL.
        url: str = found.process.url
        self.sandbox_url = url
        instance = SandboxInstance(found.sandbox, force_url=url, headers=self.auth_headers())
        for action in (instance.process, instance.fs):
            bound_client(action.get_client())
            pool_generated_clients(action)
        self.instance = instance

    async def attach(self, name: str) -> None:
        """Attach to the existing sandbox `name` (a resume): `SessionGoneError` when
        Blaxel has no such sandbox, or only its TERMINATED, DELETING or FAILED record
        (`SandboxInstance.get` answers a deleted sandbox with status TERMINATED for a
        while). Never creates one. `close` undoes a half-done attach."""
        self.prepare()
        try:
            found = await self.call(
                f"find the Blaxel sandbox {name!r}", lambda: SandboxInstance.get(name)
            )
        except BlaxelAPIError as exc:
            if exc.status != 404:
                raise
            raise SessionGoneError(f"the Blaxel sandbox {name!r} no longer exists") from None
        status = str(found.status or "").upper()
        if status in GONE_STATUSES:
            raise SessionGoneError(f"the Blaxel sandbox {name!r} is gone (status {status})")
        self.bind(found)

    async def delete(self, name: str) -> None:
        """Delete the sandbox `name` (one already gone is fine)."""
        try:
            await self.call(
                f"delete the Blaxel sandbox {name!r}", lambda: SandboxInstance.delete(name)
            )
        except BlaxelAPIError as exc:
            if exc.status != 404:
                raise

    async def close(self) -> None:
        """Release every client (the SDK's per-helper ones, ours, the shared one last)."""
        instance, self.instance = self.instance, None
        http, self.http = self.http, None
        try:
            if instance is not None:
                # The SDK opens one httpx client per helper and never closes them.
                for action in (instance.process, instance.fs):
                    with contextlib.suppress(Exception):
                        await action.get_client().aclose()
        finally:
            if http is not None:
                await http.close()
            await release_shared_client(self)

    def terminal_url(
        self, session_id: str, rows: int, cols: int, cwd: str, shell: str | None = None
    ) -> yarl.URL:
        """The terminal WebSocket URL (`shell`: the program a NEW session runs). It
        holds the API key: never log or raise it."""
        base = urlsplit(self.sandbox_url or "")
        scheme = {"https": "wss", "http": "ws"}.get(base.scheme, base.scheme)
        params: dict[str, str | int] = {
            "token": self._api_key.reveal(),
            "cols": cols,
            "rows": rows,
            "sessionId": session_id,
            "workingDir": cwd,
        }
        if shell is not None:
            params["shell"] = shell
        query = urlencode(params, quote_via=quote)
        path = base.path.rstrip("/") + "/terminal/ws"
        return yarl.URL(urlunsplit((scheme, base.netloc, path, query, "")), encoded=True)
