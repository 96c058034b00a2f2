"""A scripted model server of the Open Inference Protocol on loopback, for the sidecar's
``--protocol openinference`` tests: it serves the model ``served`` (metadata with an input
``x`` of shape [-1, 2] and ``text`` of shape [-1]), answers each infer call with ``y``, every row
of ``x`` summed (or each ``text``'s word count), and misbehaves as ``answer`` asks. It records
every call's body."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from pytest_aiohttp import AiohttpServer

SERVED = "served"
POISON = -999.0
"""An ``x`` value the model refuses (400) in any call it is in."""


@dataclass
class OIPModel:
    url: str = ""
    answer: str = "right"
    """right; fewer_rows (one row short); unsplittable (one value short of its shape); no_outputs;
    strings_in_fp32 (an FP32 output holding strings); no_y (an output other than the one asked)."""
    metadata: dict[str, Any] = field(
        default_factory=lambda: {
            "name": SERVED,
            "versions": ["1"],
            "platform": "scripted",
            "inputs": [
                {"name": "x", "datatype": "FP32", "shape": [-1, 2]},
                {"name": "text", "datatype": "BYTES", "shape": [-1]},
            ],
            "outputs": [{"name": "y", "datatype": "FP32", "shape": [-1]}],
        }
    )
    ready: bool = True
    seconds: float = 0.0
    """How long each infer call takes."""
    calls: list[dict[str, Any]] = field(default_factory=list)

    def rows_sent(self) -> list[int]:
        """Each call's rows."""
        return [call["inputs"][0]["shape"][0] for call in self.calls]


MODEL = web.AppKey("model", OIPModel)


def _y(body: dict[str, Any]) -> tuple[list[float], int]:
    """The answer's data and rows: each row of x summed, or each text's words."""
    tensor = body["inputs"][0]
    rows = tensor["shape"][0]
    if tensor["datatype"] == "BYTES":
        return [float(len(text.split())) for text in tensor["data"]], rows
    width = len(tensor["data"]) // rows
    data = tensor["data"]
    return [float(sum(data[r * width : (r + 1) * width])) for r in range(rows)], rows


async def _infer(request: web.Request) -> web.Response:
    model = request.app[MODEL]
    if request.match_info["name"] != SERVED:
        return web.json_response({"error": "no such model"}, status=404)
    body = await request.json()
    model.calls.append(body)
    await asyncio.sleep(model.seconds)
    if any(POISON in t["data"] for t in body["inputs"] if t["datatype"] != "BYTES"):
        return web.json_response({"error": "cannot take -999"}, status=400)
    data, rows = _y(body)
    output: dict[str, Any] = {"name": "y", "datatype": "FP32", "shape": [rows], "data": data}
    if model.answer == "fewer_rows":
        output.update(shape=[rows - 1], data=data[:-1])
    elif model.answer == "unsplittable":
        output["data"] = data[:-1]
    elif model.answer == "strings_in_fp32":
        output["data"] = [str(v) for v in data]
    elif model.answer == "no_y":
        output["name"] = "z"
    outputs = [] if model.answer == "no_outputs" else [output]
    answer = {"model_name": SERVED, "id": body.get("id", "batch"), "outputs": outputs}
    return web.json_response(answer)


async def _health(request: web.Request) -> web.Response:
    return web.json_response({}, status=200 if request.app[MODEL].ready else 503)


async def _model_ready(request: web.Request) -> web.Response:
    ready = request.app[MODEL].ready and request.match_info["name"] == SERVED
    return web.json_response({}, status=200 if ready else 404)


async def _metadata(request: web.Request) -> web.Response:
    if request.match_info["name"] != SERVED:
        return web.json_response({"error": "no such model"}, status=404)
    return web.json_response(request.app[MODEL].metadata)


async def serve_oip_model(aiohttp_server: AiohttpServer, **settings: Any) -> OIPModel:
    app = web.Application()
    model = app[MODEL] = OIPModel(**settings)
    app.router.add_post("/v2/models/{name}/infer", _infer)
    app.router.add_get("/v2/health/ready", _health)
    app.router.add_get("/v2/models/{name}/ready", _model_ready)
    app.router.add_get("/v2/models/{name}", _metadata)
    server = await aiohttp_server(app, host="127.0.0.1")
    model.url = str(server.make_url("")).rstrip("/")
    return model
