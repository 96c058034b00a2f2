"""``modelroll-sidecar``: serve the batching sidecar until SIGTERM, then shut down in order.

On SIGTERM (or SIGINT): /readyz and new requests answer 503 at once; everything queued is sent to
the model without waiting for max-wait; in-flight batches finish; then the process exits. Before
that, in a pod, the kubelet's preStop hook calls GET /prestop: see :meth:`Sidecar.prestop`.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from collections.abc import Sequence

from aiohttp import web

from .app import SIDECAR, create_app
from .config import SidecarConfig, parse_args

log = logging.getLogger("modelroll_sidecar")


async def serve(config: SidecarConfig) -> None:
    app = create_app(config)
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
    await runner.setup()
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

    app[SIDECAR].close_idle_connections = close_idle_connections
    site = web.TCPSite(runner, config.host, config.port, reuse_address=True)
    await site.start()
    log.info(
        "Serving %s/%s on %s:%d in front of %s",
        config.model,
        config.version,
        config.host,
        config.port,
        config.upstream,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    sidecar = app[SIDECAR]
    log.info("Received a stop signal with %d requests queued", sidecar.depth)
    await sidecar.shutdown()  # the listener stays open meanwhile: late requests get 503
    await runner.cleanup()
    log.info("Stopped %s/%s", config.model, config.version)


def configure_logging() -> None:
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
        stream=sys.stderr,
    )


def new_event_loop(kind: str) -> asyncio.AbstractEventLoop:
    """uvloop's loop when asked for, or by default when it is installed; else asyncio's."""
    if kind != "asyncio":
        try:
            import uvloop
        except ImportError as exc:
            if kind == "uvloop":
                raise SystemExit(
                    "modelroll-sidecar: --event-loop uvloop, but uvloop is not installed"
                ) from exc
        else:
            return uvloop.new_event_loop()
    return asyncio.new_event_loop()


def main(argv: Sequence[str] | None = None) -> None:
    config = parse_args(argv)
    configure_logging()
    with asyncio.Runner(loop_factory=lambda: new_event_loop(config.event_loop)) as runner:
        runner.run(serve(config))


if __name__ == "__main__":
    main()
