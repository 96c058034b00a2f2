"""``modelroll-sidecar``: serve the batching sidecar until SIGTERM, then shut down in order.

On SIGTERM (or SIGINT): /readyz and new requests answer 503 at once; everything queued is sent to
the model without waiting for max-wait; in-flight batches finish; then the process exits. Before
that, in a pod, the kubelet's preStop hook calls GET /prestop on --control-port, which listens on
127.0.0.1 only: see :meth:`Sidecar.prestop` and :mod:`modelroll_sidecar.prestop`.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Sequence

from aiohttp import web

from modelroll_common.server import ClientLimits, new_event_loop, start_server, stop_signal

from .app import SIDECAR, create_app, create_control_app
from .config import SidecarConfig, parse_args

log = logging.getLogger("modelroll_sidecar")
PROGRAM = "modelroll-sidecar"
SHUTDOWN_TIMEOUT_S = 60.0
"""How long runner.cleanup() waits for handlers still open after the drain (aiohttp's default)."""
CONTROL_HOST = "127.0.0.1"
"""Where the control listener binds, whatever --host says: only the pod itself reaches it."""
CONTROL_SHUTDOWN_TIMEOUT_S = 1.0
"""How long the control listener's cleanup waits for a GET /prestop still open: nothing is lost
when it is cut short, since the drain that follows SIGTERM is what answers requests."""


async def serve(config: SidecarConfig) -> None:
    app = create_app(config)
    sidecar = app[SIDECAR]
    limits = ClientLimits(config.read_timeout_ms / 1000, sidecar.metrics.count_client_timeout)
    runner, _ = await start_server(
        app,
        config.host,
        config.port,
        limits,
        shutdown_timeout=SHUTDOWN_TIMEOUT_S,
        handler_cancellation=True,
    )
    server = runner.server
    assert server is not None  # set by setup()

    def close_idle_connections() -> int:
        """Close every keep-alive connection that waits for its next request; the others close
        after their answer (it carries "Connection: close"). Idle is what aiohttp's own
        keep-alive expiry tests (RequestHandler._process_keepalive): a pending ``_waiter``."""
        closed = 0
        for connection in list(server.connections):
            waiter = connection._waiter
            if waiter is not None and not waiter.done():
                connection.force_close()
                closed += 1
            else:
                connection.close()
        return closed

    sidecar.close_idle_connections = close_idle_connections
    control: web.AppRunner | None = None
    try:
        if config.control_port:
            control, _ = await start_server(
                create_control_app(sidecar),
                CONTROL_HOST,
                config.control_port,
                ClientLimits(config.read_timeout_ms / 1000),  # not the inference clients' metric
                shutdown_timeout=CONTROL_SHUTDOWN_TIMEOUT_S,
                handler_cancellation=True,
            )
            log.info("Serving GET /prestop on %s:%d", CONTROL_HOST, config.control_port)
        log.info(
            "Serving %s/%s on %s:%d in front of %s",
            config.model,
            config.version,
            config.host,
            config.port,
            config.upstream,
        )
        await stop_signal()
        log.info("Received a stop signal with %d requests queued", sidecar.depth)
        await sidecar.shutdown()  # the listener stays open meanwhile: late requests get 503
    finally:
        if control is not None:
            await control.cleanup()
        await runner.cleanup()
    log.info("Stopped %s/%s", config.model, config.version)


def configure_logging() -> None:
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
        stream=sys.stderr,
    )


def main(argv: Sequence[str] | None = None) -> None:
    config = parse_args(argv)
    configure_logging()
    with asyncio.Runner(loop_factory=lambda: new_event_loop(config.event_loop, PROGRAM)) as runner:
        runner.run(serve(config))


if __name__ == "__main__":
    main()
