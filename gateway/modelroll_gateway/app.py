"""The gateway's aiohttp app: routes requests to model versions by weight, and follows the routes.

`create_app(config)` builds a fresh app each call; its cleanup contexts open the upstream session
and start the routes source (the ConfigMap watch, or the routes file), and close both on exit.
`create_admin_app(app)` serves that app's metrics and routes on the admin port, apart from the
clients' port.
Setting the app's `STOPPING_KEY` event begins its shutdown (cli.serve does it on SIGTERM): /readyz
answers 503 and every inference answer closes its connection, while requests go on being served.

A request the gateway refuses itself raises `Refused` wherever it fails; the handler of its path
renders it once, as `{"error": "..."}` on the batch path and the Open Inference Protocol's (/v2)
paths, or in OpenAI's shape on OpenAI's paths.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
import json
import logging
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping

from aiohttp import web
from kubernetes import client as k8s
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from modelroll_common.calls import CALL_SIZE_HEADER, call_share
from modelroll_common.errors import error_answer, json_errors
from modelroll_common.kube import Connection, connect
from modelroll_common.open_inference import BINARY_DATA_HEADER, BINARY_DATA_REFUSED
from modelroll_common.routes import VERSION_HEADER
from modelroll_common.server import RequestTimedOut, read_body
from modelroll_common.tracing import passed_on

from .cohorts import KeyBudget
from .config import GatewayConfig
from .metrics import GatewayMetrics
from .routesfile import RoutesFileWatcher
from .shadow import ShadowSender
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

_NO_VERSION = {VERSION_HEADER: ""}
"""The version header of an inference request no version answered."""
_WARN_EVERY = 10.0  # seconds between two warnings about the same failing version
_INFER_PATH = re.compile(r"/v1/models/[^/]+/infer")


STANDBY_RETRY_AFTER_S = 10
"""Retry-After of a request pinned to a version scaled to zero: a replica takes a while."""


class Refused(Exception):
    """The gateway answers this request itself with an error (`close`: and closes the
    connection, whose client may still be sending)."""

    def __init__(
        self, status: int, message: str, *, close: bool = False, retry_after: int | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.close = close
        self.retry_after = retry_after
        """Seconds for the Retry-After header, if the answer has one."""


def _refusal(
    exc: Refused, *, openai: bool, headers: Mapping[str, str] | None = None
) -> web.Response:
    """`exc` as the answer: in OpenAI's error shape on its paths, which its clients parse into
    their exceptions, else the gateway's own `{"error": ...}`."""
    if exc.retry_after is not None:
        headers = {**(headers or {}), "Retry-After": str(exc.retry_after)}
    response = error_answer(exc.status, exc.message, openai=openai, headers=headers)
    if exc.close:
        response.force_close()
    return response


def _error(status: int, message: str, version: str = "") -> web.Response:
    """An inference request's error: the version header says which version failed (empty: none
    was chosen)."""
    return _refusal(Refused(status, message), openai=False, headers={VERSION_HEADER: version})


def _is_openai_path(path: str) -> bool:
    """OpenAI's paths: generations, embeddings, /v1/models and what is under it, but for the
    gateway's own batch path, /v1/models/{model}/infer."""
    if path in OPENAI_PATHS or path == "/v1/models":
        return True
    return path.startswith("/v1/models/") and not _INFER_PATH.fullmatch(path)


def _decode(body: bytes) -> object:
    """The body as JSON, or a 400. Nesting too deep for the parser's recursion (a body of
    100 000 `[`) is the client's fault like any malformed body, not a server error."""
    try:
        return json.loads(body)
    except RecursionError:
        raise Refused(400, "malformed JSON: arrays and objects nested too deeply") from None
    except ValueError as exc:
        raise Refused(400, f"malformed JSON: {exc}") from None


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
        self.shadows: ShadowSender | None = None
        self._warned: dict[tuple[str, str], float] = {}
        self._pin_ignored_logged = False

    async def infer(self, request: web.Request) -> web.Response:
        """POST /v1/models/{model}/infer."""
        return await self._infer(request, oip=False)

    async def infer_oip(self, request: web.Request) -> web.Response:
        """POST /v2/models/{model}/infer, and /v2/models/{model}/versions/{version}/infer, whose
        version pins as the version header does: the Open Inference Protocol's inference."""
        return await self._infer(request, oip=True)

    async def _infer(self, request: web.Request, *, oip: bool) -> web.Response:
        try:
            response = await self._answer(request, oip=oip)
        except Refused as exc:
            response = _refusal(exc, openai=False, headers=_NO_VERSION)
        if self.stopping.is_set():
            response.force_close()  # "Connection: close": the client's next request goes elsewhere
        return response

    async def _answer(self, request: web.Request, *, oip: bool) -> web.Response:
        started = time.perf_counter()
        model = request.match_info["model"]
        target = self._select(model, request)
        if oip and BINARY_DATA_HEADER in request.headers:
            self.table.unrouted_counter(model, 400).inc()
            raise Refused(400, BINARY_DATA_REFUSED, close=True)
        body = await self._read(request, model)
        if isinstance(target, _Pick):
            target = self.table.models[model].pick(request.headers)
        forwarded = passed_on(request.headers)
        if (kind := request.headers.get("Content-Type")) is not None:
            forwarded["Content-Type"] = kind
        lines = (f"{name}: {value}\r\n" for name, value in forwarded.items())
        headers = "".join(lines).encode("utf-8", "surrogateescape")
        response = await self._forward(target, target.oip_url if oip else target.url, headers, body)
        share = call_share(response.headers.get(CALL_SIZE_HEADER))
        target.stats.record(response.status, time.perf_counter() - started, share)
        if response.status == 200:
            self._mirror(model, target, body, forwarded, response, oip=oip)
        return response

    def _mirror(
        self,
        model: str,
        target: Target,
        body: bytes,
        headers: Mapping[str, str],
        response: web.Response,
        *,
        oip: bool,
    ) -> None:
        """Copy a request another version answered to each shadow version due a copy, at the
        same protocol's path."""
        entry = self.table.models.get(model)
        if entry is None or not entry.mirrors or self.shadows is None:
            return
        answer = response.body
        assert isinstance(answer, bytes), "the gateway answers with the version's bytes"
        for mirror in entry.mirrors:
            if mirror.name != target.name and mirror.take():
                self.shadows.send(model, mirror, target.name, body, headers, answer, oip=oip)

    async def model_metadata(self, request: web.Request) -> web.Response:
        """GET /v2/models/{model} (and /v2/models/{model}/versions/{version}): the model's
        metadata, as the version a request would go to answers it, passed on. Not counted as
        a request of the version."""
        model = request.match_info["model"]
        try:
            target = self._choose(model, self._pin(request))
        except Refused as exc:
            return _refusal(exc, openai=False, headers=_NO_VERSION)
        if isinstance(target, _Pick):
            target = self.table.models[model].choose(request.headers)
        headers = UpstreamPool.encode_headers(passed_on(request.headers))
        return await self._forward(target, target.route.open_inference_model_url(model), headers)

    async def model_ready(self, request: web.Request) -> web.Response:
        """GET /v2/models/{model}/ready (and /v2/models/{model}/versions/{version}/ready): 200
        when a request to the model (or to the pinned version) would be routed; else the error
        the request would get."""
        model = request.match_info["model"]
        try:
            self._choose(model, self._pin(request))
        except Refused as exc:
            return _refusal(exc, openai=False)
        return web.json_response({"name": model, "ready": True})

    def _pin(self, request: web.Request) -> str | None:
        """The version the request pins, by the version header or by its path's {version} (the
        Open Inference Protocol's), if any; refuses with 400 a request whose two name different
        versions. A client outside --trusted-networks pins nothing (unless
        --pins-from-any-client): its request is routed by weight, as if unpinned, whatever
        version it names, so that its answer never tells a version's name from a guess, and
        clients which always name one keep working."""
        pinned = request.headers.get(VERSION_HEADER)
        in_path = request.match_info.get("version")
        if in_path is not None:
            if pinned is not None and pinned != in_path:
                raise Refused(
                    400,
                    f"the path names version {in_path!r} and the {VERSION_HEADER} header "
                    f"{pinned!r}: name one version",
                )
            pinned = in_path
        config = self.config
        if pinned is None or config.pins_from_any_client or config.trusts(request.remote):
            return pinned
        self.table.metrics.pins_ignored.inc()
        if not self._pin_ignored_logged:
            self._pin_ignored_logged = True
            log.warning(
                "Ignored the %s of a client at %s, outside --trusted-networks, and "
                "routed its request by weight; further ones are counted in "
                "modelroll_gateway_pins_ignored_total, not logged",
                f"{VERSION_HEADER} header" if in_path is None else "version in the path",
                request.remote,
            )
        return None

    def _select(self, model: str, request: web.Request) -> Target | _Pick:
        """As `_choose`, for the version the request pins; a refusal is counted as a request
        no version answered."""
        try:
            return self._choose(model, self._pin(request))
        except Refused as exc:
            self.table.unrouted_counter(model, exc.status).inc()
            raise

    def _choose(self, model: str, pinned: str | None) -> Target | _Pick:
        """The pinned version or PICK (pick by weight once the body is read); refuses with 404
        an unknown model or version, with 503 a model nothing can serve."""
        table = self.table
        entry = table.models.get(model)
        if entry is None:
            reason = table.invalid_reason(model)
            if reason is not None:
                raise Refused(503, f"model {model!r} has no valid routes: {reason}")
            raise Refused(404, f"unknown model {model!r}")
        if pinned is not None:
            target = entry.pinned.get(pinned)
            if target is None:
                raise Refused(404, f"unknown version {pinned!r} of model {model!r}")
            if target.route.standby:
                raise Refused(
                    503,
                    f"version {pinned!r} of model {model!r} is scaled to zero: no replica is "
                    "Ready yet",
                    retry_after=STANDBY_RETRY_AFTER_S,
                )
            return target
        if not entry.picker:
            raise Refused(503, f"model {model!r} has no routable version (total weight is 0)")
        return PICK

    async def _read(self, request: web.Request, model: str | None) -> bytes:
        """The request's body; refuses with 413 one too large, with 408 one too slow."""
        table = self.table
        try:
            # Raises past client_max_size (= max_body_bytes). A body already in full needs no
            # read timeout: read it directly (the common case, and the hot path).
            content = request.content
            return await (request.read() if content.is_eof() else read_body(request))
        except web.HTTPRequestEntityTooLarge:
            table.unrouted_counter(model, 413).inc()
            raise Refused(413, f"request body exceeds {self.config.max_body_bytes} bytes") from None
        except RequestTimedOut as exc:
            table.unrouted_counter(model, 408).inc()
            # The rest of the body may still come: no next request on this connection.
            raise Refused(408, str(exc), close=True) from None

    async def openai(self, request: web.Request) -> web.StreamResponse:
        """POST /v1/chat/completions, /v1/completions, /v1/embeddings: routed by the body's
        ``model`` (or the version header), streamed back as the version answers. The stream
        stays on the version it started on, whatever the weights do meanwhile; a client that
        goes away closes the connection to the version, so its engine stops generating."""
        started = time.perf_counter()
        try:
            body = await self._read(request, None)
            model = self._model_of(body)
            target = self._select(model, request)
        except Refused as exc:
            return _refusal(exc, openai=True, headers=_NO_VERSION)
        if isinstance(target, _Pick):
            target = self.table.models[model].pick(request.headers)
        assert self.llm is not None, "the streaming client opens with the app"
        response = await self.llm.forward(request, target, body)
        if self.stopping.is_set() and not response.prepared:  # a stream's headers are gone
            response.force_close()
        share = call_share(response.headers.get(CALL_SIZE_HEADER))
        target.stats.record(response.status, time.perf_counter() - started, share)
        return response

    def _model_of(self, body: bytes) -> str:
        """The model an OpenAI request names; refuses with 400 a body that names none."""
        try:
            parsed = _decode(body)
        except Refused:
            self.table.unrouted_counter(None, 400).inc()
            raise
        model = parsed.get("model") if isinstance(parsed, dict) else None
        if not isinstance(model, str) or not model:
            self.table.unrouted_counter(None, 400).inc()
            raise Refused(400, 'the body needs a "model": the name of the model to route to')
        return model

    async def _forward(
        self, target: Target, url: str, headers: bytes, body: bytes | None = None
    ) -> web.Response:
        """POST ``body`` to ``url`` of the version (None: GET it), and its answer, or the
        gateway's error when it gave none."""
        pool = self.pool
        assert pool is not None, "the upstream pool opens with the app"
        version = target.route.name
        deadline = pool.loop.time() + self.config.upstream_timeout
        # The version's connection gauges follow its inference endpoint alone.
        endpoint = pool.endpoint(url, target.stats if body is not None else None)
        try:
            if body is None:
                answer = await endpoint.get(headers, deadline)
            else:
                answer = await endpoint.post(body, headers, deadline)
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
        for name in ("Retry-After", CALL_SIZE_HEADER):
            value = upstream_headers.get(name.lower())
            if value is not None:
                out[name] = value
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
    """GET /v1/models: OpenAI's list of the models a client may call (a version with weight).
    Versions and endpoints stay out: they are the operators' (GET /v1/routes)."""
    return web.json_response({"object": "list", "data": request.app[TABLE_KEY].served_models()})


async def _model(request: web.Request) -> web.Response:
    """GET /v1/models/{model}: OpenAI's model object, or a 404 in its error shape."""
    model = request.match_info["model"]
    table = request.app[TABLE_KEY]
    served = table.served(model)
    if served is not None:
        return web.json_response(served)
    if model in table.models:
        message = f"model {model!r} has no version taking traffic (total weight is 0)"
    else:
        message = f"unknown model {model!r}"
    return _refusal(Refused(404, message), openai=True)


async def _routes(request: web.Request) -> web.Response:
    """GET /v1/routes on the admin port: the routes in force, with versions (weight-0 ones
    too), weights, internal endpoints and per-version counts."""
    return web.json_response(request.app[TABLE_KEY].describe())


async def _metrics(request: web.Request) -> web.Response:
    body = generate_latest(request.app[METRICS_KEY].registry)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


async def _livez(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


def _unready(app: web.Application) -> str | None:
    """Why the gateway is not ready (None: it is): ready once routes have been read (an empty
    or missing ConfigMap counts as read), and unready again from the first moment of
    shutdown."""
    if app[STOPPING_KEY].is_set():
        return "the gateway is shutting down"
    if not app[TABLE_KEY].loaded:
        return "routes not loaded yet"
    return None


async def _readyz(request: web.Request) -> web.Response:
    reason = _unready(request.app)
    if reason is not None:
        return web.json_response({"error": reason}, status=503)
    return web.json_response({"status": "ready"})


async def _oip_live(request: web.Request) -> web.Response:
    """GET /v2/health/live: the Open Inference Protocol's liveness, as /livez."""
    return web.json_response({"live": True})


async def _oip_ready(request: web.Request) -> web.Response:
    """GET /v2/health/ready: the Open Inference Protocol's readiness, as /readyz."""
    reason = _unready(request.app)
    if reason is not None:
        return web.json_response({"error": reason}, status=503)
    return web.json_response({"ready": True})


_SERVER_METADATA = {
    "name": "modelroll-gateway",
    "version": importlib.metadata.version("modelroll-gateway"),
    "extensions": [],
}


async def _oip_server(request: web.Request) -> web.Response:
    """GET /v2: the Open Inference Protocol's server metadata (no protocol extensions)."""
    return web.json_response(_SERVER_METADATA)


async def _upstream_pool(app: web.Application) -> AsyncIterator[None]:
    config = app[CONFIG_KEY]
    pool = UpstreamPool(
        connect_timeout=config.connect_timeout,
        max_age=config.upstream_connection_max_age,
        max_connections=config.upstream_max_connections,
    )
    proxy = app[PROXY_KEY]
    proxy.pool = pool
    proxy.llm = StreamingForwarder(
        app[METRICS_KEY], config.upstream_timeout, VERSION_HEADER, config.generation_timeout
    )
    shadow_pool = UpstreamPool(
        connect_timeout=config.connect_timeout,
        max_age=config.upstream_connection_max_age,
        max_connections=config.shadow_max_in_flight,
    )
    proxy.shadows = ShadowSender(
        app[METRICS_KEY],
        shadow_pool,
        config.upstream_timeout,
        config.shadow_max_in_flight,
        config.shadow_max_compare_bytes,
    )
    yield
    await proxy.shadows.close()
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
    table = RouteTable(
        metrics,
        key_budget=KeyBudget(config.cohort_key_budget),
        series_grace=config.series_grace_seconds,
    )
    if config.routes_file is not None:
        table.source = f"file {config.routes_file}"
    app = web.Application(
        client_max_size=config.max_body_bytes, middlewares=[json_errors("gateway", _is_openai_path)]
    )
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
    app.router.add_get("/v1/models/{model}", _model)
    app.router.add_post("/v2/models/{model}/infer", proxy.infer_oip)
    app.router.add_post("/v2/models/{model}/versions/{version}/infer", proxy.infer_oip)
    app.router.add_get("/v2/models/{model}", proxy.model_metadata)
    app.router.add_get("/v2/models/{model}/versions/{version}", proxy.model_metadata)
    app.router.add_get("/v2/models/{model}/ready", proxy.model_ready)
    app.router.add_get("/v2/models/{model}/versions/{version}/ready", proxy.model_ready)
    app.router.add_get("/v2/health/live", _oip_live)
    app.router.add_get("/v2/health/ready", _oip_ready)
    app.router.add_get("/v2", _oip_server)
    app.router.add_get("/livez", _livez)
    app.router.add_get("/readyz", _readyz)
    app.cleanup_ctx.append(_upstream_pool)
    app.cleanup_ctx.append(_routes_source(kube))
    return app


def create_admin_app(app: web.Application) -> web.Application:
    """The admin app of a gateway that `create_app` built: GET /metrics and GET /v1/routes,
    which name every version, weight-0 ones included, and their endpoints. It shares that
    app's metrics and routes (which that app starts and stops) and is served on --admin-port,
    which the chart's NetworkPolicy keeps to the scraper and the operator: on the clients'
    port both paths are unknown (404)."""
    admin = web.Application(middlewares=[json_errors("gateway")])
    admin[METRICS_KEY] = app[METRICS_KEY]
    admin[TABLE_KEY] = app[TABLE_KEY]
    admin.router.add_get("/v1/routes", _routes)
    admin.router.add_get("/metrics", _metrics)
    return admin
