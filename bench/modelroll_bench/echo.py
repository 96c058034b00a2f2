"""A bare aiohttp echo server: the ceiling for any aiohttp service doing JSON in and JSON out.

``POST /v1/infer {"payload": p}`` answers ``{"output": p}``. A fair ceiling does what the server
it is compared with does, minus that server's own work, so both the event loop and the JSON
library are chosen to match it:

Run: python -m modelroll_bench.echo PORT [EVENT_LOOP [JSON]]
  EVENT_LOOP  asyncio (the default), uvloop, or auto (uvloop when installed, as the sidecar and
              the gateway pick it by default)
  JSON        stdlib (the default: the standard json module, as the gateway uses it) or sidecar
              (the sidecar's own ``protocol.decode`` and ``protocol.encode``: its checked parse
              and orjson's encoder)
"""

from __future__ import annotations

import json
import sys
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from modelroll_common.server import new_event_loop
from modelroll_sidecar import protocol

Handler = Callable[[web.Request], Awaitable[web.Response]]
JSON_LIBRARIES: dict[str, tuple[Callable[[bytes], Any], Callable[[Any], bytes]]] = {
    "stdlib": (json.loads, lambda value: json.dumps(value).encode()),
    "sidecar": (protocol.decode, protocol.encode),
}


def echo_handler(library: str = "stdlib") -> Handler:
    decode, encode = JSON_LIBRARIES[library]

    async def echo(request: web.Request) -> web.Response:
        body = decode(await request.read())
        return web.Response(
            body=encode({"output": body["payload"]}), content_type="application/json"
        )

    return echo


async def readyz(_: web.Request) -> web.Response:
    return web.Response(text="ok")


def create_echo_app(library: str = "stdlib") -> web.Application:
    app = web.Application()
    app.router.add_post("/v1/infer", echo_handler(library))
    app.router.add_get("/readyz", readyz)
    return app


if __name__ == "__main__":
    args = sys.argv[1:]
    port = args[0]
    loop_kind = args[1] if len(args) > 1 else "asyncio"
    library = args[2] if len(args) > 2 else "stdlib"
    if library not in JSON_LIBRARIES:
        raise SystemExit(f"echo: JSON must be one of {', '.join(JSON_LIBRARIES)}, got {library!r}")
    web.run_app(
        create_echo_app(library),
        host="127.0.0.1",
        port=int(port),
        access_log=None,
        print=None,
        loop=new_event_loop(loop_kind, "echo"),
    )
