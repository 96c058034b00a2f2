"""What one weight change costs: passes over models (counted from the operator's debug log, one
"Reconciled model" line per pass), events posted, and status writes (counted by the
resourceVersion of each ModelVersion, which every write moves on)."""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import pytest

from modelroll_devcluster import Cluster
from tests.support.apiserver import (
    OperatorProcess,
    Routes,
    StartOperator,
    eventually,
    model_version,
    patch_mv,
)

pytestmark = pytest.mark.integration

MODELS = 40


def passes(operator: OperatorProcess) -> Counter[str]:
    """Passes so far, by model ("namespace/model")."""
    counts: Counter[str] = Counter()
    for message in operator.messages():
        if message.startswith("Reconciled model "):
            counts[message.split(" ")[2]] += 1
    return counts


def settled(operator: OperatorProcess, quiet: float = 2.0) -> Counter[str]:
    """The passes once none has started for `quiet` seconds."""
    last = passes(operator)
    while True:
        time.sleep(quiet)
        now = passes(operator)
        if now == last:
            return now
        last = now


def wide_versions(cluster: Cluster, namespace: str) -> dict[str, dict[str, Any]]:
    """The wide model's versions as the API server has them, by name."""
    items = cluster.kubectl_json("get", "mv", namespace=namespace)["items"]
    return {b["metadata"]["name"]: b for b in items if b["spec"]["model"] == "wide"}


def reported(body: dict[str, Any]) -> bool:
    """Whether the operator's status is of the version's current spec."""
    status = body.get("status") or {}
    return bool(status.get("observedGeneration") == body["metadata"]["generation"])


def routed_events(cluster: Cluster, namespace: str) -> int:
    events = cluster.kubectl_json(
        "get", "events", "--field-selector=reason=Routed", namespace=namespace
    )["items"]
    return len(events)


def test_a_weight_change_reconciles_only_its_model_and_writes_and_posts_for_it_alone(
    cluster: Cluster, namespace: str, start_operator: StartOperator, routes: Routes
) -> None:
    operator = start_operator("--log-level=DEBUG")
    items = [
        model_version(f"m{i:02}-v1", f"m{i:02}", weight=1, endpoint=f"http://m{i}:8000")
        for i in range(MODELS)
    ]
    items += [
        model_version(f"wide-v{i:02}", "wide", weight=1, endpoint=f"http://w{i}:8000")
        for i in range(60)
    ]
    cluster.apply({"apiVersion": "v1", "kind": "List", "items": items}, namespace)
    eventually(lambda: len(routes.data()) == MODELS + 1, "every model routed", within=60)
    eventually(lambda: len(routes.weights("wide") or {}) == 60, "the wide model's 60 versions")
    before = settled(operator)
    events_before = routed_events(cluster, namespace)

    patch_mv(cluster, namespace, "m07-v1", {"spec": {"weight": 2}})
    eventually(lambda: routes.weights("m07") == {"m07-v1": 2}, "the new weight")
    cost = settled(operator) - before
    print(f"passes after one weight change among {MODELS + 1} models: {dict(cost)}")
    assert set(cost) == {f"{namespace}/m07"}
    assert cost[f"{namespace}/m07"] <= 2  # the change, and the status write it caused

    eventually(
        lambda: all(reported(b) for b in wide_versions(cluster, namespace).values()),
        "the wide model's statuses",
    )
    revisions = {
        name: b["metadata"]["resourceVersion"]
        for name, b in wide_versions(cluster, namespace).items()
    }
    # The last version by name: a pass writes statuses in name order, so once its status is of
    # its new weight, the pass has written every sibling's that it was going to.
    patch_mv(cluster, namespace, "wide-v59", {"spec": {"weight": 5}})

    def reported_reweighted() -> dict[str, Any] | None:
        body = wide_versions(cluster, namespace)["wide-v59"]
        return body if reported(body) else None

    changed = eventually(reported_reweighted, "wide-v59's status of its new weight")
    assert changed["status"]["routedWeight"] == 5
    settled(operator)
    written = sorted(
        name
        for name, b in wide_versions(cluster, namespace).items()
        if b["metadata"]["resourceVersion"] != revisions[name]
    )
    print(f"ModelVersions written by one weight change in a model of 60 versions: {len(written)}")
    assert written == ["wide-v59"]  # not the 59 whose share moved with it
    posted = routed_events(cluster, namespace) - events_before
    print(f"Routed events after two weight changes (one in a model of 60 versions): {posted}")
    assert posted == 2  # m07-v1's and wide-v59's
