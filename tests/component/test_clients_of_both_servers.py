"""`modelroll-gateway` and `modelroll-sidecar` as real processes (on uvloop, as they run in pods):
they cut off clients that send their request too slowly, answer them 408 in JSON, count them in
their metrics and keep answering everyone else; and a request they cannot parse gets JSON too."""

from __future__ import annotations

import asyncio
import json
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.gateway import route
from tests.support.processes import Spawn, free_port
from tests.support.rawclient import closed_by_server, post_bytes, read_response

READ_TIMEOUT_S = 0.5


@dataclass
class Server:
    port: int
    infer_path: str
    timeouts_metric: str
    metrics_port: int
    """Where GET /metrics is served: the sidecar's own port, the gateway's admin port."""

    async def connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        return await asyncio.open_connection("127.0.0.1", self.port)

    def cut_offs(self, phase: str) -> float:
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as resp:
            text = resp.read().decode()
        for line in text.splitlines():
            if line.startswith(self.timeouts_metric + "{") and f'phase="{phase}"' in line:
                return float(line.rsplit(" ", 1)[1])
        raise AssertionError(f"no {self.timeouts_metric} for phase {phase} in:\n{text}")


def _model(spawn: Spawn) -> str:
    port = free_port()
    spawn("modelroll-demo-model", f"--port={port}", ready=f"http://127.0.0.1:{port}/readyz")
    return f"http://127.0.0.1:{port}"


def _sidecar(spawn: Spawn, model: str, *args: str) -> int:
    port = free_port()
    spawn(
        "modelroll-sidecar",
        f"--port={port}",
        f"--upstream={model}",
        "--model=sentiment",
        "--version=v1",
        "--max-wait-ms=1",
        *args,
        ready=f"http://127.0.0.1:{port}/readyz",
    )
    return port


@pytest.fixture(params=["gateway", "sidecar"])
def server(request: pytest.FixtureRequest, spawn: Spawn, tmp_path: Path) -> Server:
    model = _model(spawn)
    if request.param == "sidecar":
        port = _sidecar(spawn, model, f"--read-timeout-ms={READ_TIMEOUT_S * 1000:g}")
        return Server(port, "/v1/infer", "modelroll_client_timeouts_total", port)
    sidecar = f"http://127.0.0.1:{_sidecar(spawn, model)}"
    routes = tmp_path / "routes.json"
    routes.write_text(json.dumps({"sentiment": route("sentiment", ("v1", 1, sidecar))}))
    port, admin_port = free_port(), free_port()
    spawn(
        "modelroll-gateway",
        f"--port={port}",
        f"--admin-port={admin_port}",
        f"--routes-file={routes}",
        f"--read-timeout={READ_TIMEOUT_S:g}",
        ready=f"http://127.0.0.1:{port}/readyz",
    )
    metric = "modelroll_gateway_client_timeouts_total"
    return Server(port, "/v1/models/sentiment/infer", metric, admin_port)


async def test_slow_clients_get_408_and_are_counted_while_others_are_served(
    server: Server,
) -> None:
    request = post_bytes(b'{"payload": "a fine sentence"}', server.infer_path)
    head_end = request.index(b"\r\n\r\n") + 4
    slow_head = await server.connect()
    slow_head[1].write(request[:20])
    slow_body = await server.connect()
    slow_body[1].write(request[: head_end + 5])
    silent = await server.connect()
    reader, writer = await server.connect()
    try:
        for _ in range(5):  # meanwhile, a client that sends its requests whole is served
            writer.write(request)
            status, _, body = await read_response(reader)
            assert status == 200, body
        for slow_reader, _ in (slow_head, slow_body):
            status, headers, body = await read_response(slow_reader)
            assert status == 408
            assert headers["content-type"].startswith("application/json")
            assert "did not arrive in full within 0.5s" in json.loads(body)["error"]
            assert await closed_by_server(slow_reader)
        assert await closed_by_server(silent[0])
        assert [server.cut_offs(p) for p in ("head", "body", "silent")] == [1, 1, 1]
        await asyncio.sleep(READ_TIMEOUT_S)  # a kept-alive connection may idle longer than that
        writer.write(request)
        assert (await read_response(reader))[0] == 200
    finally:
        for _, w in (slow_head, slow_body, silent, (reader, writer)):
            w.close()


@pytest.mark.parametrize(
    ("request_bytes", "message"),
    [
        (b"NOT-HTTP\r\n\r\n", "invalid method"),
        (b"GET /livez HTTP/1.1\r\nHost: t\r\nX-Long: " + b"a" * 20_000 + b"\r\n\r\n", "8190"),
        (b"POST /livez HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n", "duplicate"),
    ],
    ids=["not HTTP", "header too long", "two lengths"],
)
async def test_a_request_the_server_cannot_parse_gets_a_json_400(
    server: Server, request_bytes: bytes, message: str
) -> None:
    reader, writer = await server.connect()
    try:
        writer.write(request_bytes)
        status, headers, body = await read_response(reader)
        assert status == 400
        assert headers["content-type"] == "application/json"
        assert message in json.loads(body)["error"].lower()
        assert await closed_by_server(reader)
    finally:
        writer.close()
