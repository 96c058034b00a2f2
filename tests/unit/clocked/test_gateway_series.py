"""The gateway stops exporting a version's series once the version has been out of its
model's route for the grace period (--series-grace-seconds), on virtual time (conftest.py)."""

from __future__ import annotations

import asyncio
from typing import Any

from prometheus_client import CollectorRegistry

from modelroll_gateway.metrics import GatewayMetrics
from modelroll_gateway.table import RouteTable

GRACE = 600.0


def route(*versions: str) -> dict[str, Any]:
    listed = [{"name": v, "weight": 1, "endpoint": f"http://{v}:8000"} for v in versions]
    return {"model": "m", "versions": listed}


def exported(registry: CollectorRegistry) -> set[tuple[str, str]]:
    """The (model, version) of every series the gateway exports."""
    return {
        (sample.labels["model"], sample.labels["version"])
        for family in registry.collect()
        for sample in family.samples
        if "version" in sample.labels
    }


def table_with_traffic() -> tuple[RouteTable, CollectorRegistry]:
    """Model m with versions a and b, each of which answered a request and an unknown
    version's 404."""
    registry = CollectorRegistry()
    table = RouteTable(GatewayMetrics(registry), series_grace=GRACE)
    table.apply_data({"m": route("a", "b")})
    for version in ("a", "b"):
        table.models["m"].targets[version].stats.record(200, 0.01)
        table.models["m"].pinned[version].stats.record(503, 0.01)
        table.metrics.upstream_errors.labels("m", version, "timeout").inc()
    table.unrouted_counter("m", 404).inc()
    return table, registry


async def test_a_version_out_of_the_route_is_exported_until_the_grace_has_passed() -> None:
    table, registry = table_with_traffic()
    table.apply_data({"m": route("a")})

    await asyncio.sleep(GRACE - 1)
    assert ("m", "b") in exported(registry)
    await asyncio.sleep(1)
    assert exported(registry) == {("m", "a"), ("m", "")}
    listed = table.describe()["models"][0]["versions"]
    assert [(v["name"], v["requests"]) for v in listed] == [("a", 2)]


async def test_a_version_back_within_the_grace_keeps_its_series_and_counts() -> None:
    table, registry = table_with_traffic()
    table.apply_data({"m": route("a")})
    await asyncio.sleep(GRACE - 1)
    table.apply_data({"m": route("a", "b")})

    await asyncio.sleep(GRACE)
    assert ("m", "b") in exported(registry)
    listed = table.describe()["models"][0]["versions"]
    assert [(v["name"], v["requests"]) for v in listed] == [("a", 2), ("b", 2)]


async def test_a_removed_model_takes_its_series_with_it_after_the_grace() -> None:
    table, registry = table_with_traffic()
    table.apply_data({})

    await asyncio.sleep(GRACE - 1)
    assert exported(registry) == {("m", "a"), ("m", "b"), ("m", "")}
    await asyncio.sleep(1)
    assert exported(registry) == set()
