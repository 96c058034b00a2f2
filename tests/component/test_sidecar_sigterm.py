"""SIGTERM to a real sidecar process with hundreds of requests queued and in flight."""

from __future__ import annotations

import asyncio
import signal
import time
from collections import Counter

import aiohttp
import pytest

from tests.support.processes import Spawn, free_port

REQUESTS = 405  # not a multiple of the batch size: the last batch is partial


async def accepted(session: aiohttp.ClientSession, base: str) -> float:
    """Requests the sidecar has taken in: those queued plus those sent to the model in batches."""
    async with session.get(base + "/metrics") as resp:
        text = await resp.text()
    total = 0.0
    for line in text.splitlines():
        if line.startswith(("modelroll_queue_depth{", "modelroll_batch_size_sum{")):
            total += float(line.rsplit(" ", 1)[1])
    return total


async def queue_depth(session: aiohttp.ClientSession, base: str) -> float:
    async with session.get(base + "/metrics") as resp:
        for line in (await resp.text()).splitlines():
            if line.startswith("modelroll_queue_depth{"):
                return float(line.rsplit(" ", 1)[1])
    return 0.0


@pytest.mark.parametrize(
    "mode",
    [("--batch-by", "arrival", "--wait-policy", "fixed"), ()],
    ids=["arrival-fixed", "defaults"],
)
async def test_sigterm_answers_every_accepted_request_then_exits(
    spawn: Spawn, mode: tuple[str, ...]
) -> None:
    model_port, sidecar_port = free_port(), free_port()
    model = spawn(
        "modelroll-demo-model",
        "--port",
        str(model_port),
        "--fixed-ms",
        "100",
        "--per-token-ms",
        "0",
        ready=f"http://127.0.0.1:{model_port}/readyz",
    )
    base = f"http://127.0.0.1:{sidecar_port}"
    sidecar = spawn(
        "modelroll-sidecar",
        "--port",
        str(sidecar_port),
        "--upstream",
        f"http://127.0.0.1:{model_port}",
        "--max-batch-size",
        "16",
        "--max-wait-ms",
        "20000",
        "--timeout-ms",
        "60000",
        "--max-queue-size",
        "1000",
        *mode,
        ready=f"{base}/readyz",
    )

    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def infer(i: int) -> int:
            async with session.post(f"{base}/v1/infer", json={"payload": f"req {i}"}) as resp:
                await resp.read()
                return resp.status

        calls = [asyncio.ensure_future(infer(i)) for i in range(REQUESTS)]
        # SIGTERM once every request is in (requests still on the wire would rightly get 503).
        while await accepted(session, base) < REQUESTS:  # noqa: ASYNC110 (polls a metric)
            await asyncio.sleep(0.01)
        assert await queue_depth(session, base) > REQUESTS / 2  # most are still queued

        sidecar.signal(signal.SIGTERM)
        signalled = time.monotonic()
        await asyncio.sleep(0.05)
        async with session.get(f"{base}/readyz") as ready:
            ready_status = ready.status
        late = await infer(-1)

        statuses = Counter(await asyncio.gather(*calls))
        exit_code = await asyncio.to_thread(sidecar.wait, 30)
        exited_after = time.monotonic() - signalled

        async with session.get(f"http://127.0.0.1:{model_port}/v1/stats") as resp:
            stats = await resp.json()

    assert statuses == {200: REQUESTS}, sidecar.log()
    assert ready_status == 503
    assert late == 503
    assert exit_code == 0
    # The last, partial batch went at once: nobody waited for the 20 s max-wait.
    assert exited_after < 12
    assert stats["items"] == REQUESTS
    assert "Stopped" in sidecar.log()
    assert model.popen.poll() is None


async def test_prestop_keeps_serving_but_sends_clients_elsewhere(spawn: Spawn) -> None:
    """GET /prestop on the control port (the pod's preStop hook): for --prestop-delay-ms the
    sidecar still answers requests, but turns unready and closes every connection after its
    next answer, so that a client behind a Service reconnects to another pod. An idle keep-alive
    connection stays open until the end of the delay: a client writing on it meanwhile gets its
    answer, not a closed socket (which would cost it the request); one nobody used is closed at
    the end."""
    model_port, sidecar_port, control_port = free_port(), free_port(), free_port()
    spawn(
        "modelroll-demo-model",
        "--port",
        str(model_port),
        "--fixed-ms",
        "1",
        ready=f"http://127.0.0.1:{model_port}/readyz",
    )
    base = f"http://127.0.0.1:{sidecar_port}"
    sidecar = spawn(
        "modelroll-sidecar",
        "--port",
        str(sidecar_port),
        "--upstream",
        f"http://127.0.0.1:{model_port}",
        "--prestop-delay-ms",
        "1500",
        "--control-port",
        str(control_port),
        ready=f"{base}/readyz",
    )
    body = b'{"payload": "a fine day"}'
    request = (
        b"POST /v1/infer HTTP/1.1\r\nHost: sidecar\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
    )

    async def kept_alive() -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A keep-alive connection that has had its answer and now waits, as in a pool."""
        reader, writer = await asyncio.open_connection("127.0.0.1", sidecar_port)
        writer.write(request)
        head = await reader.readuntil(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200")
        length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
        await reader.readexactly(length)
        return reader, writer

    used_reader, used_writer = await kept_alive()
    unused_reader, unused_writer = await kept_alive()

    async with aiohttp.ClientSession() as session:
        started = time.monotonic()
        prestop = asyncio.ensure_future(session.get(f"http://127.0.0.1:{control_port}/prestop"))
        await asyncio.sleep(0.3)
        async with session.get(f"{base}/readyz") as ready:
            assert ready.status == 503
        # The idle connection still takes a request; its answer tells the client to close.
        used_writer.write(request)
        head = await asyncio.wait_for(used_reader.readuntil(b"\r\n\r\n"), 1.0)
        assert head.startswith(b"HTTP/1.1 200")
        assert b"connection: close" in head.lower()
        await asyncio.wait_for(used_reader.read(), 1.0)  # the body, then the sidecar closes
        assert used_reader.at_eof()
        used_writer.close()
        # The unused one is still open before the delay is over...
        assert not unused_reader.at_eof()
        # ...and requests on new connections are served meanwhile, each told to close.
        async with session.post(f"{base}/v1/infer", json={"payload": "still here"}) as resp:
            assert resp.status == 200
            assert resp.headers.get("Connection", "").lower() == "close"
            assert (await resp.json())["output"]["length"] == 2
        response = await prestop
        waited = time.monotonic() - started
        assert response.status == 200
        response.release()
        # At the end of the delay the unused idle connection was closed.
        assert await asyncio.wait_for(unused_reader.read(), 1.0) == b""
        unused_writer.close()
    assert 1.4 < waited < 5.0, f"/prestop answered after {waited:.2f}s"
    assert "Closing default/v1" in sidecar.log()
