"""The gateway's aiohttp app: routes requests to model versions by weight, and follows the routes.

`create_app(config)` builds a fresh app each call; its cleanup contexts open the upstream session
and start the routes source (the ConfigMap watch, or the routes file), and close both on exit.
Setting the app's `STOPPING_KEY` event begins its shutdown (cli.serve does it on SIGTERM): /readyz
answers 503 and every inference answer closes its connection, while requests go on being served.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable

from aiohttp import web
from kubernetes import client as k8s
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from modelroll_common.kube import Connection, connect
from modelroll_common.server import RequestTimedOut, read_body

from .config import GatewayConfig
from .metrics import GatewayMetrics
from .routesfile import RoutesFileWatcher
from .streaming import OPENAI_PATHS, StreamingForwarder
from .table import RouteTable, Target
from .upstream import (
    UpstreamConnectError,
    UpstreamError,
    UpstreamPool,
    UpstreamTimeout,
)
from .watch import ConfigMapWatcher

log = logging.getLogger(__name__)

VERSION_HEADER = "X-Modelroll-Version"
_FORWARDED_REQUEST_HEADERS = ("Content-Type", "X-Request-Id", "traceparent", "tracestate")
_JSON = "application/json"
_WARN_EVERY = 10.0  # seconds between two warnings about the same failing version


def _error(status: int, message: str, version: str = "") -> web.Response:
    """The gateway's own error response: JSON, and the version header (empty: none was chosen)."""
    return web.Response(
        body=json.dumps({"error": message}).encode(),
        status=status,
        content_type=_JSON,
        headers={VERSION_HEADER: version},
    )


class _Pick:
    """The version is picked by weight (once the request is known to be worth it)."""


PICK = _Pick()


class Proxy:
    """Picks a version for each inference request and forwards it to that version's sidecar."""

    def __init__(self, config: GatewayConfig, table: RouteTable, stopping: asyncio.Event) -> None:
        self.config = config
        self.table = table
        self.stopping = stopping
        self.pool: UpstreamPool | None = None
        self.llm: StreamingForwarder | None = None
        self._warned: dict[tuple[str, str], float] = {}

    async def infer(self, request: web.Request) -> web.Response:
        """POST /v1/models/{model}/infer."""
        response = await self._answer(request)
        if self.stopping.is_set():
            response.force_close()  # "Connection: close": the client's next request goes elsewhere
        return response

    async def _answer(self, request: web.Request) -> web.Response:
        started = time.perf_counter()
        model = request.match_info["model"]
        target = self._select(model, request.headers.get(VERSION_HEADER))
        if isinstance(target, web.Response):
            return target
        body = await self._read(request, model)
        if isinstance(body, web.Response):
            return body
        if isinstance(target, _Pick):
            target = self.table.models[model].picker.pick()
        request_headers = request.headers
        forwarded = []
        for name in _FORWARDED_REQUEST_HEADERS:
            value = request_headers.get(name)
            if value is not None:
                forwarded.append(f"{name}: {value}\r\n")
        headers = "".join(forwarded).encode("utf-8", "surrogateescape")
        response = await self._forward(target, body, headers)
        target.stats.record(response.status, time.perf_counter() - started)
        return response

    def _select(self, model: str, pinned: str | None) -> Target | web.Response | _Pick:
        """The pinned version, PICK (pick by weight once the body is read), or the error: 404
        for an unknown model or version, 503 for a model nothing can serve."""
        table = self.table
        entry = table.models.get(model)
        if entry is None:
            reason = table.invalid_reason(model)
            if reason is not None:
                table.unrouted_counter(None, 503).inc()
                return _error(503, f"model {model!r} has no valid routes: {reason}")
            table.unrouted_counter(None, 404).inc()
            return _error(404, f"unknown model {model!r}")
        if pinned is not None:
            target = entry.targets.get(pinned)
            if target is None:
                table.unrouted_counter(model, 404).inc()
                return _error(404, f"unknown version {pinned!r} of model {model!r}")
            return target
        if not entry.picker:
            table.unrouted_counter(model, 503).inc()
            return _error(503, f"model {model!r} has no routable version (total weight is 0)")
        return PICK

    async def _read(self, request: web.Request, model: str | None) -> bytes | web.Response:
        """The request's body, or the 413 or 408 that ends it."""
        table = self.table
        try:
            # Raises past client_max_size (= max_body_bytes). A body already in full needs no
            # read timeout: read it directly (the common case, and the hot path).
            content = request.content
            return await (request.read() if content.is_eof() else read_body(request))
        except web.HTTPRequestEntityTooLarge:
            table.unrouted_counter(model, 413).inc()
            return _error(413, f"request body exceeds {self.config.max_body_bytes} bytes")
        except RequestTimedOut as exc:
            table.unrouted_counter(model, 408).inc()
            response = _error(408, str(exc))
            response.force_close()  # the rest of the body may still come: no next request
            return response

    async def openai(self, request: web.Request) -> web.StreamResponse:
        """POST /v1/chat/completions, /v1/completions, /v1/embeddings: routed by the body's
        ``model`` (or the version header), streamed back as the version answers. The stream
        stays on the version it started on, whatever the weights do meanwhile; a client that
        goes away closes the connection to the version, so its engine stops generating."""
        started = time.perf_counter()
        body = await self._read(request, None)
        if isinstance(body, web.Response):
            return body
        try:
            parsed = json.loads(body)
        except ValueError:
            self.table.unrouted_counter(None, 400).inc()
            return _error(400, "malformed JSON")
        model = parsed.get("model") if isinstance(parsed, dict) else None
        if not isinstance(model, str) or not model:
            self.table.unrouted_counter(None, 400).inc()
            return _error(400, 'the body needs a "model": the name of the model to route to')
        target = self._select(model, request.headers.get(VERSION_HEADER))
        if isinstance(target, web.Response):
            return target
        if isinstance(target, _Pick):
            target = self.table.models[model].picker.pick()
        assert self.llm is not None, "the streaming client opens with the app"
        response = await self.llm.forward(request, target, body)
        if self.stopping.is_set() and not response.prepared:  # a stream's headers are gone
            response.force_close()
        target.stats.record(response.status, time.perf_counter() - started)
        return response

    async def _forward(self, target: Target, body: bytes, headers: bytes) -> web.Response:
        pool = self.pool
        assert pool is not None, "the upstream pool opens with the app"
        version = target.route.name
        deadline = pool.loop.time() + self.config.upstream_timeout
        try:
            answer = await pool.endpoint(target.url, target.stats).post(body, headers, deadline)
        except UpstreamError as exc:
            metrics = self.table.metrics
            metrics.upstream_errors.labels(target.stats.model, version, exc.reason).inc()
            self._warn(target, str(exc))
            if isinstance(exc, UpstreamConnectError):
                return _error(502, f"version {version!r} could not be reached", version)
            if isinstance(exc, UpstreamTimeout):
                limit = self.config.upstream_timeout
                return _error(504, f"version {version!r} did not answer within {limit:g}s", version)
            return _error(502, f"version {version!r} failed: {exc}", version)
        out = {VERSION_HEADER: version}
        upstream_headers = answer.headers
        content_type = upstream_headers.get("content-type")
        if content_type is not None:
            out["Content-Type"] = content_type
        retry_after = upstream_headers.get("retry-after")
        if retry_after is not None:
            out["Retry-After"] = retry_after
        return web.Response(body=answer.body, status=answer.status, headers=out)

    def _warn(self, target: Target, what: str) -> None:
        """Log an upstream failure, at most once per version every few seconds."""
        key = (target.stats.model, target.route.name)
        now = time.monotonic()
        if now - self._warned.get(key, -_WARN_EVERY) >= _WARN_EVERY:
            self._warned[key] = now
            log.warning(
                "Forwarding to version %s of model %s at %s failed: %s",
                key[1],
                key[0],
                target.route.endpoint,
                what,
            )


CONFIG_KEY = web.AppKey("config", GatewayConfig)
METRICS_KEY = web.AppKey("metrics", GatewayMetrics)
TABLE_KEY = web.AppKey("table", RouteTable)
PROXY_KEY = web.AppKey("proxy", Proxy)
STOPPING_KEY = web.AppKey("stopping", asyncio.Event)
"""Set when the gateway begins to stop: from then on /readyz answers 503, so that Kubernetes
sends it nothing new, and every inference answer closes its connection, so that clients
reconnect to another replica; requests still arrive meanwhile, and are all answered."""


async def _models(request: web.Request) -> web.Response:
    """GET /v1/models: the routes in force, with per-version request counts."""
    return web.json_response(request.app[TABLE_KEY].describe())


async def _metrics(request: web.Request) -> web.Response:
    body = generate_latest(request.app[METRICS_KEY].registry)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


async def _livez(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def _readyz(request: web.Request) -> web.Response:
    """Ready once routes have been read (an empty or missing ConfigMap counts as read), and
    unready again from the first moment of shutdown."""
    app = request.app
    if app[STOPPING_KEY].is_set():
        return web.json_response({"error": "the gateway is shutting down"}, status=503)
    if app[TABLE_KEY].loaded:
        return web.json_response({"status": "ready"})
    return web.json_response({"error": "routes not loaded yet"}, status=503)


_KNOWN = {
    "/v1/models": "GET",
    "/metrics": "GET",
    "/livez": "GET",
    "/readyz": "GET",
    **dict.fromkeys(OPENAI_PATHS, "POST"),
}


async def _fallback(request: web.Request) -> web.Response:
    """Every other path or method: a JSON 404 or 405 (registered last, so off the hot path)."""
    path = request.path
    allowed = _KNOWN.get(path)
    if allowed is None and path.startswith("/v1/models/") and path.endswith("/infer"):
        allowed = "POST"
    if allowed is not None:
        return web.json_response(
            {"error": f"method {request.method} is not allowed on {path}; use {allowed}"},
            status=405,
            headers={"Allow": allowed},
        )
    return web.json_response({"error": f"no such path {path!r}"}, status=404)


async def _upstream_pool(app: web.Application) -> AsyncIterator[None]:
    config = app[CONFIG_KEY]
    pool = UpstreamPool(
        connect_timeout=config.connect_timeout,
        max_age=config.upstream_connection_max_age,
        max_connections=config.upstream_max_connections,
    )
    proxy = app[PROXY_KEY]
    proxy.pool = pool
    proxy.llm = StreamingForwarder(app[METRICS_KEY], config.upstream_timeout, VERSION_HEADER)
    yield
    await proxy.llm.close()
    await pool.close()


@contextlib.asynccontextmanager
async def _supervised(name: str, run: Callable[[], Awaitable[None]]) -> AsyncIterator[None]:
    """Run `run` in a task for the duration of the block; restart it if it ever fails."""

    async def loop() -> None:
        while True:
            try:
                await run()
            except Exception:
                log.exception("The %s task failed; restarting it in 1s", name)
                await asyncio.sleep(1.0)

    task = asyncio.create_task(loop(), name=name)
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def _routes_source(
    kube: Connection | None,
) -> Callable[[web.Application], AsyncIterator[None]]:
    async def source(app: web.Application) -> AsyncIterator[None]:
        config = app[CONFIG_KEY]
        table = app[TABLE_KEY]
        if config.routes_file is not None:
            file_watcher = RoutesFileWatcher(config.routes_file, table, config.routes_poll_seconds)
            file_watcher.check()  # the first read happens before the app takes requests
            async with _supervised("routes-file", file_watcher.run):
                yield
            return
        connection = kube if kube is not None else connect(config.kubeconfig, retries=False)
        namespace = config.namespace or connection.namespace
        table.source = f"configmap {namespace}/{config.configmap}"
        watcher = ConfigMapWatcher(
            k8s.CoreV1Api(connection.client),
            table,
            namespace,
            config.configmap,
            config.watch_timeout_seconds,
        )
        try:
            async with _supervised("routes-watch", watcher.run):
                yield
        finally:
            connection.client.close()  # type: ignore[no-untyped-call]

    return source


def create_app(
    config: GatewayConfig,
    *,
    registry: CollectorRegistry | None = None,
    kube: Connection | None = None,
) -> web.Application:
    """A new gateway app. `registry` defaults to a fresh one; `kube` to the config's credentials."""
    metrics = GatewayMetrics(registry if registry is not None else CollectorRegistry())
    table = RouteTable(metrics)
    if config.routes_file is not None:
        table.source = f"file {config.routes_file}"
    app = web.Application(client_max_size=config.max_body_bytes)
    app[CONFIG_KEY] = config
    app[METRICS_KEY] = metrics
    app[TABLE_KEY] = table
    stopping = asyncio.Event()
    app[STOPPING_KEY] = stopping
    proxy = Proxy(config, table, stopping)
    app[PROXY_KEY] = proxy
    app.router.add_post("/v1/models/{model}/infer", proxy.infer)
    for path in OPENAI_PATHS:
        app.router.add_post(path, proxy.openai)
    app.router.add_get("/v1/models", _models)
    app.router.add_get("/metrics", _metrics)
    app.router.add_get("/livez", _livez)
    app.router.add_get("/readyz", _readyz)
    app.router.add_route("*", "/{tail:.*}", _fallback)
    app.cleanup_ctx.append(_upstream_pool)
    app.cleanup_ctx.append(_routes_source(kube))
    return app
