"""An OpenAI-style engine on loopback that takes as long as a test says to answer a chat
completion, whole or streamed, and counts the requests it received: a client that resends one
shows up as a second generation."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from aiohttp import web
from pytest_aiohttp import AiohttpServer

from tests.support.scripted_engines import CHAT_PATH, chunk


@dataclass
class SlowEngine:
    url: str = ""
    delay_s: float = 0.0
    """How long each answer takes before its first byte (a whole answer: all of it)."""
    received: list[bool] = field(default_factory=list)
    """Whether each request it received asked to stream, in order."""


SLOW = web.AppKey("slow", SlowEngine)


async def _completions(request: web.Request) -> web.StreamResponse:
    engine = request.app[SLOW]
    body = await request.json()
    streamed = body.get("stream") is True
    engine.received.append(streamed)
    await asyncio.sleep(engine.delay_s)  # generating
    if not streamed:
        message = {"role": "assistant", "content": "a long answer"}
        choice = {"index": 0, "message": message, "finish_reason": "stop"}
        head = {"id": "c", "object": "chat.completion", "created": 0, "model": "demo-llm"}
        return web.json_response({**head, "choices": [choice]})
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    await response.write(chunk("a long answer") + b"data: [DONE]\n\n")
    await response.write_eof()
    return response


async def _healthy(_: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def serve_slow_engine(aiohttp_server: AiohttpServer, delay_s: float) -> SlowEngine:
    app = web.Application()
    engine = app[SLOW] = SlowEngine(delay_s=delay_s)
    app.router.add_post(CHAT_PATH, _completions)
    app.router.add_get("/health", _healthy)
    server = await aiohttp_server(app, host="127.0.0.1")
    engine.url = str(server.make_url("")).rstrip("/")
    return engine
