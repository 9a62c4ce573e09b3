"""Who may talk to `sandbox mcp --http`: the Host and Origin checks and the bearer token.

The MCP SDK turns its DNS-rebinding protection on only when the server is bound to
exactly `127.0.0.1`, `localhost` or `::1` (and then accepts any port), so a server on
any other address, loopback ones included, answered a web page whose name resolves to
it. `RequestGuard` is an ASGI middleware in front of the SDK's app that checks every
request, whatever the bind address, before the SDK sees it:

- Host must name the bound address with its port, or, when the server listens on
  loopback (or on every address), `localhost`, `127.0.0.1` or `[::1]` with the port,
  or a name given with `--allow-host`; otherwise 403.
- Origin must be absent (not a browser), one of those hosts as an `http://` origin, or
  a value given with `--allow-origin`; otherwise 403.
- With a token, `Authorization: Bearer TOKEN` must carry it (compared in constant
  time); otherwise 401. The server refuses to listen on a non-loopback address
  without one (`require_token_for`).

A refused request never reaches the SDK: no MCP session is created, nothing runs.
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..backends.toolkit.credentials import Secret
from ..errors import InvalidArgumentError

logger = logging.getLogger("sandbox.mcp")

TOKEN_ENV = "SANDBOX_MCP_TOKEN"
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
# The longest token file read: a token is a line, not a document.
TOKEN_FILE_MAX_BYTES = 4096

_ASGIApp = Any  # Starlette's ASGI callables; typed loosely to keep this module SDK-free


def _normal_host(name: str) -> str:
    """`name` as compared: lower case, an IP literal in its canonical form."""
    name = name.lower()
    try:
        return ipaddress.ip_address(name).compressed
    except ValueError:
        return name


def parse_host_port(text: str) -> tuple[str, int] | None:
    """The (host, port) of a Host header value (`name[:port]`, `[v6][:port]`), the port
    80 when absent; None when it is not of that form."""
    if text.startswith("["):
        inside, bracket, rest = text[1:].partition("]")
        if not bracket or not inside:
            return None
        host = inside
        if not rest:
            return _normal_host(host), 80
        if not rest.startswith(":"):
            return None
        port_text = rest[1:]
    else:
        host, colon, port_text = text.partition(":")
        if not host or ":" in port_text:
            return None
        if not colon:
            return _normal_host(host), 80
    if not port_text.isdigit() or len(port_text) > 5 or int(port_text) > 65535:
        return None
    return _normal_host(host), int(port_text)


def _http_origin(host: str, port: int) -> str:
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}" if port == 80 else f"http://{shown}:{port}"


def normal_origin(text: str) -> str:
    """An `--allow-origin` value as compared with an Origin header: lower case, no
    trailing slash (an origin has no path)."""
    return text.strip().lower().rstrip("/")


@dataclass(frozen=True)
class AccessPolicy:
    """What the guard accepts: Host pairs, Origin values and the token, if any."""

    hosts: frozenset[tuple[str, int]]
    origins: frozenset[str]
    token: Secret | None = field(default=None, repr=False)

    @classmethod
    def for_bind(
        cls,
        bound: str,
        port: int,
        *,
        names: Iterable[str] = (),
        allow_origins: Iterable[str] = (),
        token: Secret | None = None,
    ) -> AccessPolicy:
        """The policy of a server listening on `bound` (an IP address) and `port`.

        `names` are further host names the server is reached by (the one it was asked
        to bind, `--allow-host` values), each accepted with `port`.
        """
        address = ipaddress.ip_address(bound.partition("%")[0])
        accepted = {address.compressed, *(_normal_host(name) for name in names)}
        if address.is_loopback or address.is_unspecified:
            accepted.update(LOOPBACK_NAMES)
        hosts = frozenset((host, port) for host in accepted)
        origins = {_http_origin(host, port) for host, port in hosts}
        origins.update(normal_origin(value) for value in allow_origins)
        return cls(hosts=hosts, origins=frozenset(origins), token=token)

    def host_allowed(self, value: str) -> bool:
        """Whether a Host header value names this server."""
        parsed = parse_host_port(value)
        return parsed is not None and parsed in self.hosts

    def origin_allowed(self, value: str) -> bool:
        """Whether an Origin header value is one this server answers."""
        return normal_origin(value) in self.origins

    def token_matches(self, authorization: bytes | None) -> bool:
        """Whether an Authorization header carries the token (True without a token)."""
        if self.token is None:
            return True
        if authorization is None:
            return False
        scheme, _, given = authorization.strip().partition(b" ")
        if scheme.lower() != b"bearer":
            return False
        return hmac.compare_digest(given.strip(), self.token.reveal().encode("ascii"))


def _shown(value: bytes | None) -> str | None:
    """A header value as logged: text, cut short (it is the client's, any length)."""
    return None if value is None else value[:200].decode("latin-1")


def _single(headers: Iterable[tuple[bytes, bytes]], name: bytes) -> tuple[bool, bytes | None]:
    """(ok, value) of a header that may appear at most once."""
    values = [value for key, value in headers if key.lower() == name]
    if len(values) > 1:
        return False, None
    return True, (values[0] if values else None)


class RequestGuard:
    """ASGI middleware that admits a request only when `policy` accepts it."""

    def __init__(self, app: _ASGIApp, policy: AccessPolicy) -> None:
        self.app = app
        self.policy = policy

    async def __call__(self, scope: Mapping[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await self.app(scope, receive, send)
            return
        if scope["type"] != "http":
            # Nothing here speaks WebSocket: refuse it before anything else sees it.
            await send({"type": "websocket.close", "code": 1008})
            return
        refusal = self._refusal(scope.get("headers", ()))
        if refusal is None:
            await self.app(scope, receive, send)
            return
        status, body, extra = refusal
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [
                    (b"content-type", b"text/plain; charset=utf-8"),
                    (b"content-length", str(len(body)).encode()),
                    *extra,
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})

    def _refusal(
        self, headers: Iterable[tuple[bytes, bytes]]
    ) -> tuple[int, bytes, list[tuple[bytes, bytes]]] | None:
        headers = list(headers)
        ok, host = _single(headers, b"host")
        if not ok or host is None or not self.policy.host_allowed(host.decode("latin-1")):
            logger.warning("refused a request for Host %r", _shown(host))
            return 403, b"forbidden: this Host is not served here\n", []
        ok, origin = _single(headers, b"origin")
        if not ok or (
            origin is not None and not self.policy.origin_allowed(origin.decode("latin-1"))
        ):
            logger.warning("refused a request from Origin %r", _shown(origin))
            return 403, b"forbidden: this Origin is not allowed (see --allow-origin)\n", []
        ok, authorization = _single(headers, b"authorization")
        if not ok or not self.policy.token_matches(authorization):
            logger.warning("refused a request without the bearer token")
            return (
                401,
                b"unauthorized: a bearer token is required\n",
                [(b"www-authenticate", b'Bearer realm="sandbox mcp"')],
            )
        return None


def _check_token(text: str, where: str) -> Secret:
    if not text:
        raise InvalidArgumentError(f"{where} is empty: the bearer token must not be")
    if not all("!" <= char <= "~" for char in text):
        raise InvalidArgumentError(
            f"{where}: the bearer token must be printable ASCII without spaces"
        )
    return Secret(text)


def read_token(token_file: str | None, environ: Mapping[str, str] = os.environ) -> Secret | None:
    """The bearer token: `token_file`'s content (stripped) if given, else the value of
    `SANDBOX_MCP_TOKEN` if set, else None. `InvalidArgumentError` for a file that cannot
    be read and for an empty or malformed token (the message never holds the token)."""
    if token_file is not None:
        try:
            with Path(token_file).open("rb") as handle:
                data = handle.read(TOKEN_FILE_MAX_BYTES + 1)
        except OSError as exc:
            raise InvalidArgumentError(
                f"--token-file {token_file}: {exc.strerror or exc}"
            ) from None
        if len(data) > TOKEN_FILE_MAX_BYTES:
            raise InvalidArgumentError(
                f"--token-file {token_file}: more than {TOKEN_FILE_MAX_BYTES} bytes"
            )
        try:
            text = data.decode("ascii").strip()
        except UnicodeDecodeError:
            raise InvalidArgumentError(
                f"--token-file {token_file}: the bearer token must be printable ASCII"
            ) from None
        return _check_token(text, f"--token-file {token_file}")
    if TOKEN_ENV in environ:
        return _check_token(environ[TOKEN_ENV].strip(), TOKEN_ENV)
    return None


def require_token_for(address: str, token: Secret | None) -> None:
    """`InvalidArgumentError` when `address` (the IP to bind) is not loopback and there
    is no token: anyone who can reach such a server could run commands."""
    if token is None and not ipaddress.ip_address(address.partition("%")[0]).is_loopback:
        raise InvalidArgumentError(
            f"refusing to serve MCP on {address}, which is not a loopback address, without "
            f"authentication: set {TOKEN_ENV} or pass --token-file"
        )
