"""The session's end of a runner reached over a text link (docs/runner.md): what e2b,
daytona, blaxel and cloudflare share once the runner is placed (`place_runner`). The
link (a background command, a session command, a terminal of the provider's own) is
started, the runner says HELLO through it (`hello_through`), and `LinkedRunner` holds
the client, the link, the sandbox's environment (every process's base) and the folder
relative `cwd`s start from.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Mapping
from typing import Generic, Protocol, TypeVar

from ...runner import RunnerClient, TextLink
from .runner_delivery import PlacedRunner
from .runner_place import hello_through
from .runner_processes import process_environment

# The terminal type a process on a terminal gets when neither its env nor the session's
# sets one (what the providers' own terminals set).
DEFAULT_TERM = "xterm-256color"


class RunnerTextLink(Protocol):
    """A link to the runner that carries its protocol as text (`TextLink`)."""

    text: TextLink

    async def start(self, path: str, sock: str) -> None:
        """Start the bridge (`PATH connect --text --start --socket SOCK`)."""

    async def close(self) -> None:
        """End the bridge (the runner and its processes stay); bounded, idempotent."""

    def said(self) -> str:
        """What explains a link that never came up (its bridge's stderr, the text its
        terminal showed)."""


L = TypeVar("L", bound=RunnerTextLink)


class LinkedRunner(Generic[L]):
    """The session's connection to the runner in its sandbox: the client, the link that
    carries it, the environment every process starts with, and `home`, where relative
    `cwd`s (and none) start (None: the runner's default, the command's own `cwd`)."""

    def __init__(
        self,
        client: RunnerClient,
        link: L,
        base_env: dict[str, str],
        home: str | None = None,
        term: str = DEFAULT_TERM,
    ) -> None:
        self.client = client
        self.link = link
        self.base_env = base_env
        self.home = home
        self.term = term

    @staticmethod
    async def say_hello(placed: PlacedRunner, link: L, *, where: str) -> RunnerClient:
        """Start `link` to the `placed` runner and have it answer HELLO; the link is
        closed before any error (a cancellation included) leaves."""
        try:
            await link.start(placed.path, placed.sock)
        except BaseException:
            with contextlib.suppress(Exception):
                await asyncio.shield(link.close())
            raise
        return await hello_through(
            link.text.reader, link.text.writer, stderr=link.said, close=link.close, where=where
        )

    def environment(self, extra: Mapping[str, str] | None, *, tty: bool) -> dict[str, str]:
        """The whole environment of one process: the sandbox's, the command's, and TERM
        (`term`) for a terminal."""
        return process_environment(self.base_env, extra, tty=tty, term=self.term)

    def cwd(self, cwd: str | None) -> str | None:
        """A process's folder: relative ones (and none) in `home`, when there is one."""
        if self.home is None:
            return cwd
        if not cwd:
            return self.home
        return cwd if cwd.startswith("/") else f"{self.home.rstrip('/')}/{cwd}"

    async def aclose(self) -> None:
        """Close the connection, then the link (the runner and any process it keeps live
        on)."""
        try:
            await self.client.aclose()
        finally:
            await self.link.close()


async def close_then_release(
    runner: LinkedRunner[L] | None, release: Callable[[], Awaitable[object]] | None = None
) -> None:
    """Close the runner's link, if any (the runner lives on in a kept sandbox; a deleted
    one ends it), then `release` the sandbox whatever became of the link."""
    try:
        if runner is not None:
            await runner.aclose()
    finally:
        if release is not None:
            await release()
