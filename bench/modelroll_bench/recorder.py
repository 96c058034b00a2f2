"""Stand-in model versions for the rollback benchmark: each port answers ``POST /v1/infer`` at
once, like a sidecar with a zero-cost model, and remembers when every request arrived.

``GET /arrivals?after=T`` answers ``{"count": n, "first": t, "last": t}`` for the arrivals after
``T``. Times are ``time.monotonic()`` (CLOCK_MONOTONIC, the same clock in every process on the
machine), so the benchmark can compare them with the moment it ran ``kubectl patch``.
Run: python -m modelroll_bench.recorder [--host ADDRESS ...] PORT [PORT ...]
(each port on 127.0.0.1, and on every ADDRESS given: a data plane that reaches backends through
EndpointSlices needs an address that is not loopback).
"""

from __future__ import annotations

import asyncio
import bisect
import sys
import time

from aiohttp import web

ARRIVALS = web.AppKey("arrivals", list[float])


async def infer(request: web.Request) -> web.Response:
    request.app[ARRIVALS].append(time.monotonic())
    await request.read()
    return web.json_response({"output": "ok"})


async def arrivals(request: web.Request) -> web.Response:
    times = request.app[ARRIVALS]
    try:
        after = float(request.query.get("after", "0"))
    except ValueError:
        return web.json_response({"error": "after must be a number"}, status=400)
    since = times[bisect.bisect_right(times, after) :]
    return web.json_response(
        {
            "count": len(since),
            "first": since[0] if since else None,
            "last": times[-1] if since else None,
        }
    )


async def readyz(_: web.Request) -> web.Response:
    return web.json_response({"status": "ready"})


def create_recorder_app() -> web.Application:
    app = web.Application()
    app[ARRIVALS] = []
    app.router.add_post("/v1/infer", infer)
    app.router.add_get("/arrivals", arrivals)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/livez", readyz)
    return app


async def serve(ports: list[int], hosts: list[str]) -> None:
    runners = []
    for port in ports:
        runner = web.AppRunner(create_recorder_app(), access_log=None)
        await runner.setup()
        for host in ("127.0.0.1", *hosts):
            await web.TCPSite(runner, host, port).start()
        runners.append(runner)
    try:
        await asyncio.Event().wait()
    finally:
        for runner in runners:
            await runner.cleanup()


def main(argv: list[str]) -> None:
    hosts, ports = [], []
    while argv:
        if argv[0] == "--host":
            hosts.append(argv[1])
            argv = argv[2:]
        else:
            ports.append(int(argv[0]))
            argv = argv[1:]
    asyncio.run(serve(ports, hosts))


if __name__ == "__main__":
    main(sys.argv[1:])
