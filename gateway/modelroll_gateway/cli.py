"""`modelroll-gateway`: flags, each also settable as a MODELROLL_* environment variable."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path

from aiohttp import web

from modelroll_common.flags import (
    EnvArgumentParser,
    non_negative_int,
    port_number,
    positive_float,
    positive_int,
    show_default,
)
from modelroll_common.kube import Connection, KubeConfigError, connect
from modelroll_common.metric_names import GATEWAY_ADMIN_PORT
from modelroll_common.routes import CONFIGMAP_NAME
from modelroll_common.server import ClientLimits, new_event_loop, start_server, stop_signal

from .app import METRICS_KEY, PROXY_KEY, STOPPING_KEY, create_admin_app, create_app
from .config import (
    DEFAULT_COHORT_KEY_BUDGET,
    DEFAULT_SERIES_GRACE,
    DEFAULT_SHADOW_MAX_COMPARE_BYTES,
    DEFAULT_TRUSTED_NETWORKS,
    GatewayConfig,
    Network,
    parse_networks,
)

log = logging.getLogger("modelroll_gateway")
PROGRAM = "modelroll-gateway"
UNREADY_SECONDS = 3.0
"""Seconds the gateway goes on accepting connections after SIGTERM, unready. Kubernetes takes a
terminating pod out of its Service's endpoints as it sends SIGTERM, and kube-proxy, load
balancers and ingress controllers apply that a moment later: until then new connections still
arrive here, and a closed listener would refuse them. (The sidecar's preStop delay is 3 s too.)"""
STREAM_CUT_REASON = "the gateway is shutting down"
LAST_ANSWER_SECONDS = 1.0
"""Seconds, past the upstream timeout, for the requests still open to have their answers written
(a 504 included) before they are cut off."""
ADMIN_SHUTDOWN_TIMEOUT = 1.0
"""Seconds the admin listener's cleanup waits for a scrape still open: it stops after the
clients' listener, whose drain is what answers requests, so nothing is lost when it is cut."""


def drain_seconds(config: GatewayConfig) -> float:
    """Seconds from SIGTERM to exit, at most: unready while still listening, then the upstream
    timeout for the requests open at that point (a request forwarded at the last moment gets its
    whole deadline), and the time to write their answers. It follows --upstream-timeout, the
    one setting that bounds a request; the chart's terminationGracePeriodSeconds is derived from
    the same value (charts/modelroll/templates/gateway-deployment.yaml)."""
    return UNREADY_SECONDS + config.upstream_timeout + LAST_ANSWER_SECONDS


def networks(text: str) -> tuple[Network, ...]:
    """The --trusted-networks type: a comma-separated list of CIDR networks."""
    try:
        return parse_networks(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def build_parser(environ: Mapping[str, str] | None = None) -> EnvArgumentParser:
    """The gateway's flags; each falls back on its MODELROLL_* variable in ``environ``
    (default: the process environment)."""
    p = EnvArgumentParser(
        prog=PROGRAM,
        description="Route inference requests to model versions by the weights in the routes "
        "ConfigMap (or a routes file). Every flag can also be set as MODELROLL_<FLAG> in the "
        "environment, e.g. MODELROLL_ROUTES_FILE; a flag replaces its variable.",
        environ=environ,
    )
    p.add_argument(
        "--host", default="0.0.0.0", help="address to listen on, for clients and the admin port"
    )
    p.add_argument("--port", type=port_number, default=8080, help="port to listen on for clients")
    p.add_argument(
        "--admin-port",
        type=port_number,
        default=GATEWAY_ADMIN_PORT,
        help="port (on --host too) of GET /metrics and GET /v1/routes, for the scraper and "
        "the operator, which are unknown paths (404) on --port; 0: not served. The chart's "
        "gateway.adminPort",
    )
    show_default(
        p.add_argument("--namespace", help="namespace of the routes ConfigMap"),
        "the kubeconfig context's, else the service account's, else default",
    )
    p.add_argument("--configmap", default=CONFIGMAP_NAME, help="name of the routes ConfigMap")
    show_default(
        p.add_argument(
            "--routes-file",
            type=Path,
            help="read routes from this JSON file or mounted ConfigMap directory instead of the "
            "API",
        ),
        "none: routes come from the API",
    )
    p.add_argument(
        "--routes-poll-seconds",
        type=positive_float,
        default=0.25,
        help="how often the routes file is checked for changes",
    )
    show_default(
        # Without --kubeconfig or MODELROLL_KUBECONFIG, connect() reads $KUBECONFIG.
        p.add_argument(
            "--kubeconfig",
            type=Path,
            help="kubeconfig file, read as kubectl reads it (contexts, certificates, tokens, "
            "exec and auth-provider plugins); unusable credentials exit 2 with the reason",
        ),
        "$KUBECONFIG, else ~/.kube/config, else the in-cluster service account",
    )
    p.add_argument(
        "--upstream-timeout",
        type=positive_float,
        default=30.0,
        help="seconds a sidecar may take to answer before the gateway answers 504; also how "
        f"long requests still open at shutdown get to finish (after {UNREADY_SECONDS:g} s more "
        "of serving, unready), and, on OpenAI's paths, the longest a version may be silent in a "
        "stream and a client may take nothing of it before it is cut off (client_stalled)",
    )
    p.add_argument(
        "--generation-timeout",
        type=positive_float,
        default=600.0,
        help="seconds a version may take to answer whole, on OpenAI's paths, a request not "
        "streamed (a generation sends nothing until it is done, so --upstream-timeout does not "
        "bound it) before the gateway answers 504: the official OpenAI clients' own timeout",
    )
    p.add_argument(
        "--connect-timeout",
        type=positive_float,
        default=2.0,
        help="seconds to connect to a sidecar before the gateway answers 502",
    )
    p.add_argument(
        "--upstream-connection-max-age",
        type=positive_float,
        default=10.0,
        help="seconds a kept-alive connection to a version is reused before it is replaced, "
        "so that its Service spreads the load over new replicas too (kube-proxy balances "
        "connections, not requests)",
    )
    p.add_argument(
        "--upstream-max-connections",
        type=positive_int,
        default=100,
        help="connections to each version at most; further requests wait in line for a free "
        "one until their deadline (504)",
    )
    p.add_argument(
        "--shadow-max-in-flight",
        type=positive_int,
        default=64,
        help="shadow copies open at once at most, on connections of their own; a copy beyond "
        'it is dropped (outcome="dropped"), never queued',
    )
    p.add_argument(
        "--shadow-max-compare-bytes",
        type=positive_int,
        default=DEFAULT_SHADOW_MAX_COMPARE_BYTES,
        help="bytes: a shadow copy whose answer, or the client's, is larger is not compared "
        '(outcome="too_large"); parsing 1 MiB of JSON takes about 15 ms with the '
        "interpreter's lock held, and comparisons run in a thread of their own, one at a time",
    )
    p.add_argument(
        "--cohort-key-budget",
        type=non_negative_int,
        default=DEFAULT_COHORT_KEY_BUDGET,
        help="requests of one cohort key a minute that a canary analysis judges "
        '(routing="cohort"); the key\'s further requests count as routing="cohort_over_budget", '
        "never judged; 0: none judged",
    )
    p.add_argument(
        "--series-grace-seconds",
        type=positive_float,
        default=DEFAULT_SERIES_GRACE,
        help="seconds a version's metric series are still exported once it is out of its "
        "model's route (a model's too, once it is gone); then they are removed, unless it came "
        "back",
    )
    p.add_argument(
        "--max-body-bytes",
        type=positive_int,
        default=1024 * 1024,
        help="largest request body accepted, in bytes; a larger one gets 413",
    )
    p.add_argument(
        "--read-timeout",
        type=positive_float,
        default=30.0,
        help="seconds a client has to send its whole request, from its first byte (a new "
        "connection: from connecting); slower ones get 408 and are disconnected, counted in "
        "modelroll_gateway_client_timeouts_total",
    )
    show_default(
        p.add_argument(
            "--trusted-networks",
            type=networks,
            default=DEFAULT_TRUSTED_NETWORKS,
            help="comma-separated CIDR networks whose clients may pin a version with the "
            "X-Modelroll-Version header, judged by the connection's source address, never a "
            "header; the header of any other client is ignored (its request is routed by "
            "weight). No default, not even loopback: in a pod with a mesh's sidecar or an "
            "authenticating proxy, loopback is where every client arrives from. The chart's "
            "gateway.trustedNetworks (a list)",
        ),
        "none",
    )
    p.add_argument(
        "--pins-from-any-client",
        action="store_true",
        help="let every client pin any version, a weight-0 one too, with the "
        "X-Modelroll-Version header (and tell a version's name from a guess by the 404). The "
        "chart's gateway.pinsFromAnyClient",
    )
    p.add_argument(
        "--event-loop",
        default="auto",
        choices=["auto", "asyncio", "uvloop"],
        help="event loop: auto is uvloop (a dependency; it measured about 14%% less CPU per "
        "request) when installed, else asyncio",
    )
    p.add_argument(
        "--log-level",
        default="INFO",
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        type=str.upper,
        help="log level",
    )
    return p


def config_from_args(args: argparse.Namespace) -> GatewayConfig:
    return GatewayConfig(
        host=args.host,
        port=args.port,
        admin_port=args.admin_port,
        namespace=args.namespace,
        configmap=args.configmap,
        routes_file=args.routes_file,
        routes_poll_seconds=args.routes_poll_seconds,
        kubeconfig=args.kubeconfig,
        upstream_timeout=args.upstream_timeout,
        generation_timeout=args.generation_timeout,
        connect_timeout=args.connect_timeout,
        upstream_connection_max_age=args.upstream_connection_max_age,
        upstream_max_connections=args.upstream_max_connections,
        shadow_max_in_flight=args.shadow_max_in_flight,
        shadow_max_compare_bytes=args.shadow_max_compare_bytes,
        cohort_key_budget=args.cohort_key_budget,
        series_grace_seconds=args.series_grace_seconds,
        max_body_bytes=args.max_body_bytes,
        read_timeout=args.read_timeout,
        trusted_networks=args.trusted_networks,
        pins_from_any_client=args.pins_from_any_client,
    )


def main(argv: Sequence[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        config = config_from_args(args)
    except ValueError as exc:
        parser.reject(str(exc))
    logging.basicConfig(
        level=args.log_level,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    kube: Connection | None = None
    source = f"file {config.routes_file}"
    if config.routes_file is None:
        try:
            kube = connect(config.kubeconfig, retries=False)
        except KubeConfigError as exc:
            parser.exit(2, f"modelroll-gateway: {exc}\n")
        source = f"ConfigMap {config.namespace or kube.namespace}/{config.configmap}"
    app = create_app(config, kube=kube)
    log.info("Starting the gateway on %s:%d with routes from %s", config.host, config.port, source)
    with asyncio.Runner(loop_factory=lambda: new_event_loop(args.event_loop, PROGRAM)) as runner:
        runner.run(serve(app, config))


def _cut_streams(app: web.Application) -> None:
    forwarder = app[PROXY_KEY].llm
    if forwarder is not None:
        cut = forwarder.streams.cut(STREAM_CUT_REASON)
        if cut:
            log.warning("Cut %d streams still open at the end of the drain", cut)


async def serve(
    app: web.Application,
    config: GatewayConfig,
    *,
    stop: Callable[[], Awaitable[object]] = stop_signal,
    unready_seconds: float = UNREADY_SECONDS,
) -> None:
    """Serve until `stop` returns (SIGTERM or SIGINT), then stop without refusing anyone: turn
    unready at once (every answer from then on closes its connection) but go on serving for
    `unready_seconds`, while Kubernetes stops sending new connections; then stop listening and
    give the requests still open the upstream timeout to be answered (see `drain_seconds`)."""
    metrics = app[METRICS_KEY]

    runner, _ = await start_server(
        app,
        config.host,
        config.port,
        ClientLimits(config.read_timeout, metrics.count_client_timeout),
        shutdown_timeout=config.upstream_timeout + LAST_ANSWER_SECONDS,
        # A client that goes away cancels its handler, which closes the connection to the
        # version: a chat stream still waiting in the engine's queue is dropped there, before
        # the engine spends anything on it (and a batch request stops waiting for its answer).
        handler_cancellation=True,
    )
    admin: web.AppRunner | None = None
    try:
        if config.admin_port:
            admin, _ = await start_server(
                create_admin_app(app),
                config.host,
                config.admin_port,
                ClientLimits(config.read_timeout),  # not the clients' metric
                shutdown_timeout=ADMIN_SHUTDOWN_TIMEOUT,
            )
            log.info(
                "Serving GET /metrics and GET /v1/routes on %s:%d",
                config.host,
                config.admin_port,
            )
        await stop()
        app[STOPPING_KEY].set()
        log.info("Turned the gateway unready; serving %g s more, then closing", unready_seconds)
        await asyncio.sleep(unready_seconds)
        # Requests still open get the upstream timeout to be answered; chat streams can outlast
        # it, so those still going then end with an SSE error event, written within the last
        # second of the drain, before their connections close.
        loop = asyncio.get_running_loop()
        loop.call_later(config.upstream_timeout, _cut_streams, app)
    finally:
        await runner.cleanup()
        if admin is not None:  # a last scrape sees what the drain answered
            await admin.cleanup()
    log.info("Stopped the gateway")
