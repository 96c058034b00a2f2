"""Canary analyses end to end, each on the whole local stack under load: the operator, the
gateway, a stable and a canary version (demo model behind its own sidecar), and for one test
Prometheus. The operator reads the gateway's /metrics (or Prometheus) and moves the weights by
itself; the tests watch what a user would: conditions, weights, and the answers clients got.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from modelroll_devcluster.pytest_plugin import Figures
from modelroll_devcluster.stack import Stack, StackError, VersionSpec
from modelroll_devcluster.traffic import Traffic
from tests.support.processes import Spawn, free_port
from tests.support.stack import StartLocal, analysis_of, eventually, wait_condition_of
from tests.support.stack import canary_manifest as canary_manifest_of
from tests.support.story import FAST

pytestmark = pytest.mark.e2e

MODEL = "sentiment"
STABLE, CANARY = "stable-v1", "canary-v2"


StartStack = Callable[..., Stack]


@pytest.fixture
def start_stack(local_stacks: StartLocal) -> StartStack:
    """Start a local stack with a stable version at weight 100 and a canary at 0."""

    def start(
        canary: VersionSpec | None = None,
        prometheus: bool = False,
        stable: VersionSpec | None = None,
    ) -> Stack:
        versions = (stable or VersionSpec(STABLE, 100), canary or VersionSpec(CANARY, 0))
        stack = local_stacks(versions, prometheus=prometheus)
        stack.kubectl("apply", "-f", "-", input=yaml.safe_dump(stack.manifest(STABLE)))
        eventually(lambda: weights(stack).get(STABLE) == 100, "stable-v1 routed", 30)
        return stack

    return start


def weights(stack: Stack) -> dict[str, int]:
    model = stack.routes().get(MODEL) or {"versions": []}
    return {v["name"]: v["weight"] for v in model["versions"]}


def canary_manifest(stack: Stack, analysis: dict[str, Any]) -> str:
    return canary_manifest_of(stack, CANARY, analysis)


def analysis(stack: Stack, name: str = CANARY) -> dict[str, Any]:
    return analysis_of(stack, name)


def condition(stack: Stack, kind: str) -> str:
    out = stack.kubectl(
        "get", "mv", CANARY, "-o", f"jsonpath={{.status.conditions[?(@.type=='{kind}')].status}}"
    ).stdout
    return out.strip()


def wait_condition(stack: Stack, kind: str, within: float) -> None:
    wait_condition_of(stack, CANARY, kind, within)


@pytest.mark.parametrize("failing", ["items", "batches"])
def test_a_canary_failing_a_fifth_of_its_items_is_rolled_back_without_failing_the_baseline(
    start_stack: StartStack, figures: Figures, failing: str
) -> None:
    """Default interval and warm-up; canary traffic about 10 req/s: rolled back within 15 s,
    whether the model fails a fifth of its items (422 each) or a fifth of its batches whole
    (502 for each of their requests, judged as one failed model call each)."""
    if failing == "items":
        canary = VersionSpec(CANARY, 0, error_rate=0.2)
    else:
        canary = VersionSpec(CANARY, 0, batch_error_rate=0.2)
    stack = start_stack(canary)
    with Traffic(stack.gateway_url, MODEL, window=10, rounds_per_second=10.0) as traffic:
        stack.kubectl("apply", "-f", "-", input=canary_manifest(stack, {"steps": [{"weight": 10}]}))
        wait_condition(stack, "RolledBack", 60)
        first = eventually(
            lambda: next((r for r in traffic.responses if r.version == CANARY), None),
            "a canary answer",
            5,
        )
        eventually(lambda: weights(stack).get(CANARY) == 0, "the canary at weight 0", 5)
        rolled_back = time.monotonic()
        time.sleep(1.0)
    state = analysis(stack)
    assert state["phase"] == "RolledBack"
    assert state["reason"] == "CanaryWorse"
    errors = next(c for c in state["checks"] if c["name"] == "errors")
    assert errors["verdict"] == "Fail"
    assert weights(stack) == {STABLE: 100, CANARY: 0}
    stable = [r for r in traffic.responses if r.version == STABLE]
    assert stable
    assert all(r.status == 200 for r in stable), "the baseline failed requests"
    after = [r for r in traffic.responses if r.version == CANARY and r.sent > rolled_back]
    assert not after, "the canary still got traffic after the rollback"
    took = rolled_back - first.sent
    figures.add(
        f"analysis: 20% of {failing} failing, first canary request to rollback in force",
        f"{took:.1f} s",
    )
    assert took <= 15.0 + 1.0  # the target, plus the time to see the weight at the gateway
    events = stack.kubectl("get", "events", "--field-selector", f"involvedObject.name={CANARY}")
    assert "errors: canary" in events.stdout


def test_a_healthy_canary_is_promoted_through_every_step(start_stack: StartStack) -> None:
    stack = start_stack()
    # Up to 50%: each version runs one sidecar here, so a canary at 60% would carry 1.5 times
    # the baseline's load per process and be measurably slower (docs/analysis.md).
    steps = [{"weight": 10}, {"weight": 30}, {"weight": 50}]
    seen: list[int] = []
    with Traffic(stack.gateway_url, MODEL, window=10, rounds_per_second=20.0) as traffic:
        stack.kubectl("apply", "-f", "-", input=canary_manifest(stack, {**FAST, "steps": steps}))
        deadline = time.monotonic() + 90
        while condition(stack, "Promoted") != "True":
            assert time.monotonic() < deadline, f"not promoted: {analysis(stack)}"
            weight = weights(stack).get(CANARY)
            if weight is not None and (not seen or seen[-1] != weight):
                seen.append(weight)
            time.sleep(0.2)
    # Every step, in order, none skipped (the promotion's 100 may show before its condition).
    assert [w for w in seen if 0 < w < 100] == [10, 30, 50]
    # the baseline stays, warm, at 0
    eventually(lambda: weights(stack) == {STABLE: 0, CANARY: 100}, "the promotion's routes", 5)
    assert all(r.status == 200 for r in traffic.responses)
    assert condition(stack, "RolledBack") == "False"


def test_a_canary_with_a_few_requests_a_minute_holds_and_is_not_rolled_back(
    start_stack: StartStack,
) -> None:
    stack = start_stack()
    spec = {**FAST, "steps": [{"weight": 1}], "maxSeconds": 8, "minRequests": 50}
    with Traffic(stack.gateway_url, MODEL, window=1, rounds_per_second=2.0):
        stack.kubectl("apply", "-f", "-", input=canary_manifest(stack, spec))
        eventually(lambda: analysis(stack).get("phase") == "Holding", "Holding", 40)
        time.sleep(4.0)
    state = analysis(stack)
    assert state["phase"] == "Holding"
    assert state["reason"] == "InsufficientData"
    assert weights(stack) == {STABLE: 99, CANARY: 1}
    assert condition(stack, "RolledBack") == "False"
    assert condition(stack, "AnalysisHealthy") == "Unknown"


def test_eighty_pinned_requests_the_canary_fails_change_no_verdict(
    start_stack: StartStack,
) -> None:
    """A trusted client may pin a version. 80 pinned requests that a healthy canary fails (inputs
    longer than its model's maximum length; both versions have the same limit) while it is
    analysed: it is promoted all the same, and its evidence holds none of them."""
    limit = ("--max-length=24",)  # Traffic's inputs are 1 to 24 words
    stack = start_stack(
        VersionSpec(CANARY, 0, engine_args=limit),
        stable=VersionSpec(STABLE, 100, engine_args=limit),
    )
    # Errors only: the pinned requests load the canary alone, so its latency may rightly differ.
    spec = {**FAST, "steps": [{"weight": 50}], "minSeconds": 15, "checks": {"errors": {}}}
    long = json.dumps({"payload": " ".join(["token"] * 100)}).encode()
    with Traffic(stack.gateway_url, MODEL, window=4, rounds_per_second=10.0):
        stack.kubectl("apply", "-f", "-", input=canary_manifest(stack, spec))
        eventually(lambda: analysis(stack).get("phase") == "Progressing", "Progressing", 30)
        pinned = pinned_answers(stack, long, CANARY, 80)
        judged = analysis(stack)  # the step takes 15 s: still being judged
        wait_condition(stack, "Promoted", 60)
    assert pinned == [422] * 80
    errors = next(c for c in judged["checks"] if c["name"] == "errors")
    assert errors["canary"]["requests"] > 0, judged
    assert errors["canary"]["bad"] == 0, errors


def test_a_named_baseline_that_never_becomes_ready_holds_the_canary(
    start_stack: StartStack,
) -> None:
    """The canary names its baseline, a managed version whose pod never runs (this stack has no
    node): no comparison, so no verdict, however long the canary serves."""
    stack = start_stack()
    ghost = {
        "apiVersion": "modelroll.io/v1alpha1",
        "kind": "ModelVersion",
        "metadata": {"name": "stable-v0"},
        "spec": {
            "model": MODEL,
            "weight": 0,
            "replicas": 1,
            "server": {"image": "modelroll-demo:dev", "command": ["modelroll-demo-model"]},
        },
    }
    stack.kubectl("apply", "-f", "-", input=yaml.safe_dump(ghost))
    spec = {**FAST, "steps": [{"weight": 50}], "baseline": "stable-v0"}
    with Traffic(stack.gateway_url, MODEL, window=4, rounds_per_second=10.0):
        stack.kubectl("apply", "-f", "-", input=canary_manifest(stack, spec))
        eventually(lambda: analysis(stack).get("reason") == "NoBaseline", "NoBaseline", 30)
        time.sleep(3 * FAST["minSeconds"])  # three times what a step needs to pass
    state = analysis(stack)
    assert state["phase"] == "Pending", state
    assert "the baseline stable-v0 is not Ready" in state["message"]
    assert weights(stack) == {STABLE: 100, CANARY: 0}
    assert condition(stack, "Promoted") != "True"


def pinned_answers(stack: Stack, body: bytes, version: str, count: int) -> list[int]:
    """POST ``body`` pinned to ``version`` ``count`` times, 20 a second; their statuses."""

    async def run() -> list[int]:
        url = f"{stack.gateway_url}/v1/models/{MODEL}/infer"
        headers = {"Content-Type": "application/json", "X-Modelroll-Version": version}
        statuses = []
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
            for _ in range(count):
                async with session.post(url, data=body, headers=headers) as response:
                    await response.read()
                    statuses.append(response.status)
                await asyncio.sleep(0.05)
        return statuses

    return asyncio.run(run())


def test_an_unreadable_metrics_source_holds_then_the_analysis_resumes(
    start_stack: StartStack,
) -> None:
    stack = start_stack(prometheus=True)
    prometheus = stack.prometheus
    assert prometheus is not None
    spec = {**FAST, "steps": [{"weight": 20}], "minSeconds": 6}
    with Traffic(stack.gateway_url, MODEL, window=10, rounds_per_second=20.0):
        manifest = yaml.safe_load(canary_manifest(stack, spec))
        manifest["spec"]["analysis"]["metrics"] = {"prometheus": {"url": prometheus.url}}
        # Prometheus is down before the analysis starts, so the hold is the state the
        # analysis settles in, not a moment in a step that may already have passed.
        prometheus.stop()
        stack.kubectl("apply", "-f", "-", input=yaml.safe_dump(manifest))
        held = eventually(
            lambda: (a := analysis(stack)).get("reason") == "MetricsUnavailable" and a,
            "Holding on MetricsUnavailable",
            20,
        )
        assert held["phase"] == "Holding"
        time.sleep(3.0)
        assert analysis(stack)["phase"] == "Holding"
        assert weights(stack) == {STABLE: 80, CANARY: 20}
        prometheus.start()
        wait_condition(stack, "Promoted", 60)
    eventually(lambda: weights(stack) == {STABLE: 0, CANARY: 100}, "the promotion's routes", 5)


def test_a_gateway_that_has_not_applied_a_step_holds_it_until_it_does(
    start_stack: StartStack, spawn: Spawn, tmp_path: Path
) -> None:
    """The analysis reads a gateway that follows a routes file the test writes, as a replica
    whose ConfigMap watch has stalled would: while it still routes by the weights from before
    the step, the analysis holds and names it; once it routes by 20/80, the analysis goes on."""
    stack = start_stack()
    routes = tmp_path / "routes.json"

    def route(**weights: int) -> None:
        versions = [
            {"name": name, "weight": weight, "endpoint": "http://127.0.0.1:9"}
            for name, weight in weights.items()
        ]
        routes.write_text(json.dumps({MODEL: {"model": MODEL, "versions": versions}}))

    route(**{STABLE: 100})
    port, admin_port = free_port(), free_port()
    base = f"http://127.0.0.1:{admin_port}"
    spawn(
        "modelroll-gateway",
        f"--routes-file={routes}",
        "--host=127.0.0.1",
        f"--port={port}",
        f"--admin-port={admin_port}",
        ready=f"http://127.0.0.1:{port}/readyz",
    )
    manifest = yaml.safe_load(canary_manifest(stack, {**FAST, "steps": [{"weight": 20}]}))
    manifest["spec"]["analysis"]["metrics"] = {"gateway": {"url": f"{base}/metrics"}}
    stack.kubectl("apply", "-f", "-", input=yaml.safe_dump(manifest))
    held = eventually(
        lambda: (a := analysis(stack)).get("reason") == "WeightsNotApplied" and a,
        "Holding on WeightsNotApplied",
        30,
    )
    assert held["phase"] == "Holding"
    assert "not in force yet" in held["message"]
    assert f"{base}/metrics routes by none/100" in held["message"], held["message"]
    assert weights(stack) == {STABLE: 80, CANARY: 20}  # the ConfigMap has the step

    route(**{STABLE: 80, CANARY: 20})  # the replica catches up
    resumed = eventually(
        lambda: (a := analysis(stack)).get("reason") != "WeightsNotApplied" and a,
        "the analysis going on",
        30,
    )
    assert resumed["phase"] == "Progressing", resumed


def test_an_operator_killed_mid_step_resumes_without_double_stepping(
    start_stack: StartStack,
) -> None:
    stack = start_stack()
    steps = [{"weight": 10}, {"weight": 30}, {"weight": 50}]
    minimum = 8
    spec = {**FAST, "steps": steps, "minSeconds": minimum}
    with Traffic(stack.gateway_url, MODEL, window=10, rounds_per_second=20.0):
        stack.kubectl("apply", "-f", "-", input=canary_manifest(stack, spec))
        at_two = eventually(
            lambda: (a := analysis(stack)).get("step") == 2 and a.get("applied") and a,
            "step 2",
            60,
        )
        stack.kill_operator()
        time.sleep(2.0)
        stack.start_operator()
        time.sleep(2.0)
        state = analysis(stack)
        if state["step"] == 2:
            assert state["stepStartedAt"] == at_two["stepStartedAt"]
            assert weights(stack) == {STABLE: 70, CANARY: 30}
        else:
            # Step 2 may have passed by now, when the wait above saw it late: then it
            # passed no sooner than its own warm-up and minimum from when it started.
            earliest = at_two["stepStartedAt"] + FAST["warmupSeconds"] + minimum
            assert state["stepStartedAt"] >= earliest, "the restarted operator moved on at once"
        wait_condition(stack, "Promoted", 90)
    events = stack.kubectl(
        "get", "events", "--field-selector", f"involvedObject.name={CANARY},reason=AnalysisStep"
    ).stdout
    assert events.count("Step 3 of 3") == 1, events


def test_a_canary_twice_as_slow_is_rolled_back_on_the_latency_check(
    start_stack: StartStack,
) -> None:
    """The model's own time doubles (20 ms a batch, then 40): requests take about 1.6 times as
    long through the gateway, where batching and queueing add their part."""
    stack = start_stack(
        VersionSpec(CANARY, 0, fixed_ms=40.0), stable=VersionSpec(STABLE, 100, fixed_ms=20.0)
    )
    with Traffic(stack.gateway_url, MODEL, window=10, rounds_per_second=20.0) as traffic:
        stack.kubectl(
            "apply", "-f", "-", input=canary_manifest(stack, {**FAST, "steps": [{"weight": 30}]})
        )
        wait_condition(stack, "RolledBack", 60)
    state = analysis(stack)
    checks = {c["name"]: c for c in state["checks"]}
    assert checks["latency"]["verdict"] == "Fail"
    assert checks["errors"]["verdict"] != "Fail"
    assert all(r.status == 200 for r in traffic.responses)


def test_a_pause_step_is_resumed_with_the_plugin_and_a_hand_made_weight_pauses(
    start_stack: StartStack,
) -> None:
    stack = start_stack()
    steps = [{"weight": 10, "pause": True}, {"weight": 40}]
    with Traffic(stack.gateway_url, MODEL, window=10, rounds_per_second=20.0):
        stack.kubectl("apply", "-f", "-", input=canary_manifest(stack, {**FAST, "steps": steps}))
        eventually(lambda: analysis(stack).get("reason") == "PausedAtStep", "the pause", 60)
        # The reconciler derives the conditions from status.analysis: a moment later.
        eventually(lambda: condition(stack, "Progressing") == "False", "Progressing False", 10)
        shown = stack.plugin("analysis", "status", CANARY).stdout
        assert "Paused" in shown
        assert "errors" in shown
        stack.plugin("analysis", "resume", CANARY)
        eventually(lambda: weights(stack).get(CANARY) == 40, "step 2's weights", 10)
        stack.kubectl("patch", "mv", CANARY, "--type=merge", "-p", '{"spec":{"weight":5}}')
        paused = eventually(
            lambda: (a := analysis(stack)).get("reason") == "ManualWeightChange" and a,
            "a pause for the weight set by hand",
            10,
        )
        assert "weight is 5" in paused["message"]
        time.sleep(2.0)
        assert weights(stack).get(CANARY) == 5  # the analysis leaves the user's weight alone
        stack.plugin("analysis", "resume", CANARY)
        wait_condition(stack, "Promoted", 60)
    eventually(lambda: weights(stack) == {STABLE: 0, CANARY: 100}, "the promotion's routes", 5)


def test_skip_and_abort_through_the_plugin(start_stack: StartStack) -> None:
    stack = start_stack()
    spec = {**FAST, "steps": [{"weight": 10}, {"weight": 40}], "minSeconds": 600}
    with Traffic(stack.gateway_url, MODEL, window=10, rounds_per_second=20.0) as traffic:
        stack.kubectl("apply", "-f", "-", input=canary_manifest(stack, spec))
        eventually(lambda: weights(stack).get(CANARY) == 10, "step 1's weights", 30)
        skipped = stack.plugin("analysis", "skip", CANARY).stdout
        assert "step 2 of 2" in skipped
        eventually(lambda: weights(stack).get(CANARY) == 40, "step 2's weights", 10)
        stack.plugin("analysis", "abort", CANARY)
        wait_condition(stack, "RolledBack", 10)
        eventually(lambda: weights(stack) == {STABLE: 100, CANARY: 0}, "the rollback", 10)
    assert analysis(stack)["reason"] == "Aborted"
    assert all(r.status == 200 for r in traffic.responses)
    refused = stack.kubectl("get", "mv", CANARY)  # the plugin refuses a finished analysis
    assert "RolledBack" in refused.stdout
    with pytest.raises(StackError, match="is over"):
        stack.plugin("analysis", "abort", CANARY)
