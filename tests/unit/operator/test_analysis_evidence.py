"""What a canary analysis takes as evidence: what clients saw of streams, weighted requests
only, time it can trust, and one canary of a model at a time.

The counters are the gateway's own (GatewayMetrics), exported as /metrics text and read as the
operator reads them (canary_metrics.add_exposition), so the labels are the ones a gateway sets.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

from prometheus_client import CollectorRegistry, generate_latest

from modelroll_gateway.metrics import GatewayMetrics
from modelroll_operator.analysis import machine
from modelroll_operator.analysis.counts import Snapshot, VersionCounts
from modelroll_operator.analysis.daemon import Canaries
from modelroll_operator.analysis.phases import Phase, Reason
from modelroll_operator.analysis.reader import MetricsReader, _Sums, add_exposition
from modelroll_operator.analysis.spec import STREAM_ERROR, parse_analysis
from modelroll_operator.analysis.state import AnalysisState
from modelroll_operator.api import Api, mv_path
from modelroll_operator.snapshots import ModelKey, VersionInfo
from tests.support.fake_api import FakeApi
from tests.support.specs import mv_body

MODEL = "chat"
CANARY, BASELINE = "canary-v2", "stable-v1"
FAST = {"intervalSeconds": 1, "warmupSeconds": 0, "minSeconds": 4, "minRequests": 20}


class Gateway:
    """One gateway replica's counters, moved as the gateway moves them."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.metrics = GatewayMetrics(self.registry)

    def answer(
        self,
        version: str,
        n: int,
        *,
        code: str = "200",
        outcome: str | None = None,
        routing: str = "weight",
    ) -> None:
        """``n`` requests answered with ``code`` (streams, when ``outcome`` says how they
        ended), each in 50 ms."""
        self.metrics.requests.labels(MODEL, version, routing, code).inc(n)
        for _ in range(n):
            self.metrics.duration.labels(MODEL, version, routing).observe(0.05)
        if outcome is not None:
            self.metrics.llm_requests.labels(MODEL, version, outcome).inc(n)

    def snapshot(self, at: float) -> Snapshot:
        sums = _Sums()
        add_exposition(sums, generate_latest(self.registry).decode(), MODEL, (CANARY, BASELINE))
        return Snapshot(at, {"pod/gateway-0": sums.tally(at, CANARY, BASELINE)})


def run(
    analysis: Mapping[str, Any], gateway: Gateway, traffic: Any, ticks: int = 40
) -> AnalysisState:
    """Evaluate once a second, ``traffic(gateway, tick)`` between two, the state saved to and
    read from a status each time (as an operator does), until the analysis is over."""
    spec = parse_analysis(analysis)
    assert spec is not None
    state = machine.start(spec, BASELINE, 100, 0.0, "h").state
    for tick in range(1, ticks + 1):
        traffic(gateway, tick)
        decision = machine.evaluate(spec, state, gateway.snapshot(float(tick)), float(tick))
        restored = AnalysisState.from_dict(decision.state.to_dict())
        assert restored is not None
        state = restored
        if state.finished:
            break
    return state


def test_a_canary_that_breaks_every_stream_is_rolled_back_though_each_said_200() -> None:
    def traffic(gw: Gateway, tick: int) -> None:
        broken = min(6, 58 - 6 * (tick - 1))
        if broken > 0:
            gw.answer(CANARY, broken, outcome="upstream_error")
        gw.answer(BASELINE, 6, outcome="completed")

    state = run({"steps": [{"weight": 50}], **FAST}, Gateway(), traffic)

    assert state.phase == Phase.ROLLED_BACK, state.message
    assert state.reason == Reason.CANARY_WORSE
    errors = state.checks["errors"].evidence
    assert errors.canary.bad == errors.canary.requests > 0  # each stream once, as an error
    assert errors.baseline.bad == 0


def test_streams_the_gateway_answered_with_a_5xx_or_the_client_left_are_not_counted_again() -> None:
    interval = VersionCounts(
        codes={"200": 10.0, "502": 4.0, "504": 1.0},
        outcomes={
            "completed": 4.0,
            "client_disconnect": 2.0,
            "client_stalled": 1.0,
            "unreachable": 3.0,  # the 502s
            "timeout": 1.0,  # the 504
            "upstream_error": 4.0,  # one of them a 502, three broke off after a 200
        },
    )

    judged = interval.judged()

    assert judged.codes == {"200": 7.0, "502": 4.0, "504": 1.0, STREAM_ERROR: 3.0}
    assert judged.requests == interval.requests


def test_eighty_pinned_failing_requests_to_the_canary_do_not_move_the_verdict() -> None:
    def healthy(gw: Gateway, tick: int) -> None:
        gw.answer(CANARY, 10, outcome="completed")
        gw.answer(BASELINE, 10, outcome="completed")

    def attacked(gw: Gateway, tick: int) -> None:
        healthy(gw, tick)
        if tick <= 8:  # 80 pinned requests, all failed: half 500s, half broken streams
            gw.answer(CANARY, 5, code="500", routing="pin")
            gw.answer(CANARY, 5, outcome="upstream_error", routing="pin")

    analysis = {"steps": [{"weight": 50}], **FAST}
    left_alone = run(analysis, Gateway(), healthy)
    pinned_at = run(analysis, Gateway(), attacked)

    assert left_alone.phase == pinned_at.phase == Phase.PROMOTED
    assert pinned_at.message == left_alone.message


def test_a_wall_clock_jump_does_not_end_a_step_before_its_time() -> None:
    spec = parse_analysis(
        {
            "steps": [{"weight": 50}],
            **FAST,
            "minRequests": 100,
            "maxSeconds": 60,
            "onInconclusive": "Promote",
        }
    )
    assert spec is not None
    gw = Gateway()
    state = machine.start(spec, BASELINE, 100, 0.0, "h").state
    for now in (1.0, 2.0, 3.0, 4.0, 3604.0):  # then an NTP step of an hour
        gw.answer(CANARY, 2)
        gw.answer(BASELINE, 2)
        decision = machine.evaluate(spec, state, gw.snapshot(now), now)
        restored = AnalysisState.from_dict(decision.state.to_dict())
        assert restored is not None
        state = restored

    # 4 s, and at most two intervals for the jump
    assert (state.phase, state.step_seconds) == (Phase.PROGRESSING, 6.0), state.message

    now = 3604.0
    while state.phase != Phase.PROMOTED and now < 3700:  # maxSeconds still comes, in real time
        now += 1
        state = machine.evaluate(spec, state, gw.snapshot(now), now).state
    assert state.phase == Phase.PROMOTED
    assert now == 3604.0 + 54  # 60 s counted in all


def test_a_status_from_before_counted_time_starts_the_step_clock_again() -> None:
    spec = parse_analysis({"steps": [{"weight": 50}], **FAST})
    assert spec is not None
    raw = machine.start(spec, BASELINE, 100, 0.0, "h").state.to_dict()
    for key in ("stepSeconds", "judgingFromSeconds", "evaluatedAt"):
        del raw[key]
    raw["sources"] = [{"name": "pod/gateway-0", "at": 0.0, "canary": {}, "baseline": {}}]

    state = AnalysisState.from_dict(raw)

    assert state is not None
    assert (state.step_seconds, state.evaluated_at, dict(state.sources)) == (0.0, 0.0, {})


# -- one canary of a model at a time ---------------------------------------------------------


def ready(status: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"conditions": [{"type": "Ready", "status": "True"}], **(status or {})}


class Cluster:
    """Three versions of a model in a fake API server, and the index the operator keeps."""

    def __init__(self) -> None:
        self.api = FakeApi()
        analysis = {"steps": [{"weight": 10}], **FAST}
        for name, spec in (
            (BASELINE, {"weight": 100}),
            ("canary-a", {"weight": 0, "analysis": analysis}),
            ("canary-b", {"weight": 0, "analysis": analysis}),
        ):
            body = mv_body(name, model=MODEL, status=ready(), **spec)
            self.api.objects[mv_path("prod", name)] = body
        self.canaries = Canaries(cast(Api, self.api), self.index, MetricsReader(cast(Api, None)))

    def index(self, key: ModelKey) -> list[VersionInfo]:
        found = (VersionInfo.from_body(b) for b in self.api.objects.values())
        return [v for v in found if v is not None and v.model_key == key]

    def analysis(self, name: str) -> dict[str, Any]:
        found: dict[str, Any] = self.api.objects[mv_path("prod", name)]["status"]["analysis"]
        return found

    def weight(self, name: str) -> int:
        found: int = self.api.objects[mv_path("prod", name)]["spec"]["weight"]
        return found


async def test_a_second_canary_of_a_model_waits_until_the_first_is_over() -> None:
    cluster = Cluster()

    await cluster.canaries.tick("prod", "canary-a")
    await cluster.canaries.tick("prod", "canary-b")

    assert cluster.analysis("canary-a")["phase"] == Phase.PROGRESSING
    waiting = cluster.analysis("canary-b")
    assert (waiting["phase"], waiting["reason"]) == (Phase.PENDING, Reason.OTHER_CANARY)
    assert "canary-a" in waiting["message"]
    assert (cluster.weight("canary-a"), cluster.weight("canary-b")) == (10, 0)
    events = [(name, reason) for name, reason, _ in cluster.api.events]
    assert ("canary-b", Reason.OTHER_CANARY) in events

    # The first one's analysis ends (aborted by hand): the second starts on its next look.
    path = mv_path("prod", "canary-a")
    cluster.api.objects[path]["metadata"]["annotations"] = {
        "modelroll.io/analysis-command": "abort:1"
    }
    await cluster.canaries.tick("prod", "canary-a")
    assert cluster.analysis("canary-a")["phase"] == Phase.ROLLED_BACK
    await cluster.canaries.tick("prod", "canary-b")
    assert cluster.analysis("canary-b")["phase"] == Phase.PROGRESSING
    assert cluster.weight("canary-b") == 10


async def test_a_canary_is_held_up_by_another_only_while_that_one_is_still_a_canary() -> None:
    cluster = Cluster()
    # Under way as its status says, from an operator before this one, but no longer a canary.
    path = mv_path("prod", "canary-a")
    cluster.api.objects[path]["status"]["analysis"] = {"phase": Phase.PROGRESSING}
    del cluster.api.objects[path]["spec"]["analysis"]

    await cluster.canaries.tick("prod", "canary-b")

    assert cluster.analysis("canary-b")["phase"] == Phase.PROGRESSING
