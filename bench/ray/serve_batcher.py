"""Ray Serve's ``@serve.batch`` in front of a model that speaks modelroll's batch protocol, for
the batcher comparison: one replica, one batch at a time, the same max batch and wait as the
others, answering the sidecar's ``POST /v1/infer {"payload": p}`` with ``{"output": o}``.

Runs in its own virtualenv (``make ray-serve``): Ray pins its own web stack.
Run: python serve_batcher.py PORT UPSTREAM MAX_BATCH MAX_WAIT_MS
"""

from __future__ import annotations

import json
import signal
import sys
import threading
from typing import Any

import aiohttp
import ray
from ray import serve
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response

MAX_ONGOING = 4096
"""Requests a replica holds at once, like the sidecar's queue in the comparison: Ray's default
(5) would cap every batch at five requests."""


def deployment(upstream: str, max_batch: int, max_wait_ms: float) -> Any:
    @serve.deployment(max_ongoing_requests=MAX_ONGOING, num_replicas=1)
    class Batcher:
        def __init__(self) -> None:
            self.http: aiohttp.ClientSession | None = None

        @serve.batch(max_batch_size=max_batch, batch_wait_timeout_s=max_wait_ms / 1000)
        async def infer(self, payloads: list[Any]) -> list[tuple[int, Any]]:
            if self.http is None:
                self.http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60))
            async with self.http.post(upstream + "/v1/batch", json={"inputs": payloads}) as resp:
                body = await resp.json(content_type=None)
                if resp.status != 200:
                    return [(resp.status, {"error": body.get("error", "model failed")})] * len(
                        payloads
                    )
            errors = body.get("errors") or [None] * len(payloads)
            return [
                (200, {"output": out}) if err is None else (422, {"error": err})
                for out, err in zip(body["outputs"], errors, strict=True)
            ]

        async def __call__(self, request: Request) -> Response:
            if request.url.path.endswith("/readyz"):
                return PlainTextResponse("ok")
            body = json.loads(await request.body())
            status, answer = await self.infer(body["payload"])
            return JSONResponse(answer, status_code=status)

    return Batcher.bind()


def main(argv: list[str]) -> int:
    port, upstream, max_batch, max_wait_ms = int(argv[0]), argv[1], int(argv[2]), float(argv[3])
    ray.init(include_dashboard=False, log_to_driver=False, configure_logging=False)
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    serve.run(deployment(upstream, max_batch, max_wait_ms), route_prefix="/")
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    stop.wait()
    ray.shutdown()  # stops the local cluster's processes; a graceful serve.shutdown takes ~20 s
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
