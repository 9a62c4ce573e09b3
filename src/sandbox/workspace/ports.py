"""`ExposedPort`: how a client outside the sandbox reaches a server listening inside."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from ..errors import InvalidArgumentError


@dataclass(frozen=True)
class ExposedPort:
    """A port of the sandbox as seen from outside: `url` (http or https, ending in
    "/"), `host` and `port` to connect to, `tls` when the URL is https, and `headers`
    a client must send (a provider's preview token). The headers are secrets: they
    are left out of the repr."""

    url: str
    host: str
    port: int
    tls: bool = False
    headers: Mapping[str, str] = field(default_factory=dict, repr=False)

    def __repr__(self) -> str:
        names = sorted(self.headers)
        return f"ExposedPort(url={self.url!r}, host={self.host!r}, port={self.port}, " + (
            f"tls={self.tls}, headers={names} (values hidden))"
        )


def check_port(port: object) -> int:
    """A TCP port number: an int in 1..65535 (not a bool)."""
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise InvalidArgumentError(f"port must be an int in 1..65535, not {port!r}")
    return port


def http_url(host: str, port: int, *, tls: bool = False) -> str:
    """`http(s)://host:port/`, with an IPv6 host in brackets."""
    shown = f"[{host}]" if ":" in host else host
    return f"{'https' if tls else 'http'}://{shown}:{port}/"


def exposed_from_url(url: str, headers: Mapping[str, str] | None = None) -> ExposedPort:
    """The `ExposedPort` of a provider's preview `url` (its host and port; https: TLS)."""
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InvalidArgumentError("the provider answered a preview URL that is not http(s)")
    tls = parts.scheme == "https"
    port = parts.port or (443 if tls else 80)
    shown = url if url.endswith("/") else url + "/"
    return ExposedPort(
        url=shown, host=parts.hostname, port=port, tls=tls, headers=dict(headers or {})
    )
