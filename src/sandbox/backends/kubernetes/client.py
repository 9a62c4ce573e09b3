"""The HTTP and WebSocket client of one session: one `aiohttp.ClientSession`.

Plain calls (`call`) run under a whole-call deadline and read at most
`bounds.MAX_API_BODY_BYTES`; a watch (`watch`) yields one event per line, each line
bounded; an exec (`exec_socket`) is a WebSocket upgrade of
`GET /api/v1/namespaces/{ns}/pods/{pod}/exec` offering `v5.channel.k8s.io` first and
`v4.channel.k8s.io` second (kubelet and apiserver accept the first they support: see
`channels`). aiohttp exceptions are never chained into ours (they carry the request's
headers, and so the token).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator, Mapping, Sequence
from typing import Any
from urllib.parse import quote, urlencode

import aiohttp

from ...errors import ConnectionLostError, ProviderError
from ..toolkit import transport_error
from . import bounds
from .config import Cluster
from .errors import SERVICE, api_error

V5_PROTOCOL = "v5.channel.k8s.io"
V4_PROTOCOL = "v4.channel.k8s.io"
PROTOCOLS = (V5_PROTOCOL, V4_PROTOCOL)


class KubeClient:
    """Calls to one API server on behalf of one session."""

    def __init__(
        self,
        cluster: Cluster,
        *,
        api_timeout: float = bounds.DEFAULT_API_TIMEOUT_S,
        protocols: Sequence[str] = PROTOCOLS,
    ) -> None:
        self.cluster = cluster
        self.api_timeout = api_timeout
        self.protocols = tuple(protocols)
        self._http: aiohttp.ClientSession | None = None
        # The subprotocol the last exec agreed on (the server's answer does not change
        # within a session: the session's first exec, a probe, learns it).
        self.agreed: str | None = None

    def __repr__(self) -> str:
        return f"KubeClient({self.cluster!r})"

    def _session(self) -> aiohttp.ClientSession:
        if self._http is None:
            self._http = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(ssl=self.cluster.ssl),
                timeout=aiohttp.ClientTimeout(total=None),
            )
        return self._http

    async def close(self) -> None:
        """Close every connection (open exec sockets are closed by their owners first)."""
        http, self._http = self._http, None
        if http is not None:
            await http.close()

    def url(self, path: str, params: Mapping[str, Any] | Sequence[tuple[str, str]] = ()) -> str:
        """The server's URL for `path` with query `params`."""
        query = urlencode(params, doseq=True, quote_via=quote)
        return f"{self.cluster.server}{path}" + (f"?{query}" if query else "")

    async def _headers(self) -> dict[str, str]:
        headers = {"Accept": "application/json"}
        authorization = await self.cluster.authorization()
        if authorization:
            headers["Authorization"] = authorization
        return headers

    def _lost(self, exc: BaseException, what: str) -> ConnectionLostError:
        return transport_error(exc, what, service=SERVICE)

    async def call(
        self,
        method: str,
        path: str,
        what: str,
        *,
        body: Mapping[str, Any] | None = None,
        params: Mapping[str, Any] | None = None,
        allow: Sequence[int] = (),
    ) -> tuple[int, dict[str, Any]]:
        """One request, the reply's JSON (a 2xx, or a status in `allow`); otherwise the
        Status as our error. Whole call within `api_timeout`."""
        try:
            async with asyncio.timeout(self.api_timeout):
                headers = await self._headers()
                async with self._session().request(
                    method,
                    self.url(path, params or {}),
                    json=body,
                    headers=headers,
                    allow_redirects=False,
                ) as response:
                    data = await _read_bounded(response, bounds.MAX_API_BODY_BYTES, what)
                    status = response.status
        except ProviderError:
            raise
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            raise self._lost(exc, what) from None
        if status in allow or 200 <= status < 300:
            try:
                value = json.loads(data) if data else {}
            except ValueError:
                value = {}
            return status, value if isinstance(value, dict) else {}
        raise api_error(status, data, what, secrets=self.cluster.secrets())

    async def watch(
        self, path: str, params: Mapping[str, Any], what: str
    ) -> AsyncGenerator[dict[str, Any], None]:
        """The events of a watch (`watch=true` added), one JSON object per line, each
        line at most `MAX_WATCH_LINE_BYTES`. The caller bounds the whole watch."""
        try:
            headers = await self._headers()
            async with self._session().get(
                self.url(path, {**params, "watch": "true"}), headers=headers
            ) as response:
                if response.status != 200:
                    data = await _read_bounded(response, bounds.MAX_API_BODY_BYTES, what)
                    raise api_error(response.status, data, what, secrets=self.cluster.secrets())
                buffer = bytearray()
                async for chunk in response.content.iter_any():
                    buffer.extend(chunk)
                    while (end := buffer.find(b"\n")) >= 0:
                        line = bytes(buffer[:end])
                        del buffer[: end + 1]
                        if line.strip():
                            yield _event(line, what)
                    if len(buffer) > bounds.MAX_WATCH_LINE_BYTES:
                        raise ProviderError(
                            f"could not {what}: a watch event exceeded "
                            f"{bounds.MAX_WATCH_LINE_BYTES} bytes"
                        )
                if buffer.strip():
                    yield _event(bytes(buffer), what)
        except ProviderError:
            raise
        except (aiohttp.ClientError, OSError) as exc:
            raise self._lost(exc, what) from None

    async def exec_socket(
        self,
        namespace: str,
        pod: str,
        container: str | None,
        argv: Sequence[str],
        *,
        stdin: bool,
        tty: bool,
        what: str,
    ) -> aiohttp.ClientWebSocketResponse:
        """The upgraded pods/exec WebSocket (its `protocol` says which was agreed)."""
        params: list[tuple[str, str]] = [("command", arg) for arg in argv]
        if container:
            params.append(("container", container))
        params += [
            ("stdin", "true" if stdin else "false"),
            ("stdout", "true"),
            ("stderr", "false" if tty else "true"),
            ("tty", "true" if tty else "false"),
        ]
        path = f"/api/v1/namespaces/{quote(namespace, safe='')}/pods/{quote(pod, safe='')}/exec"
        try:
            async with asyncio.timeout(bounds.EXEC_CONNECT_TIMEOUT_S):
                headers = await self._headers()
                del headers["Accept"]
                ws = await self._session().ws_connect(
                    self.url(path, params),
                    protocols=self.protocols,
                    headers=headers,
                    max_msg_size=bounds.MAX_FRAME_BYTES,
                    autoping=True,
                )
        except aiohttp.WSServerHandshakeError as exc:
            # aiohttp keeps no body of a refused upgrade: say what the status means.
            status = exc.status or 0
            detail = {
                401: "the credentials were not accepted",
                403: "pods/exec is forbidden for these credentials (RBAC: create and get "
                "on pods/exec), or the server speaks none of the offered protocols",
                404: "no such pod",
            }.get(status, "")
            raise api_error(status, detail.encode(), what, secrets=self.cluster.secrets()) from None
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            raise self._lost(exc, what) from None
        if ws.protocol not in self.protocols:
            await ws.close()
            raise ProviderError(
                f"could not {what}: the server agreed on no channel protocol we speak "
                f"({ws.protocol!r}; offered {', '.join(self.protocols)})"
            )
        self.agreed = ws.protocol
        return ws


def _event(line: bytes, what: str) -> dict[str, Any]:
    try:
        value = json.loads(line)
    except ValueError:
        raise ProviderError(f"could not {what}: a watch event was not JSON") from None
    if not isinstance(value, dict):
        raise ProviderError(f"could not {what}: a watch event was not an object")
    return value


async def _read_bounded(response: aiohttp.ClientResponse, limit: int, what: str) -> bytes:
    """The body, refused beyond `limit` bytes (announced or not)."""
    if response.content_length is not None and response.content_length > limit:
        raise ProviderError(f"could not {what}: the reply exceeded {limit} bytes")
    data = bytearray()
    async for chunk in response.content.iter_any():
        data.extend(chunk)
        if len(data) > limit:
            raise ProviderError(f"could not {what}: the reply exceeded {limit} bytes")
    return bytes(data)
