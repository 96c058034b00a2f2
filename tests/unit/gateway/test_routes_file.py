"""The gateway follows its routes file; an invalid document never replaces the last good routes."""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path

from modelroll_common.routes import ModelRoute, VersionRoute, dump_model_route
from tests.support.gateway import RoutesFile, StartGateway, StartStandIn, route


async def test_a_changed_routes_file_changes_the_split(
    start_gateway: StartGateway, start_standin: StartStandIn, routes_file: RoutesFile
) -> None:
    a, b = await start_standin("a"), await start_standin("b")
    routes_file.write({"m": route("m", ("a", 9, a.url), ("b", 1, b.url))})
    gw = await start_gateway()
    routes_file.write({"m": route("m", ("a", 1, b.url), ("b", 1, b.url))})
    await gw.wait_weights("m", {"a": 1, "b": 1})
    seen = Counter([(await gw.infer("m"))[1] for _ in range(10)])
    assert seen == {"a": 5, "b": 5}
    assert (a.received, b.received) == (0, 10)  # "a" moved to b's endpoint too
    assert gw.sample("modelroll_gateway_weight", model="m", version="a") == 1

    routes_file.write({"m": route("m", ("b", 1, b.url))})  # version "a" removed
    await gw.wait_weights("m", {"b": 1})
    status, version, _ = await gw.infer("m", version="a")
    assert (status, version) == (404, "")
    assert (
        gw.registry.get_sample_value("modelroll_gateway_weight", {"model": "m", "version": "a"})
        is None
    )

    routes_file.write({})  # the model's key removed
    await gw.wait_weights("m", {})
    assert (await gw.infer("m"))[0] == 404


async def test_an_invalid_document_keeps_the_last_good_routes(
    start_gateway: StartGateway, start_standin: StartStandIn, routes_file: RoutesFile
) -> None:
    a = await start_standin("a")
    good = route("m", ("a", 1, a.url))
    routes_file.write({"m": good, "other": route("other", ("a", 1, a.url))})
    gw = await start_gateway()

    bad = route("m", ("a", 5000, a.url))
    routes_file.write({"m": bad, "other": route("other", ("a", 2, a.url))})
    doc = await gw.wait_for(lambda d: "invalid" in d["models"][0])
    assert "outside 0..1000" in doc["models"][0]["invalid"]
    assert await gw.weights("m") == {"a": 1}  # still the last good route
    assert await gw.weights("other") == {"a": 2}  # other models still follow the file
    assert (await gw.infer("m"))[:2] == (200, "a")
    assert gw.sample("modelroll_gateway_routes_invalid_total") == 1

    routes_file.write_text("{ this is not JSON")
    doc = await gw.wait_for(lambda d: "invalid" in d)
    assert "not JSON" in doc["invalid"]
    assert (await gw.infer("m"))[:2] == (200, "a")
    assert gw.sample("modelroll_gateway_routes_invalid_total") == 2

    routes_file.write({"m": route("m", ("a", 7, a.url))})
    await gw.wait_weights("m", {"a": 7})
    doc = await gw.routes()
    assert "invalid" not in doc
    assert all("invalid" not in m for m in doc["models"])


async def test_a_new_model_whose_document_is_invalid_answers_503_with_the_reason(
    start_gateway: StartGateway, routes_file: RoutesFile
) -> None:
    routes_file.write({"m": {"model": "m", "versions": "none"}})
    gw = await start_gateway()
    status, version, body = await gw.infer("m")
    assert (status, version) == (503, "")
    assert body == {"error": "model 'm' has no valid routes: model 'm': 'versions' must be a list"}


async def test_configmap_values_as_json_text_and_a_configmap_object_are_read(
    start_gateway: StartGateway, start_standin: StartStandIn, routes_file: RoutesFile
) -> None:
    a = await start_standin("a")
    text = dump_model_route(ModelRoute("m", (VersionRoute("a", 3, a.url),)))
    routes_file.write({"m": text})
    gw = await start_gateway()
    assert await gw.weights("m") == {"a": 3}
    configmap = {"apiVersion": "v1", "kind": "ConfigMap", "data": {"m": text.replace("3", "4")}}
    routes_file.write_text(json.dumps(configmap))
    await gw.wait_weights("m", {"a": 4})


async def test_a_mounted_configmap_directory_is_followed(
    start_gateway: StartGateway, start_standin: StartStandIn, tmp_path: Path
) -> None:
    """Laid out as the kubelet does: key links into ..data, which is swapped atomically."""
    a = await start_standin("a")
    mount = tmp_path / "routes"
    mount.mkdir()

    def publish(generation: int, weight: int) -> None:
        data_dir = mount / f"..gen{generation}"
        data_dir.mkdir()
        (data_dir / "m").write_text(json.dumps(route("m", ("a", weight, a.url))))
        (mount / "..data_tmp").symlink_to(data_dir.name)
        os.replace(mount / "..data_tmp", mount / "..data")
        if not (mount / "m").is_symlink():
            (mount / "m").symlink_to("..data/m")

    publish(1, 2)
    gw = await start_gateway(routes_file=mount)
    assert await gw.weights("m") == {"a": 2}
    publish(2, 5)
    await gw.wait_weights("m", {"a": 5})


async def test_a_missing_file_means_no_routes_until_it_appears(
    start_gateway: StartGateway, start_standin: StartStandIn, routes_file: RoutesFile
) -> None:
    a = await start_standin("a")
    gw = await start_gateway()
    async with gw.session.get(gw.url("/readyz")) as resp:
        assert resp.status == 200  # read: there are no routes
    assert (await gw.infer("m"))[0] == 404
    routes_file.write({"m": route("m", ("a", 1, a.url))})
    await gw.wait_weights("m", {"a": 1})
    assert (await gw.infer("m"))[:2] == (200, "a")

    routes_file.path.unlink()  # e.g. an editor that deletes before it writes
    doc = await gw.wait_for(lambda d: "invalid" in d)
    assert "is gone" in doc["invalid"]
    assert (await gw.infer("m"))[:2] == (200, "a")
