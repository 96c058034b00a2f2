"""Servers on loopback that an analysis reads metrics from, the operator's flag that lets it
read them, and a metrics reader closed after use."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from aiohttp import web
from aiohttp.pytest_plugin import AiohttpServer

from modelroll_operator.analysis.access import ReadAccess
from modelroll_operator.analysis.reader import MetricsReader

LOOPBACK = ReadAccess.of(["http://127.0.0.1"])
"""The operator's flag that lets analyses read the test servers: loopback, any port."""


@asynccontextmanager
async def closing(reader: MetricsReader) -> AsyncIterator[MetricsReader]:
    """``reader``, closed (its HTTP session) when done."""
    try:
        yield reader
    finally:
        await reader.close()


SECRET = "ASIA-SECRET-KEY"


METADATA = '{"Code": "Success", "AccessKeyId": "' + SECRET + '"}\n'
"""What a cloud's instance metadata answers: never to be read, and never copied into a message."""


class Site:
    """A server on loopback: ``pages`` by path (a str is a 200 text body, an int a redirect
    with that status to /secret), and the paths asked for, in order."""

    def __init__(self, pages: dict[str, str | int]) -> None:
        self.pages = {"/secret": METADATA, **pages}
        self.asked: list[str] = []

    async def answer(self, request: web.Request) -> web.Response:
        self.asked.append(request.path)
        page = self.pages[request.path]
        if isinstance(page, int):
            return web.Response(status=page, headers={"Location": "/secret"})
        return web.Response(text=page)

    async def start(self, aiohttp_server: AiohttpServer) -> str:
        app = web.Application()
        app.router.add_get("/{path:.*}", self.answer)
        server = await aiohttp_server(app)
        return str(server.make_url("/"))
