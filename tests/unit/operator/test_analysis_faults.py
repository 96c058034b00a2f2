"""The analysis task lives as long as its analysis: a Prometheus answer that is not what
Prometheus answers, an API server that refuses connections, or a fault of the operator's own
holds the step (saying why in the status when the status can be written) and is tried again;
it never ends the task."""

from __future__ import annotations

from typing import Any, cast

import pytest
from aiohttp.pytest_plugin import AiohttpServer
from kubernetes import client as k8s

from modelroll_operator.analysis.counts import Snapshot
from modelroll_operator.analysis.daemon import FAULT_RETRY_S, RETRY_S, Canaries
from modelroll_operator.analysis.phases import Phase, Reason
from modelroll_operator.analysis.reader import MetricsReader
from modelroll_operator.api import Api, mv_path
from modelroll_operator.snapshots import ModelKey, VersionInfo
from tests.support.fake_api import FakeApi
from tests.support.metrics_sites import LOOPBACK, Site, closing
from tests.support.processes import free_port
from tests.support.specs import mv_body

CANARY, BASELINE = "canary-v2", "stable-v1"
DEEP = "[" * 100_000 + "]" * 100_000
"""A JSON document nested 100 000 levels deep: more than Python's decoder recurses."""


class Versions:
    """A canary with an analysis on Prometheus at ``url``, and its baseline, in a fake API
    server; ``versions`` is the index the operator keeps."""

    def __init__(self, url: str, api: FakeApi | None = None) -> None:
        self.api = api or FakeApi()
        ready = {"conditions": [{"type": "Ready", "status": "True"}]}
        analysis = {
            "steps": [{"weight": 10}],
            "intervalSeconds": 1,
            "metrics": {"prometheus": {"url": url}},
        }
        specs: dict[str, dict[str, Any]] = {
            BASELINE: {"weight": 100},
            CANARY: {"weight": 0, "analysis": analysis},
        }
        for name, spec in specs.items():
            body = mv_body(name, model="chat", status=dict(ready), **spec)
            self.api.objects[mv_path("prod", name)] = body

    def versions(self, key: ModelKey) -> list[VersionInfo]:
        found = (VersionInfo.from_body(b) for b in self.api.objects.values())
        return [v for v in found if v is not None and v.model_key == key]

    def analysis(self) -> dict[str, Any]:
        found: dict[str, Any] = self.api.objects[mv_path("prod", CANARY)]["status"]["analysis"]
        return found


class Ticks:
    """The daemon's sleep: records each delay, and asks the task to stop after ``count``."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.delays: list[float] = []

    async def __call__(self, seconds: float) -> bool:
        self.delays.append(seconds)
        return len(self.delays) >= self.count


async def test_an_answer_nested_too_deep_holds_the_step_and_the_task_goes_on(
    aiohttp_server: AiohttpServer,
) -> None:
    """Python's JSON decoder gives up on it with a RecursionError, which is no ValueError."""
    cluster = Versions(await Site({"/api/v1/query": DEEP}).start(aiohttp_server))
    async with closing(MetricsReader(cast(Api, cluster.api), access=LOOPBACK)) as reader:
        canaries = Canaries(cast(Api, cluster.api), cluster.versions, reader)
        await canaries.run("prod", CANARY, Ticks(3))
    held = cluster.analysis()
    assert (held["phase"], held["reason"]) == (Phase.HOLDING, Reason.METRICS_UNAVAILABLE)
    assert "nested too deep" in held["message"]
    assert [reason for name, reason, _ in cluster.api.events if name == CANARY][-1] == (
        Reason.METRICS_UNAVAILABLE
    )


def unreachable_api() -> Api:
    """The real client, pointed at a loopback port where nothing listens."""
    configuration = k8s.Configuration()
    configuration.host = f"http://127.0.0.1:{free_port()}"
    return Api(k8s.ApiClient(configuration))


async def test_an_api_server_that_refuses_connections_is_tried_again_until_it_answers(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The client gives up with urllib3's MaxRetryError, which is no OSError: each tick is
    tried again after RETRY_S, and the log says why."""
    api = unreachable_api()
    ticks = Ticks(3)
    try:
        async with closing(MetricsReader(api)) as reader:
            await Canaries(api, lambda key: [], reader).run("prod", CANARY, ticks)
    finally:
        api.client.close()  # type: ignore[no-untyped-call]
    assert ticks.delays == [RETRY_S] * 3
    warnings = [r for r in caplog.records if r.name == "modelroll_operator"]
    assert len(warnings) == 3
    assert all(f"Analysis of prod/{CANARY}" in r.getMessage() for r in warnings)
    assert all("Connection refused" in r.getMessage() for r in warnings)


class BrokenReader(MetricsReader):
    """A reader with a fault of its own (a stand-in for a bug in the operator)."""

    async def read(self, *args: Any, **kwargs: Any) -> Snapshot:
        readings: dict[str, Snapshot] = {}
        return readings["no such key"]


async def test_a_fault_in_reading_the_metrics_holds_the_step_and_logs_its_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    cluster = Versions("http://prometheus.monitoring:9090")
    canaries = Canaries(cast(Api, cluster.api), cluster.versions, BrokenReader(cast(Api, None)))
    await canaries.run("prod", CANARY, Ticks(3))
    held = cluster.analysis()
    assert (held["phase"], held["reason"]) == (Phase.HOLDING, Reason.METRICS_UNAVAILABLE)
    assert "internal error" in held["message"]
    assert {r.exc_info[0] for r in caplog.records if r.exc_info} == {KeyError}


class FaultyApi(FakeApi):
    """A fake API server whose client fails once with a fault of the operator's own."""

    def __init__(self) -> None:
        super().__init__()
        self.faults = 1

    async def get(self, path: str) -> dict[str, Any] | None:
        if self.faults:
            self.faults -= 1
            raise AttributeError("'NoneType' object has no attribute 'get'")
        return await super().get(path)


async def test_a_fault_in_a_tick_is_logged_with_its_traceback_and_the_analysis_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    cluster = Versions("http://prometheus.monitoring:9090", FaultyApi())
    canaries = Canaries(cast(Api, cluster.api), cluster.versions, MetricsReader(cast(Api, None)))
    ticks = Ticks(2)
    await canaries.run("prod", CANARY, ticks)
    assert ticks.delays[0] == FAULT_RETRY_S
    assert cluster.analysis()["phase"] == Phase.PROGRESSING  # started on the next tick
    assert [r.exc_info[0] for r in caplog.records if r.exc_info] == [AttributeError]
