"""The gateway's Open Inference Protocol (KServe v2) paths, in front of stand-in versions that
speak it: inferences routed by weight, pinned, sticky by cohort, counted per version; the health,
server and model metadata a client asks first; errors in the protocol's shape."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web
from pytest_aiohttp import AiohttpServer

from modelroll_gateway.app import STOPPING_KEY
from modelroll_gateway.config import parse_networks
from modelroll_gateway.shadow import agreement
from tests.support.gateway import Gateway, RoutesFile, StartGateway, route
from tests.support.scripted_engines import until

MODEL = "iris"


@dataclass
class Version:
    """A stand-in version speaking the Open Inference Protocol: its answer's ``scores`` are
    each input value times ``factor``; an input named ``bad`` gets a 400."""

    name: str
    factor: float = 1.0
    url: str = ""
    paths: list[str] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)


VERSION = web.AppKey("version", Version)


async def _infer(request: web.Request) -> web.Response:
    version = request.app[VERSION]
    version.paths.append(request.path)
    version.headers.append(dict(request.headers))
    doc = await request.json()
    tensor = doc["inputs"][0]
    if tensor["name"] == "bad":
        return web.json_response({"error": "input 'bad' is not one the model takes"}, status=400)
    answer: dict[str, Any] = {
        "model_name": request.match_info["model"],
        "model_version": version.name,
        "outputs": [
            {
                "name": "scores",
                "datatype": "FP64",
                "shape": tensor["shape"],
                "data": [x * version.factor for x in tensor["data"]],
            }
        ],
    }
    if "id" in doc:
        answer["id"] = doc["id"]
    return web.json_response(answer)


async def _metadata(request: web.Request) -> web.Response:
    version = request.app[VERSION]
    version.paths.append(request.path)
    return web.json_response(
        {
            "name": request.match_info["model"],
            "versions": [version.name],
            "platform": "stand-in",
            "inputs": [{"name": "x", "datatype": "FP64", "shape": [-1, 2]}],
            "outputs": [{"name": "scores", "datatype": "FP64", "shape": [-1, 2]}],
        }
    )


async def start_version(aiohttp_server: AiohttpServer, name: str, factor: float = 1.0) -> Version:
    app = web.Application()
    version = app[VERSION] = Version(name, factor)
    app.router.add_post("/v2/models/{model}/infer", _infer)
    app.router.add_get("/v2/models/{model}", _metadata)
    server = await aiohttp_server(app, host="127.0.0.1")
    version.url = str(server.make_url("")).rstrip("/")
    return version


def request(rows: list[list[float]], name: str = "x", **extra: Any) -> dict[str, Any]:
    """An inference request of one FP64 tensor of ``rows``."""
    data = [x for row in rows for x in row]
    tensor = {"name": name, "datatype": "FP64", "shape": [len(rows), len(rows[0])], "data": data}
    return {"inputs": [tensor], **extra}


async def infer(
    gateway: Gateway,
    body: Any,
    *,
    path: str = f"/v2/models/{MODEL}/infer",
    headers: dict[str, str] | None = None,
) -> tuple[int, str, Any]:
    """POST an inference; (status, X-Modelroll-Version, JSON body)."""
    async with gateway.session.post(gateway.url(path), json=body, headers=headers) as resp:
        return resp.status, resp.headers.get("X-Modelroll-Version", ""), await resp.json()


async def get(gateway: Gateway, path: str, **headers: str) -> tuple[int, Any]:
    async with gateway.session.get(gateway.url(path), headers=headers) as resp:
        return resp.status, await resp.json()


async def two_versions(
    aiohttp_server: AiohttpServer,
    start_gateway: StartGateway,
    routes_file: RoutesFile,
    weights: tuple[int, int] = (3, 1),
    cohort_header: str | None = None,
    **settings: Any,
) -> tuple[Gateway, Version, Version]:
    """A gateway routing MODEL to stable-v1 and canary-v2 by ``weights``."""
    stable = await start_version(aiohttp_server, "stable-v1")
    canary = await start_version(aiohttp_server, "canary-v2")
    routes_file.write(
        {
            MODEL: route(
                MODEL,
                ("stable-v1", weights[0], stable.url),
                ("canary-v2", weights[1], canary.url),
                cohort_header=cohort_header,
            )
        }
    )
    gateway = await start_gateway(**settings)
    await gateway.wait_weights(MODEL, {"stable-v1": weights[0], "canary-v2": weights[1]})
    return gateway, stable, canary


def requests(gateway: Gateway, version: str, routing: str, code: str = "200") -> float:
    labels = {"model": MODEL, "version": version, "routing": routing, "code": code}
    return gateway.sample("modelroll_gateway_requests_total", **labels)


async def test_inferences_are_routed_by_weight_and_counted_per_version(
    aiohttp_server: AiohttpServer, start_gateway: StartGateway, routes_file: RoutesFile
) -> None:
    gateway, stable, canary = await two_versions(aiohttp_server, start_gateway, routes_file)

    seen = Counter[str]()
    for i in range(8):
        status, version, answer = await infer(gateway, request([[i, 1.0]], id=f"r{i}"))
        assert status == 200
        assert answer["model_version"] == version
        assert answer["id"] == f"r{i}"
        assert answer["outputs"][0]["data"] == [i, 1.0]
        seen[version] += 1
    assert seen == {"stable-v1": 6, "canary-v2": 2}
    assert requests(gateway, "stable-v1", "weight") == 6
    assert requests(gateway, "canary-v2", "weight") == 2
    # Each version got the protocol's own path of the model, with the client's headers.
    assert set(stable.paths) == set(canary.paths) == {f"/v2/models/{MODEL}/infer"}
    assert stable.headers[0]["Content-Type"] == "application/json"


async def test_a_version_is_pinned_by_header_or_by_the_path(
    aiohttp_server: AiohttpServer, start_gateway: StartGateway, routes_file: RoutesFile
) -> None:
    gateway, _, canary = await two_versions(
        aiohttp_server, start_gateway, routes_file, weights=(1, 0)
    )
    body = request([[1.0, 2.0]])

    pinned = {"X-Modelroll-Version": "canary-v2"}
    assert (await infer(gateway, body, headers=pinned))[:2] == (200, "canary-v2")
    by_path = f"/v2/models/{MODEL}/versions/canary-v2/infer"
    assert (await infer(gateway, body, path=by_path))[:2] == (200, "canary-v2")
    assert (await infer(gateway, body, path=by_path, headers=pinned))[:2] == (200, "canary-v2")
    assert requests(gateway, "canary-v2", "pin") == 3
    assert canary.paths == [f"/v2/models/{MODEL}/infer"] * 3

    status, version, answer = await infer(
        gateway, body, path=by_path, headers={"X-Modelroll-Version": "stable-v1"}
    )
    assert (status, version) == (400, "")
    assert answer == {
        "error": "the path names version 'canary-v2' and the X-Modelroll-Version header "
        "'stable-v1': name one version"
    }
    unknown = f"/v2/models/{MODEL}/versions/3/infer"
    assert await infer(gateway, body, path=unknown) == (
        404,
        "",
        {"error": "unknown version '3' of model 'iris'"},
    )


async def test_a_client_outside_the_trusted_networks_pins_nothing_by_the_path(
    aiohttp_server: AiohttpServer, start_gateway: StartGateway, routes_file: RoutesFile
) -> None:
    gateway, _, canary = await two_versions(
        aiohttp_server,
        start_gateway,
        routes_file,
        weights=(1, 0),
        trusted_networks=parse_networks("10.0.0.0/8"),
    )
    for pinned in ("canary-v2", "a-guess"):
        path = f"/v2/models/{MODEL}/versions/{pinned}/infer"
        status, version, _ = await infer(gateway, request([[1.0, 2.0]]), path=path)
        assert (status, version) == (200, "stable-v1")
    assert canary.paths == []
    assert gateway.sample("modelroll_gateway_pins_ignored_total") == 2


async def test_a_cohort_stays_on_its_version(
    aiohttp_server: AiohttpServer, start_gateway: StartGateway, routes_file: RoutesFile
) -> None:
    gateway, _, _ = await two_versions(
        aiohttp_server, start_gateway, routes_file, weights=(1, 1), cohort_header="X-User"
    )
    for user in ("ann", "bob", "cy", "dee"):
        answered = {
            (await infer(gateway, request([[1.0, 2.0]]), headers={"X-User": user}))[1]
            for _ in range(4)
        }
        assert len(answered) == 1, f"user {user} went to {answered}"
    counted = requests(gateway, "stable-v1", "cohort") + requests(gateway, "canary-v2", "cohort")
    assert counted == 16


async def test_errors_are_in_the_protocols_shape_with_its_statuses(
    aiohttp_server: AiohttpServer, start_gateway: StartGateway, routes_file: RoutesFile
) -> None:
    stable = await start_version(aiohttp_server, "stable-v1")
    routes_file.write(
        {
            MODEL: route(MODEL, ("stable-v1", 1, stable.url), ("gone-v0", 0, "http://127.0.0.1:9")),
            "idle": route("idle", ("idle-v1", 0, stable.url)),
        }
    )
    gateway = await start_gateway(max_body_bytes=1000)
    await gateway.wait_weights("idle", {"idle-v1": 0})
    body = request([[1.0, 2.0]])

    unknown = {"error": "unknown model 'nope'"}
    assert await infer(gateway, body, path="/v2/models/nope/infer") == (404, "", unknown)
    assert await get(gateway, "/v2/models/nope") == (404, unknown)
    assert await get(gateway, "/v2/models/nope/ready") == (404, unknown)
    no_weight = {"error": "model 'idle' has no routable version (total weight is 0)"}
    assert await infer(gateway, body, path="/v2/models/idle/infer") == (503, "", no_weight)
    assert await get(gateway, "/v2/models/idle/ready") == (503, no_weight)
    # The version's own error passes on as it is.
    assert await infer(gateway, request([[1.0]], name="bad")) == (
        400,
        "stable-v1",
        {"error": "input 'bad' is not one the model takes"},
    )
    status, version, answer = await infer(gateway, body, headers={"X-Modelroll-Version": "gone-v0"})
    assert (status, version) == (502, "gone-v0")
    assert answer == {"error": "version 'gone-v0' could not be reached"}
    assert await get(gateway, f"/v2/models/{MODEL}", **{"X-Modelroll-Version": "gone-v0"}) == (
        502,
        {"error": "version 'gone-v0' could not be reached"},
    )
    too_large = request([[1.0] * 400])
    assert await infer(gateway, too_large) == (
        413,
        "",
        {"error": "request body exceeds 1000 bytes"},
    )
    binary = {"Inference-Header-Content-Length": "40"}
    assert await infer(gateway, body, headers=binary) == (
        400,
        "",
        {
            "error": "the binary tensor data extension (Inference-Header-Content-Length) is "
            "not supported: send tensors as JSON (tritonclient: binary_data=False)"
        },
    )
    assert await get(gateway, "/v2/repository/index") == (
        404,
        {"error": "no such path '/v2/repository/index'"},
    )
    async with gateway.session.get(gateway.url(f"/v2/models/{MODEL}/infer")) as resp:
        assert resp.status == 405
        assert (await resp.json())["error"].startswith("method GET is not allowed")
    # Requests no version answered: an unknown model has no label of its own.
    unrouted = "modelroll_gateway_requests_total"
    assert gateway.sample(unrouted, model="", version="", code="404") == 1
    assert gateway.sample(unrouted, model=MODEL, version="", code="413") == 1


async def test_health_and_server_metadata(
    aiohttp_server: AiohttpServer, start_gateway: StartGateway, routes_file: RoutesFile
) -> None:
    gateway, _, _ = await two_versions(aiohttp_server, start_gateway, routes_file)

    assert await get(gateway, "/v2/health/live") == (200, {"live": True})
    assert await get(gateway, "/v2/health/ready") == (200, {"ready": True})
    status, server = await get(gateway, "/v2")
    assert status == 200
    assert server["name"] == "modelroll-gateway"
    assert server["extensions"] == []
    assert isinstance(server["version"], str)
    gateway.server.app[STOPPING_KEY].set()  # as on SIGTERM
    assert await get(gateway, "/v2/health/ready") == (
        503,
        {"error": "the gateway is shutting down"},
    )
    assert await get(gateway, "/v2/health/live") == (200, {"live": True})


@pytest.mark.parametrize(
    ("path", "pinned"),
    [
        (f"/v2/models/{MODEL}", "canary-v2"),
        (f"/v2/models/{MODEL}/versions/canary-v2", None),
    ],
)
async def test_a_models_metadata_and_readiness_come_from_the_version_a_request_would_reach(
    aiohttp_server: AiohttpServer,
    start_gateway: StartGateway,
    routes_file: RoutesFile,
    path: str,
    pinned: str | None,
) -> None:
    gateway, _, canary = await two_versions(
        aiohttp_server, start_gateway, routes_file, weights=(1, 0)
    )

    status, metadata = await get(gateway, f"/v2/models/{MODEL}")
    assert (status, metadata["name"], metadata["versions"]) == (200, MODEL, ["stable-v1"])
    headers = {"X-Modelroll-Version": pinned} if pinned is not None else {}
    async with gateway.session.get(gateway.url(path), headers=headers) as resp:
        assert resp.status == 200
        assert resp.headers["X-Modelroll-Version"] == "canary-v2"
        assert (await resp.json())["versions"] == ["canary-v2"]
    assert canary.paths == [f"/v2/models/{MODEL}"]
    assert await get(gateway, f"/v2/models/{MODEL}/ready") == (200, {"name": MODEL, "ready": True})
    assert await get(gateway, f"{path}/ready", **headers) == (200, {"name": MODEL, "ready": True})
    # Questions about the model are no requests a canary analysis counts.
    assert gateway.sample("modelroll_gateway_requests_total") == 0


async def test_shadow_copies_go_to_the_protocols_path_and_are_compared_by_tensor(
    aiohttp_server: AiohttpServer, start_gateway: StartGateway, routes_file: RoutesFile
) -> None:
    stable = await start_version(aiohttp_server, "stable-v1")
    # Scaled rows point the same way; the negated ones the opposite way.
    scaled = await start_version(aiohttp_server, "scaled-v2", factor=2.0)
    negated = await start_version(aiohttp_server, "negated-v3", factor=-1.0)
    versions = [
        {"name": "stable-v1", "weight": 1, "endpoint": stable.url},
        {"name": "scaled-v2", "weight": 0, "endpoint": scaled.url, "shadow": 100},
        {"name": "negated-v3", "weight": 0, "endpoint": negated.url, "shadow": 50},
    ]
    routes_file.write({MODEL: {"model": MODEL, "versions": versions}})
    gateway = await start_gateway()
    await gateway.wait_weights(MODEL, {"stable-v1": 1, "scaled-v2": 0, "negated-v3": 0})

    for _ in range(4):
        status, version, _ = await infer(gateway, request([[3.0, 4.0], [1.0, 0.0]]))
        assert (status, version) == (200, "stable-v1")
    await until(lambda: gateway.shadow_outcomes(MODEL) == {"compared": 6}, "six copies compared")
    assert scaled.paths == [f"/v2/models/{MODEL}/infer"] * 4
    assert negated.paths == [f"/v2/models/{MODEL}/infer"] * 2
    for shadow, mean in (("scaled-v2", 1.0), ("negated-v3", -1.0)):
        labels = {"model": MODEL, "version": shadow, "primary": "stable-v1"}
        count = gateway.sample("modelroll_gateway_shadow_agreement_count", **labels)
        total = gateway.sample("modelroll_gateway_shadow_agreement_sum", **labels)
        assert total / count == mean


async def _batch_shaped(request: web.Request) -> web.Response:
    return web.json_response({"output": [1.0, 2.0], "model": MODEL, "version": "odd-v2"})


async def test_a_shadow_answering_in_another_shape_is_incomparable(
    aiohttp_server: AiohttpServer, start_gateway: StartGateway, routes_file: RoutesFile
) -> None:
    stable = await start_version(aiohttp_server, "stable-v1")
    app = web.Application()
    app.router.add_post("/v2/models/{model}/infer", _batch_shaped)
    odd = str((await aiohttp_server(app, host="127.0.0.1")).make_url("")).rstrip("/")
    versions = [
        {"name": "stable-v1", "weight": 1, "endpoint": stable.url},
        {"name": "odd-v2", "weight": 0, "endpoint": odd, "shadow": 100},
    ]
    routes_file.write({MODEL: {"model": MODEL, "versions": versions}})
    gateway = await start_gateway()
    await gateway.wait_weights(MODEL, {"stable-v1": 1, "odd-v2": 0})

    assert (await infer(gateway, request([[1.0, 2.0]])))[:2] == (200, "stable-v1")
    await until(lambda: bool(gateway.shadow_outcomes(MODEL)), "the copy answered")
    assert gateway.shadow_outcomes(MODEL) == {"incomparable": 1}


def answer(*tensors: tuple[str, str, list[int], list[Any]]) -> bytes:
    """An Open Inference Protocol answer of (name, datatype, shape, data) tensors."""
    outputs = [{"name": n, "datatype": t, "shape": s, "data": d} for n, t, s, d in tensors]
    return json.dumps({"model_name": MODEL, "id": "1", "outputs": outputs}).encode()


def test_tensors_agree_row_by_row_and_answers_by_their_mean() -> None:
    probabilities = ("probs", "FP32", [2, 2], [0.6, 0.8, 1.0, 0.0])
    # Rows of floats by cosine: the second row turned a right angle.
    turned = ("probs", "FP32", [2, 2], [0.6, 0.8, 0.0, 1.0])
    assert agreement(answer(probabilities), answer(turned)) == 0.5
    # Nested data is the same tensor as flat data.
    nested = ("probs", "FP32", [2, 2], [[0.6, 0.8], [1.0, 0.0]])
    assert agreement(answer(probabilities), answer(nested)) == 1.0
    # Labels, one per row: equal or not, whatever their type.
    labels = ("label", "INT64", [4], [1, 0, 2, 2])
    assert agreement(answer(labels), answer(("label", "INT64", [4], [1, 0, 2, 0]))) == 0.75
    texts = ("text", "BYTES", [2], ["yes", "no"])
    assert agreement(answer(texts), answer(("text", "BYTES", [2], ["yes", "yes"]))) == 0.5
    # A score per row is a label too: equal or not.
    scores = ("score", "FP64", [2, 1], [0.5, 0.25])
    assert agreement(answer(scores), answer(("score", "FP64", [2, 1], [0.5, 0.5]))) == 0.5
    # A tensor without values agrees with itself.
    empty: tuple[str, str, list[int], list[Any]] = ("none", "FP32", [3, 0], [])
    assert agreement(answer(empty), answer(empty)) == 1.0
    # Several tensors: the mean of theirs, whatever their order.
    assert agreement(answer(probabilities, labels), answer(labels, turned)) == 0.75


@pytest.mark.parametrize(
    ("copy", "why"),
    [
        (answer(("other", "FP32", [2, 2], [0.6, 0.8, 1.0, 0.0])), r"\['probs'\] and \['other'\]"),
        (answer(("probs", "FP64", [2, 2], [0.6, 0.8, 1.0, 0.0])), "differs in datatype or shape"),
        (answer(("probs", "FP32", [4], [0.6, 0.8, 1.0, 0.0])), "differs in datatype or shape"),
        (answer(("probs", "FP32", [2, 2], [0.6, 0.8, 1.0])), r"3 values for shape \[2, 2\]"),
        (json.dumps({"output": [0.6, 0.8, 1.0, 0.0]}).encode(), "no outputs"),
        (json.dumps({"outputs": []}).encode(), "no outputs"),
    ],
    ids=["name", "datatype", "shape", "short-data", "batch-shape", "no-outputs"],
)
def test_tensors_that_differ_in_name_datatype_or_shape_are_incomparable(
    copy: bytes, why: str
) -> None:
    primary = answer(("probs", "FP32", [2, 2], [0.6, 0.8, 1.0, 0.0]))
    with pytest.raises(ValueError, match=why):
        agreement(primary, copy)


async def test_a_cohorts_metadata_is_its_versions_and_spends_none_of_its_budget(
    aiohttp_server: AiohttpServer, start_gateway: StartGateway, routes_file: RoutesFile
) -> None:
    gateway, _, _ = await two_versions(
        aiohttp_server,
        start_gateway,
        routes_file,
        weights=(1, 1),
        cohort_header="X-User",
        cohort_key_budget=1,
    )
    user = {"X-User": "ann"}
    asked = set()
    for _ in range(3):
        async with gateway.session.get(gateway.url(f"/v2/models/{MODEL}"), headers=user) as resp:
            assert resp.status == 200
            asked.add(resp.headers["X-Modelroll-Version"])
    (version,) = asked
    assert (await infer(gateway, request([[1.0, 2.0]]), headers=user))[:2] == (200, version)
    # The key's one judged request a minute is its first inference.
    assert requests(gateway, version, "cohort") == 1
