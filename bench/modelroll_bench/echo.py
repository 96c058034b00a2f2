"""A bare aiohttp echo server: the ceiling for any aiohttp service doing JSON in and JSON out.

``POST /v1/infer {"payload": p}`` answers ``{"output": p}``, with the standard json module, as
the gateway and the sidecar use it.
Run: python -m modelroll_bench.echo PORT [EVENT_LOOP]   (asyncio, the default, or uvloop: a fair
ceiling runs on the event loop of the server it is compared with)
"""

from __future__ import annotations

import json
import sys

from aiohttp import web

from modelroll_common.server import new_event_loop


async def echo(request: web.Request) -> web.Response:
    body = json.loads(await request.read())
    return web.Response(
        body=json.dumps({"output": body["payload"]}).encode(), content_type="application/json"
    )


async def readyz(_: web.Request) -> web.Response:
    return web.Response(text="ok")


def create_echo_app() -> web.Application:
    app = web.Application()
    app.router.add_post("/v1/infer", echo)
    app.router.add_get("/readyz", readyz)
    return app


if __name__ == "__main__":
    loop = new_event_loop(sys.argv[2] if len(sys.argv) > 2 else "asyncio", "echo")
    web.run_app(
        create_echo_app(),
        host="127.0.0.1",
        port=int(sys.argv[1]),
        access_log=None,
        print=None,
        loop=loop,
    )
