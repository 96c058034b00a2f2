"""SIGTERM to a real sidecar process with hundreds of requests queued and in flight."""

from __future__ import annotations

import asyncio
import signal
import time
from collections import Counter

import aiohttp

from tests.conftest import Spawn, free_port

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


async def test_sigterm_answers_every_accepted_request_then_exits(spawn: Spawn) -> None:
    model_port, sidecar_port = free_port(), free_port()
    model = spawn(
        "modelroll-demo-model",
        "--port", str(model_port), "--fixed-ms", "100", "--per-token-ms", "0",
        ready=f"http://127.0.0.1:{model_port}/readyz",
    )  # fmt: skip
    base = f"http://127.0.0.1:{sidecar_port}"
    sidecar = spawn(
        "modelroll-sidecar",
        "--port", str(sidecar_port), "--upstream", f"http://127.0.0.1:{model_port}",
        "--max-batch-size", "16", "--max-wait-ms", "20000", "--timeout-ms", "60000",
        "--max-queue-size", "1000",
        ready=f"{base}/readyz",
    )  # fmt: skip

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
    """GET /prestop (the pod's preStop hook): for --prestop-delay-ms the sidecar still answers
    requests, but turns unready, closes idle keep-alive connections at once and every other one
    after its answer, so that a client behind a Service reconnects to another pod."""
    model_port, sidecar_port = free_port(), free_port()
    spawn(
        "modelroll-demo-model", "--port", str(model_port), "--fixed-ms", "1",
        ready=f"http://127.0.0.1:{model_port}/readyz",
    )  # fmt: skip
    base = f"http://127.0.0.1:{sidecar_port}"
    sidecar = spawn(
        "modelroll-sidecar", "--port", str(sidecar_port),
        "--upstream", f"http://127.0.0.1:{model_port}", "--prestop-delay-ms", "1500",
        ready=f"{base}/readyz",
    )  # fmt: skip
    body = b'{"payload": "a fine day"}'
    request = (
        b"POST /v1/infer HTTP/1.1\r\nHost: sidecar\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
    )
    # A keep-alive connection that has had its answer and now waits, as a gateway's pool would.
    idle_reader, idle_writer = await asyncio.open_connection("127.0.0.1", sidecar_port)
    idle_writer.write(request)
    assert (await idle_reader.readuntil(b"\r\n")).startswith(b"HTTP/1.1 200")

    async with aiohttp.ClientSession() as session:
        started = time.monotonic()
        prestop = asyncio.ensure_future(session.get(f"{base}/prestop"))
        await asyncio.sleep(0.3)
        # The idle connection was closed by the sidecar: reading ends in EOF, long before the
        # delay is over.
        rest = await asyncio.wait_for(idle_reader.read(), 1.0)
        assert rest.endswith(b"}") or rest == b""  # the rest of the first answer, then EOF
        assert idle_reader.at_eof()
        idle_writer.close()
        async with session.get(f"{base}/readyz") as ready:
            assert ready.status == 503
        # Requests are still served meanwhile, each telling the client to close.
        async with session.post(f"{base}/v1/infer", json={"payload": "still here"}) as resp:
            assert resp.status == 200
            assert resp.headers.get("Connection", "").lower() == "close"
            assert (await resp.json())["output"]["length"] == 2
        response = await prestop
        waited = time.monotonic() - started
        assert response.status == 200
        response.release()
    assert 1.4 < waited < 5.0, f"/prestop answered after {waited:.2f}s"
    assert "Closing default/v1" in sidecar.log()
