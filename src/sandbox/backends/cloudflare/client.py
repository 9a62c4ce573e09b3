"""The Worker's HTTP API: one `aiohttp.ClientSession` per sandbox session, the URLs,
plain requests (`call`) and short control execs of our own (`control`).

The protocol is the bridge Worker of cloudflare/sandbox-sdk (docs/providers.md,
"Cloudflare"): `POST /v1/sandbox` creates, `DELETE .../{id}` deletes (204, also when
gone), `GET .../{id}/running` answers ``{"running": bool}``, `POST .../{id}/exec` answers
a server-sent-event stream (base64 `stdout`/`stderr`, then `exit` or `error`),
`GET|PUT .../{id}/file/<path>`, `POST|DELETE .../{id}/session[/{sid}]` and the
`.../{id}/pty` WebSocket. The API key travels only in the `Authorization` header; it is
held in a `Secret`.
"""

from __future__ import annotations

import asyncio
import binascii
import re
from collections.abc import AsyncIterator, Callable
from typing import Any
from urllib.parse import quote

import aiohttp
from yarl import URL

from ...errors import ConnectionLostError, InvalidArgumentError, ProviderError, SandboxError
from ..toolkit import Secret
from .bounds import MAX_CONTROL_OUTPUT, MAX_ERROR_BODY, MAX_JSON_BODY
from .errors import exit_status, json_object, status_error, transport_failure
from .sse import SseDecoder, SseEvent

# routes.ts: the bridge refuses any other sandbox id with 400.
SANDBOX_ID_RE = re.compile(r"[a-z2-7]{1,128}")
# Bytes asked of the connection at a time while a body is read.
READ_CHUNK = 64 * 1024


class BodyTooLarge(Exception):
    """A response body went past its bound (`read_bounded`); `size` is the announced
    length when the Worker sent one, else None."""

    def __init__(self, size: int | None) -> None:
        super().__init__(size)
        self.size = size


async def read_bounded(resp: aiohttp.ClientResponse, limit: int) -> bytes:
    """The whole body, never holding more than `limit` bytes of it (plus one chunk's
    worth being read): `BodyTooLarge` past it, announced or not."""
    announced = resp.content_length
    if announced is not None and announced > limit:
        raise BodyTooLarge(announced)
    body = bytearray()
    while True:
        chunk = await resp.content.read(min(READ_CHUNK, limit + 1 - len(body)))
        if not chunk:
            return bytes(body)
        body += chunk
        if len(body) > limit:
            raise BodyTooLarge(None)


async def read_prefix(resp: aiohttp.ClientResponse, limit: int) -> bytes:
    """At most the first `limit` bytes of the body (an error's explanation): the rest
    is left unread."""
    body = bytearray()
    while len(body) < limit:
        chunk = await resp.content.read(limit - len(body))
        if not chunk:
            break
        body += chunk
    return bytes(body)


def too_large_error(what: str, limit: int) -> ProviderError:
    """Our error for an answer past its bound: not something the Worker sends."""
    return ProviderError(
        f"could not {what}: the Worker's answer is larger than {limit} bytes", retryable=False
    )


def quote_segment(segment: str) -> str:
    """One URL path segment, percent-encoded (dot segments too: the bridge must not
    resolve them)."""
    if segment in (".", ".."):
        return segment.replace(".", "%2E")
    return quote(segment, safe="")


def decode_base64(event: SseEvent) -> bytes:
    """The bytes of a `stdout`/`stderr` event; `ProviderError` when it is not base64."""
    try:
        return binascii.a2b_base64(event.data.encode("ascii"), strict_mode=False)
    except (binascii.Error, UnicodeEncodeError):
        raise ProviderError(
            f"the Worker sent a malformed {event.event} event (not base64)", retryable=False
        ) from None


async def stream_events(resp: aiohttp.ClientResponse) -> AsyncIterator[SseEvent]:
    """The events of an exec stream as the chunks arrive, then whatever the stream's end
    completes (a last event without its blank line)."""
    decoder = SseDecoder()
    async for chunk in resp.content.iter_any():
        for event in decoder.feed(chunk):
            yield event
    for event in decoder.finish():
        yield event


class WorkerClient:
    """The HTTP side of one session: base URL, key, timeouts and the client session."""

    def __init__(
        self,
        url_text: str,
        key: Secret,
        *,
        request_timeout_s: float,
        connect_timeout_s: float,
    ) -> None:
        try:
            url = URL(url_text)
        except (TypeError, ValueError):
            url = URL()
        if url.scheme not in ("http", "https") or not url.host:
            # The URL itself is not shown: it could carry a token of its own.
            raise InvalidArgumentError("worker_url must be an http:// or https:// URL")
        self.api_root = url.with_query(None).with_fragment(None).with_user(None)
        self.origin = f"{url.scheme}://{url.host}" + (f":{url.port}" if url.explicit_port else "")
        self.key = key
        self.request_timeout_s = request_timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.http: aiohttp.ClientSession | None = None
        self.sandbox_id: str | None = None

    def __repr__(self) -> str:
        return f"<WorkerClient worker={self.origin!r} sandbox={self.sandbox_id!r}>"

    def open(self) -> None:
        """Create the client session (one connection pool for every request)."""
        self.http = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0),
            timeout=aiohttp.ClientTimeout(
                total=None, sock_connect=self.connect_timeout_s, connect=self.connect_timeout_s
            ),
        )

    async def close(self) -> None:
        """Close the client session (idempotent)."""
        http, self.http = self.http, None
        if http is not None:
            await http.close()

    def session(self) -> aiohttp.ClientSession:
        """The open client session; `ProviderError` once closed."""
        if self.http is None:
            raise ProviderError("the Worker connection is closed", retryable=False)
        return self.http

    def headers(self) -> dict[str, str]:
        """The request headers: the bearer key."""
        return {"Authorization": f"Bearer {self.key.reveal()}"}

    def url(self, *segments: str) -> URL:
        """`{worker}/v1/sandbox/<segments>`, each segment encoded on its own."""
        path = "/".join(quote_segment(s) for s in ("v1", "sandbox", *segments))
        base = self.api_root.raw_path.rstrip("/")
        return self.api_root.with_path(f"{base}/{path}", encoded=True)

    def sandbox_url(self, *segments: str) -> URL:
        """A URL under the sandbox in use."""
        if self.sandbox_id is None:
            raise ProviderError("the sandbox has not been created", retryable=False)
        return self.url(self.sandbox_id, *segments)

    def file_url(self, relative: str) -> URL:
        """The bridge resolves ``'/' + <path>``: a workspace path is sent as
        ``workspace/<relative>``, each segment percent-encoded on its own."""
        url = self.sandbox_url("file")
        segments = ["workspace", *([] if relative == "." else relative.split("/"))]
        encoded = "/".join(quote_segment(s) for s in segments)
        return url.with_path(f"{url.raw_path}/{encoded}", encoded=True)

    async def call(
        self,
        method: str,
        url: URL,
        what: str,
        *,
        json_body: Any = None,
        data: bytes | None = None,
        special: dict[int, SandboxError] | None = None,
        accept: frozenset[int] = frozenset(),
        max_body: int = MAX_JSON_BODY,
        too_large: Callable[[int | None], SandboxError] | None = None,
    ) -> tuple[int, bytes]:
        """One plain request: returns (status, body) for a 2xx or an `accept`ed status;
        raises the `special` error for its status, else the mapped provider error.

        The whole call, body included, is bounded by the request timeout (a peer
        trickling a byte at a time fails too), and the body by `max_body` bytes (an
        error's by `MAX_ERROR_BODY`): past it, `too_large(announced size)` or a
        `ProviderError`."""
        http = self.session()
        failure: SandboxError | None = None
        status, body = 0, b""
        try:
            async with asyncio.timeout(self.request_timeout_s):
                async with http.request(
                    method,
                    url,
                    headers=self.headers(),
                    json=json_body,
                    data=data,
                    allow_redirects=False,
                ) as resp:
                    status = resp.status
                    if 200 <= status < 300 or status in accept:
                        body = await read_bounded(resp, max_body)
                    else:
                        body = await read_prefix(resp, MAX_ERROR_BODY)
        except BodyTooLarge as exc:
            failure = too_large_error(what, max_body) if too_large is None else too_large(exc.size)
        except TimeoutError:
            failure = transport_failure(None, what, timed_out=True)
        except aiohttp.ClientError as exc:
            failure = transport_failure(exc, what)
        if failure is not None:
            raise failure  # outside the except block: the aiohttp error is not chained
        if 200 <= status < 300 or status in accept:
            return status, body
        if special and status in special:
            raise special[status]
        raise status_error(status, what, body, self.key)

    async def control(
        self, argv: list[str], what: str, *, limit: float | None = None
    ) -> tuple[int, bytes]:
        """Run a short command of our own (kill, stat) and return (status, stdout),
        within `limit` seconds (default: the request timeout)."""
        limit = self.request_timeout_s if limit is None else limit
        http = self.session()
        out = bytearray()
        failure: SandboxError | None = None
        code: int | None = None
        try:
            async with asyncio.timeout(limit):
                async with http.post(
                    self.sandbox_url("exec"),
                    headers=self.headers(),
                    json={"argv": argv},
                    allow_redirects=False,
                ) as resp:
                    if resp.status != 200:
                        body = await read_prefix(resp, MAX_ERROR_BODY)
                        failure = status_error(resp.status, what, body, self.key)
                    else:
                        async for event in stream_events(resp):
                            if event.event == "stdout" and len(out) < MAX_CONTROL_OUTPUT:
                                out += decode_base64(event)
                            elif event.event == "exit":
                                code = exit_status(json_object(event.data).get("exit_code"))
                            elif event.event == "error":
                                failure = ProviderError(
                                    f"could not {what}: the Worker reported an error",
                                    retryable=False,
                                )
        except TimeoutError:
            failure = transport_failure(None, what, timed_out=True)
        except aiohttp.ClientError as exc:
            failure = transport_failure(exc, what)
        if failure is None and code is None:
            failure = ConnectionLostError(f"could not {what}: no exit status arrived")
        if failure is not None:
            raise failure
        assert code is not None
        return code, bytes(out)
