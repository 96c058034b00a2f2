"""A bare streaming proxy: the ceiling for any aiohttp hop in front of a chat LLM engine.

``POST /v1/chat/completions`` is sent on to ``--upstream`` (a base URL; the request's path is
kept) through one pooled ``aiohttp.ClientSession``, and the answer is streamed back chunk by chunk
as it arrives (``iter_any()``, ``StreamResponse.write``). Nothing else: no parsing, no metrics,
no bounds, no timeouts. It runs on uvloop, as the sidecar and the gateway do, so that what they
cost beyond it is their own code, not the event loop, the HTTP library or the process hop
(``modelroll-bench llm``'s overhead part).

Run: python -m modelroll_bench.llm_proxy --port N --upstream URL [--host 127.0.0.1]
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Awaitable, Callable, Sequence

import aiohttp
from aiohttp import web

from modelroll_common.server import new_event_loop, stop_signal

PROGRAM = "llm_proxy"
CHAT = "/v1/chat/completions"
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def forward_to(upstream: str, session: aiohttp.ClientSession) -> Handler:
    """The handler: the request's body to ``upstream`` + its path, the answer streamed back."""
    base = upstream.rstrip("/")

    async def forward(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        headers = {"Content-Type": request.headers.get("Content-Type", "application/json")}
        async with session.post(base + request.path, data=body, headers=headers) as answer:
            response = web.StreamResponse(
                status=answer.status,
                headers={"Content-Type": answer.headers.get("Content-Type", "text/plain")},
            )
            await response.prepare(request)
            async for chunk in answer.content.iter_any():
                await response.write(chunk)
            await response.write_eof()
            return response

    return forward


async def readyz(_: web.Request) -> web.Response:
    return web.Response(text="ok")


def create_app(upstream: str, session: aiohttp.ClientSession) -> web.Application:
    app = web.Application()
    app.router.add_post(CHAT, forward_to(upstream, session))
    app.router.add_get("/readyz", readyz)
    return app


async def serve(host: str, port: int, upstream: str) -> None:
    """Serve until SIGTERM or SIGINT."""
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=None)
    async with aiohttp.ClientSession(
        connector=connector, timeout=timeout, auto_decompress=False
    ) as session:
        runner = web.AppRunner(create_app(upstream, session), access_log=None, shutdown_timeout=1)
        await runner.setup()
        await web.TCPSite(runner, host, port).start()
        try:
            await stop_signal()
        finally:
            await runner.cleanup()


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog=PROGRAM, description="A bare streaming proxy for chat completions."
    )
    parser.add_argument("--host", default="127.0.0.1", help="listen address (%(default)s)")
    parser.add_argument("--port", type=int, required=True, help="listen port")
    parser.add_argument("--upstream", required=True, help="base URL requests are sent on to")
    args = parser.parse_args(argv)
    with asyncio.Runner(loop_factory=lambda: new_event_loop("uvloop", PROGRAM)) as runner:
        runner.run(serve(args.host, args.port, args.upstream))


if __name__ == "__main__":
    main()
