"""The rollout story with managed versions running as pods, through the gateway's Service.

stable-v1 (two replicas, weight 9) and canary-v2 (one replica, weight 1, its demo model failing
20% of items) are the managed examples: the demo model as the model container and the batching
sidecar injected by the operator. Under continuous load through the gateway pod, every disruption
a platform team causes in its first week: a split and a rollback by ``kubectl patch``, a batching
change that rolls the Deployment, ``kubectl delete pod``, ``kubectl scale mv`` up and down, and
the operator's pod deleted. Nothing but the canary's injected item errors may fail.

The same code runs on the local node (``make test-node``) and on kind (``make e2e-kind``).
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

from modelroll_devcluster.pytest_plugin import Figures
from modelroll_devcluster.traffic import Response, Traffic
from tests.support.incluster import STORY, InCluster, managed_manifest
from tests.support.pods import condition
from tests.support.stack import eventually
from tests.support.story import (
    CANARY,
    MODEL,
    STABLE,
    WINDOW,
    assert_nothing_failed,
    describe,
    failed,
    gateway_weights,
    last_answer,
    ms,
    only_to,
    windows_after,
)

pytestmark = pytest.mark.node

#: Rounds of WINDOW requests per second: lighter than on loopback, since the same two cores run
#: the node, the control plane and every pod.
ROUNDS_PER_SECOND = 10.0
STABLE_REPLICAS = 2
#: How long each step watches the traffic after its change has settled.
OBSERVE_S = 3.0


def routed(story: InCluster, names: tuple[str, ...]) -> bool:
    """Whether every named version is Ready and Routed, as its status says."""
    for name in names:
        mv = story.cluster.kubectl_json("get", "mv", name, namespace=story.namespace)
        if condition(mv, "Ready").get("status") != "True":
            return False
        if condition(mv, "Routed").get("status") != "True":
            return False
    return True


def pods_of(story: InCluster, version: str) -> list[dict[str, Any]]:
    pods = story.cluster.kubectl_json(
        "get", "pods", "-l", f"modelroll.io/version={version}", namespace=story.namespace
    )
    items: list[dict[str, Any]] = pods["items"]
    return items


def ready_pods(story: InCluster, version: str) -> list[str]:
    """Names of the version's pods that are Ready and not terminating."""
    names = []
    for pod in pods_of(story, version):
        conditions = pod.get("status", {}).get("conditions", [])
        ready = any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)
        if ready and not pod["metadata"].get("deletionTimestamp"):
            names.append(pod["metadata"]["name"])
    return sorted(names)


def ready_replicas(story: InCluster, version: str) -> int:
    mv = story.cluster.kubectl_json("get", "mv", version, namespace=story.namespace)
    return int(mv.get("status", {}).get("readyReplicas") or 0)


def manifests() -> str:
    """The story's versions, stable-v1 with two replicas so that one pod can go."""
    docs = []
    for name in STORY:
        doc = managed_manifest(name)
        if name == STABLE:
            doc["spec"]["replicas"] = STABLE_REPLICAS
        docs.append(json.dumps(doc))
    return "\n---\n".join(docs)


class Steps:
    """Runs each disruption under the load and records what it cost."""

    def __init__(self, story: InCluster, traffic: Traffic, figures: Figures) -> None:
        self.story = story
        self.traffic = traffic
        self.figures = figures

    def observe(self, after: float) -> None:
        self.traffic.wait_for(WINDOW, after=after + OBSERVE_S, timeout=OBSERVE_S + 60)

    def disruption(self, name: str, act: Callable[[], str]) -> list[Response]:
        """Run ``act`` (which waits until its change has settled and says what happened), watch
        the traffic a little longer, and report the requests it failed."""
        started = time.monotonic()
        what = act()
        self.observe(time.monotonic())
        during = self.traffic.since(started)
        lost = failed(during)
        self.figures.add(
            name,
            f"{what}; {len(lost)} of {len(during)} requests failed meanwhile"
            + (f" ({describe(lost)})" if lost else ""),
        )
        return lost


@pytest.mark.timeout(900)
def test_rollout_story_with_pods(story: InCluster, figures: Figures) -> None:
    ns = story.namespace
    if story.install_seconds is not None:
        figures.add("node: helm install --wait", f"{story.install_seconds:.1f} s")

    # 1. kubectl apply both managed versions: Ready because their pods are, then Routed.
    applying = time.monotonic()
    story.kubectl("apply", "-f", "-", input=manifests())
    eventually(lambda: routed(story, tuple(STORY)), "both versions Ready and Routed", 300)
    to_routed = time.monotonic() - applying
    assert ready_pods(story, STABLE)
    assert len(ready_pods(story, CANARY)) == 1
    eventually(
        lambda: len(ready_pods(story, STABLE)) == STABLE_REPLICAS, "stable-v1's 2 replicas", 120
    )
    eventually(lambda: gateway_weights(story) == {STABLE: 9, CANARY: 1}, "the gateway at 9:1", 30)
    endpoints = {v["name"]: v["endpoint"] for v in story.routes()[MODEL]["versions"]}
    figures.add(
        "node: kubectl apply -> Routed",
        f"{to_routed:.1f} s for both versions (pods scheduled, images present, probes passed); "
        f"the gateway reaches them at {endpoints}",
    )
    # The gateway pod resolves each version's Service through cluster DNS.
    assert endpoints == {n: f"http://{n}.{ns}.svc:8000" for n in STORY}

    with Traffic(
        story.gateway_url, MODEL, window=WINDOW, rounds_per_second=ROUNDS_PER_SECOND
    ) as traffic:
        steps = Steps(story, traffic, figures)
        started = time.monotonic()

        # 2. The split: every round of 10 is 9 stable-v1 + 1 canary-v2.
        traffic.wait_for(30 * WINDOW, after=started, timeout=120)
        windows = windows_after(traffic, started)
        uneven = [w for w in windows if w != Counter({STABLE: 9, CANARY: 1})]
        assert not uneven, f"{len(uneven)} of {len(windows)} rounds were not 9/1: {uneven[:5]}"
        figures.add("node: split", f"{len(windows)} rounds of {WINDOW}, every one 9/1")

        # 3. Prometheus found the sidecar pods with the PodMonitor's selector.
        prometheus = story.prometheus_api()

        def scraped() -> dict[str, float] | None:
            up = prometheus.by_label(
                f'sum by (pod) (modelroll_requests_total{{namespace="{ns}"}})', label="pod"
            )
            wanted = set(ready_pods(story, STABLE) + ready_pods(story, CANARY))
            return up if wanted and wanted <= set(up) else None

        per_pod = eventually(scraped, "Prometheus scraping every sidecar pod", 120)
        figures.add("node: Prometheus (pod discovery)", f"requests per pod so far: {per_pod}")

        # 4. Rollback by kubectl patch: canary-v2 stops answering within a second.
        patching = time.monotonic()
        story.kubectl("patch", "mv", CANARY, "--type", "merge", "-p", '{"spec":{"weight":0}}')
        patched = time.monotonic()
        steps.observe(patched)
        propagation, late = last_answer(traffic, CANARY, patched)
        figures.add(
            "node: rollback through the gateway pod",
            f"last canary-v2 answer {ms(propagation)} after `kubectl patch` returned ({late} "
            f"requests sent after it still reached canary-v2; kubectl took "
            f"{ms(patched - patching)})",
        )
        assert propagation < 1.0
        only_to(traffic, STABLE, patched + 1.0)
        lost = failed(traffic.since(started))
        figures.add("node: failed requests, split and rollback", f"{len(lost)}")
        assert not lost, describe(lost)
        story.kubectl("patch", "mv", CANARY, "--type", "merge", "-p", '{"spec":{"weight":1}}')
        eventually(lambda: gateway_weights(story) == {STABLE: 9, CANARY: 1}, "9:1 again", 30)

        # 5. A batching change rolls stable-v1's Deployment: no accepted request is lost.
        def batching_change() -> str:
            before = story.cluster.kubectl_json("get", "deployment", STABLE, namespace=ns)
            story.kubectl(
                "patch",
                "mv",
                STABLE,
                "--type",
                "merge",
                "-p",
                '{"spec":{"batching":{"maxWaitMs":5}}}',
            )
            eventually(
                lambda: (
                    story.cluster.kubectl_json("get", "deployment", STABLE, namespace=ns)[
                        "metadata"
                    ]["generation"]
                    > before["metadata"]["generation"]
                ),
                "the Deployment rolled",
                30,
            )
            story.kubectl("rollout", "status", f"deployment/{STABLE}", "--timeout=240s")
            return f"Deployment rolled to {ready_pods(story, STABLE)}"

        assert not steps.disruption("node: batching change (rolling update)", batching_change)

        # 6. kubectl delete pod: the remaining replica carries stable-v1's share meanwhile.
        def delete_pod() -> str:
            victim = ready_pods(story, STABLE)[0]
            story.kubectl("delete", "pod", victim, "--wait=true", "--timeout=120s")
            eventually(
                lambda: len(ready_pods(story, STABLE)) == STABLE_REPLICAS, "a new replica", 180
            )
            return f"deleted {victim}"

        assert not steps.disruption("node: kubectl delete pod", delete_pod)

        # 7. kubectl scale mv to 3 replicas, then back to 2.
        def scale(replicas: int) -> Callable[[], str]:
            def act() -> str:
                story.kubectl("scale", "mv", STABLE, f"--replicas={replicas}")
                eventually(
                    lambda: (
                        ready_replicas(story, STABLE) == replicas
                        and len(ready_pods(story, STABLE)) == replicas
                    ),
                    f"{replicas} ready replicas",
                    180,
                )
                return f"status.readyReplicas {replicas}"

            return act

        before = set(ready_pods(story, STABLE))
        assert not steps.disruption("node: kubectl scale mv --replicas=3", scale(3))
        # The new replica takes its share: the gateway renews its connections to the Service.
        (added,) = set(ready_pods(story, STABLE)) - before

        def served_by_new_replica() -> float | None:
            query = f'sum(modelroll_requests_total{{namespace="{ns}", pod="{added}"}})'
            count = sum(prometheus.by_label(query, label="").values())
            return count if count > 0 else None

        served = eventually(served_by_new_replica, f"{added} serving requests", 60)
        figures.add("node: the new replica's share", f"{added} answered {served:.0f} requests")
        assert not steps.disruption("node: kubectl scale mv --replicas=2", scale(2))

        # 8. The operator's pod deleted: routes stay, and the new pod takes over.
        def operator_replaced() -> str:
            routes_before = story.configmap_data()
            story.kill_operator()
            new = story.start_operator()
            assert story.configmap_data() == routes_before
            story.kubectl("patch", "mv", CANARY, "--type", "merge", "-p", '{"spec":{"weight":2}}')
            eventually(
                lambda: gateway_weights(story) == {STABLE: 9, CANARY: 2},
                "the new operator pod reconciling a weight change",
                60,
            )
            return f"new operator pod {new} reconciled a weight change"

        assert not steps.disruption("node: operator pod deleted", operator_replaced)

        # 9. The canary analysis rolls the failing canary back by itself, reading the gateway
        # pods' /metrics, found by the chart's labels (the default metrics source), from the
        # operator's pod.
        def analysis_rolls_back() -> str:
            analysis = {
                "steps": [{"weight": 20}],
                "intervalSeconds": 2,
                "warmupSeconds": 4,
                "minSeconds": 10,
                "minRequests": 20,
            }
            patch = json.dumps({"spec": {"analysis": analysis}})
            applied = time.monotonic()
            story.kubectl("patch", "mv", CANARY, "--type", "merge", "-p", patch)
            waited = story.kubectl(
                "wait", "--for=condition=RolledBack", "--timeout=120s", f"mv/{CANARY}", check=False
            )
            took = time.monotonic() - applied
            state = story.cluster.kubectl_json("get", "mv", CANARY, namespace=ns)["status"]
            # On a timeout, what the analysis was waiting for.
            assert waited.returncode == 0, f"not rolled back in {took:.0f} s: {state}"
            assert state["analysis"]["reason"] == "CanaryWorse", state["analysis"]
            eventually(
                lambda: gateway_weights(story) == {STABLE: 9, CANARY: 0},
                "the weights from before the analysis",
                10,
            )
            return f"rolled back {took:.1f} s after spec.analysis was set"

        assert not steps.disruption("node: canary analysis rolls back", analysis_rolls_back)

    assert_nothing_failed(figures, "node: failed requests", traffic.since(started))
