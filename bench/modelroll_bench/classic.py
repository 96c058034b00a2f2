"""The classic micro-batcher that serving code often starts from, for comparison: on the first
arrival into an empty queue it sleeps ``max_wait``, then takes up to ``max_batch`` and sends
them, scheduling another sleep if requests remain. No size trigger, no bound on batches in
flight, no deadlines.

Serves the sidecar's ``POST /v1/infer`` so the same load reaches both.
Run: python -m modelroll_bench.classic PORT UPSTREAM MAX_BATCH MAX_WAIT_MS
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator
from typing import Any

from aiohttp import web

from modelroll_sidecar.protocol import ModelClient, ModelError


class SleepThenDrain:
    def __init__(self, model: ModelClient, max_batch: int, max_wait_s: float) -> None:
        self.model = model
        self.max_batch = max_batch
        self.max_wait_s = max_wait_s
        self.queue: list[tuple[Any, asyncio.Future[tuple[int, Any]]]] = []
        self.tasks: set[asyncio.Task[None]] = set()

    async def submit(self, payload: Any) -> tuple[int, Any]:
        future: asyncio.Future[tuple[int, Any]] = asyncio.get_running_loop().create_future()
        self.queue.append((payload, future))
        if len(self.queue) == 1:
            self._spawn()
        return await future

    def _spawn(self) -> None:
        task = asyncio.create_task(self._drain())
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _drain(self) -> None:
        await asyncio.sleep(self.max_wait_s)
        batch, self.queue = self.queue[: self.max_batch], self.queue[self.max_batch :]
        if self.queue:
            self._spawn()
        try:
            result = await self.model.infer([payload for payload, _ in batch])
        except ModelError as exc:
            for _, future in batch:
                future.set_result((exc.status, {"error": str(exc)}))
            return
        for (_, future), output, error in zip(batch, result.outputs, result.errors, strict=True):
            answer = (200, {"output": output}) if error is None else (422, {"error": error})
            future.set_result(answer)


BATCHER = web.AppKey("batcher", SleepThenDrain)


async def infer(request: web.Request) -> web.Response:
    body = json.loads(await request.read())
    status, answer = await request.app[BATCHER].submit(body["payload"])
    return web.Response(
        status=status, body=json.dumps(answer).encode(), content_type="application/json"
    )


async def readyz(_: web.Request) -> web.Response:
    return web.Response(text="ok")


def create_classic_app(upstream: str, max_batch: int, max_wait_ms: float) -> web.Application:
    app = web.Application()
    model = ModelClient(upstream, timeout_s=60, max_connections=100)
    app[BATCHER] = SleepThenDrain(model, max_batch, max_wait_ms / 1000)

    async def lifespan(_: web.Application) -> AsyncIterator[None]:
        await model.start()
        yield
        await model.close()

    app.cleanup_ctx.append(lifespan)
    app.router.add_post("/v1/infer", infer)
    app.router.add_get("/readyz", readyz)
    return app


if __name__ == "__main__":
    port, upstream, max_batch, max_wait_ms = sys.argv[1:5]
    web.run_app(
        create_classic_app(upstream, int(max_batch), float(max_wait_ms)),
        host="127.0.0.1",
        port=int(port),
        access_log=None,
        print=None,
    )
