"""The flooding peer of `bench.blaxel_cases`, in its own process (so the client's RSS
is the client's alone): a `BlaxelServer` whose knobs are driven by lines on stdin.

It prints `<api_url> <api_key>` once serving; then `flood <endpoint>` floods that
endpoint's next answer, `frame <bytes>` sends one output frame of that size on every
live terminal; each is answered `ok`. EOF on stdin stops it.
"""

from __future__ import annotations

import asyncio
import sys

from sandbox.testing.blaxel_server import BlaxelServer


async def serve(root: str) -> None:
    """Serve until stdin closes."""
    loop = asyncio.get_running_loop()
    async with BlaxelServer(root=root) as server:
        print(server.api_url, server.api_key, flush=True)
        while line := await loop.run_in_executor(None, sys.stdin.readline):
            verb, _, arg = line.strip().partition(" ")
            if verb == "flood":
                server.flood(arg)
            elif verb == "frame":
                await server.send_terminal_frame(int(arg))
            print("ok", flush=True)


if __name__ == "__main__":
    asyncio.run(serve(sys.argv[1]))
