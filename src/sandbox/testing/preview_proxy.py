"""A loopback HTTP forwarder standing in for a provider's preview edge: requests to its
own port reach `127.0.0.1:<target>` (where the fake sandbox's local processes listen),
after the check the provider's edge makes (a token header, or none). Used by the fakes
and stand-ins for `expose_port`; one aiohttp server per exposed port, closed with its
sandbox. Bodies are bounded (`MAX_BODY`), like every answer a peer controls here."""

from __future__ import annotations

import aiohttp
from aiohttp import web

MAX_BODY = 16 * 1024 * 1024

__all__ = ["MAX_BODY", "PreviewProxy"]


class PreviewProxy:
    """Forwards to `target` on loopback; with `header`, a request whose `header` is not
    `token` is answered 401 (what Daytona's preview edge does for a private sandbox)."""

    def __init__(self, target: int, *, header: str | None = None, token: str = "") -> None:
        self.target = target
        self._header = header
        self._token = token
        # The tokens the check accepts (`allow` adds one: providers mint several).
        self.tokens = {token}
        self._runner: web.AppRunner | None = None
        self.port = 0

    @property
    def url(self) -> str:
        """Where clients reach the forwarder (after `start`)."""
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> PreviewProxy:
        """Listen on a free loopback port."""
        app = web.Application(client_max_size=MAX_BODY)
        app.router.add_route("*", "/{tail:.*}", self._forward)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        self._runner = runner
        server = site._server
        assert server is not None
        self.port = int(server.sockets[0].getsockname()[1])  # type: ignore[attr-defined]
        return self

    def allow(self, token: str) -> None:
        """Accept `token` too (a provider that mints a new token per request)."""
        self.tokens.add(token)

    async def close(self) -> None:
        """Stop listening."""
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        if self._header is not None and request.headers.get(self._header) not in self.tokens:
            return web.Response(status=401, text="missing or wrong preview token")
        body = await request.read()
        url = f"http://127.0.0.1:{self.target}{request.rel_url}"
        timeout = aiohttp.ClientTimeout(total=30)
        try:
            async with aiohttp.ClientSession(timeout=timeout) as client:
                async with client.request(request.method, url, data=body or None) as answer:
                    data = await answer.content.read(MAX_BODY)
                    return web.Response(status=answer.status, body=data)
        except aiohttp.ClientError:
            return web.Response(status=502, text="nothing listens on the sandbox's port")
