"""Scale before shift, against the real API server and kube-controller-manager: a version whose
share rises gets its replicas before its weight goes into the route, one that cannot get them
holds the move with the reason, and one that lost its traffic stays warm for its delay.

No kubelet runs here: pods are reported Ready through their status (``mark_pods_ready``), and the
real ReplicaSet and Deployment controllers carry that into the Deployments the operator watches.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from modelroll_devcluster import Cluster
from tests.support.apiserver import (
    Routes,
    StartOperator,
    condition,
    eventually,
    get,
    model_version,
    patch_mv,
    version_pods_ready,
)
from tests.support.specs import SERVER

pytestmark = pytest.mark.integration


def replicas(cluster: Cluster, namespace: str, version: str) -> int:
    return int(get(cluster, namespace, "deploy", version)["spec"]["replicas"])


def capacity(cluster: Cluster, namespace: str, version: str) -> dict[str, Any]:
    body = get(cluster, namespace, "mv", version)
    for c in body["status"].get("conditions") or []:
        if c["type"] == "Capacity":
            return {**c, "floor": (body["status"].get("capacity") or {}).get("floor")}
    return {}


def events(cluster: Cluster, namespace: str, name: str) -> list[tuple[str, str]]:
    selector = f"involvedObject.kind=ModelVersion,involvedObject.name={name}"
    listed = cluster.kubectl_json(
        "get", "events", f"--field-selector={selector}", namespace=namespace
    )
    return [(e["reason"], e["message"]) for e in listed["items"]]


class Plugin:
    """``kubectl modelroll -n <namespace> <args>``, as a person runs it, in the background; its
    output lines as they come."""

    def __init__(self, cluster: Cluster, namespace: str, *args: str) -> None:
        env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig)}
        argv = [str(Path(sys.executable).parent / "kubectl-modelroll"), "-n", namespace, *args]
        self.proc = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        with self.proc.stdout:
            for line in self.proc.stdout:
                self.lines.append(line)

    def said(self, text: str) -> bool:
        return any(text in line for line in self.lines)

    def finish(self) -> str:
        """Its whole output, once it exited 0."""
        self.proc.wait(timeout=90)
        self._reader.join(timeout=10)
        out = "".join(self.lines)
        assert self.proc.returncode == 0, out
        return out


def serving(cluster: Cluster, namespace: str, routes: Routes) -> None:
    """stable at weight 100 with 3 Ready replicas, canary at weight 0 with 1."""
    stable = model_version("stable", "sentiment", weight=100, replicas=3, server=SERVER)
    canary = model_version("canary", "sentiment", weight=0, server=SERVER, scaleDownDelaySeconds=3)
    for body in (stable, canary):
        cluster.apply(body, namespace)
    eventually(lambda: version_pods_ready(cluster, namespace, "stable", 3), "3 stable pods")
    eventually(lambda: version_pods_ready(cluster, namespace, "canary", 1), "a canary pod")
    eventually(lambda: routes.weights("sentiment") == {"stable": 100, "canary": 0}, "both routed")


@pytest.mark.usefixtures("garbage_collector")
def test_a_promotion_waits_for_the_canarys_replicas_and_a_rollback_after_it_is_instant(
    cluster: Cluster, namespace: str, start_operator: StartOperator, routes: Routes
) -> None:
    start_operator()
    serving(cluster, namespace, routes)

    promote = Plugin(cluster, namespace, "promote", "canary", "--wait", "60")
    # The canary's Deployment is raised to the stable's 3 replicas; the weights wait for them.
    eventually(lambda: replicas(cluster, namespace, "canary") == 3, "canary raised to 3")
    waiting = eventually(
        lambda: (
            (c := capacity(cluster, namespace, "canary")).get("reason") == "WaitingForReplicas"
            and c
        ),
        "canary waiting for replicas",
    )
    assert waiting["status"] == "False"
    assert (
        "3 ready replicas before it takes 100.0% of model sentiment's traffic"
        in (waiting["message"])
    )
    assert any(r == "WaitingForReplicas" for r, _ in events(cluster, namespace, "canary"))
    assert routes.weights("sentiment") == {"stable": 100, "canary": 0}
    printed = cluster.kubectl("get", "mv", "canary", namespace=namespace).stdout
    assert "WaitingForReplicas" in printed  # kubectl get mv shows what it waits for
    # The plugin says what the promotion waits for (held there: no canary pod is Ready yet).
    waits = "waiting: canary: Waiting for 3 ready replicas before it takes 100.0%"
    eventually(lambda: promote.said(waits), "the plugin saying what it waits for")

    eventually(lambda: version_pods_ready(cluster, namespace, "canary", 3), "3 canary pods")
    eventually(lambda: routes.weights("sentiment") == {"stable": 0, "canary": 100}, "promoted")
    out = promote.finish()  # it returns once the weights are in force, and shows them
    assert "note: the new weights go in force" not in out
    promoted = eventually(
        lambda: (c := capacity(cluster, namespace, "canary")).get("status") == "True" and c,
        "canary has its replicas",
    )
    assert (promoted["reason"], promoted["floor"]) == ("ReplicasForShare", 3)
    warm = eventually(
        lambda: (c := capacity(cluster, namespace, "stable")).get("reason") == "KeptWarm" and c,
        "stable kept warm",
    )
    assert warm["floor"] == 3
    assert replicas(cluster, namespace, "stable") == 3

    # Rolling back right after: the stable still runs its replicas, so the weights move back
    # at once; the canary keeps its 3 for its 3 s delay, then returns to spec.replicas.
    out = Plugin(cluster, namespace, "rollback", "canary").finish()
    assert "waiting:" not in out
    assert routes.weights("sentiment") == {"stable": 100, "canary": 0}
    assert capacity(cluster, namespace, "stable")["status"] == "True"
    eventually(lambda: replicas(cluster, namespace, "canary") == 1, "canary back to 1 replica")
    assert capacity(cluster, namespace, "canary")["floor"] is None


@pytest.mark.usefixtures("garbage_collector")
def test_a_version_that_cannot_get_its_replicas_holds_the_move_with_the_reason(
    cluster: Cluster, namespace: str, start_operator: StartOperator, routes: Routes
) -> None:
    start_operator()
    serving(cluster, namespace, routes)
    quota = {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": "pods"},
        "spec": {"hard": {"pods": "4"}},
    }
    cluster.apply(quota, namespace)
    eventually(
        lambda: get(cluster, namespace, "resourcequota", "pods").get("status", {}).get("used"),
        "the quota counted",
    )
    patch_mv(cluster, namespace, "canary", {"spec": {"weight": 100}})
    patch_mv(cluster, namespace, "stable", {"spec": {"weight": 0}})
    held = eventually(
        lambda: (
            (c := capacity(cluster, namespace, "canary")).get("reason") == "ReplicasUnavailable"
            and c
        ),
        "canary reports it cannot get replicas",
        within=60,
    )
    assert "exceeded quota" in held["message"]
    assert routes.weights("sentiment") == {"stable": 100, "canary": 0}
    assert condition(get(cluster, namespace, "mv", "stable"), "Routed") == ("True", "Routed")

    # The quota raised, the pods come, and only then does the traffic move.
    cluster.kubectl(
        "patch",
        "resourcequota",
        "pods",
        "--type=merge",
        "-p",
        json.dumps({"spec": {"hard": {"pods": "10"}}}),
        namespace=namespace,
    )
    eventually(
        lambda: version_pods_ready(cluster, namespace, "canary", 3), "3 canary pods", within=60
    )
    eventually(lambda: routes.weights("sentiment") == {"stable": 0, "canary": 100}, "promoted")


def standby(routes: Routes, model: str) -> dict[str, bool]:
    """{version: on standby} of the model's route."""
    text = routes.data().get(model)
    versions = json.loads(text)["versions"] if text else []
    return {v["name"]: bool(v.get("standby")) for v in versions}


@pytest.mark.usefixtures("garbage_collector")
def test_a_version_scaled_to_zero_waits_on_standby_and_a_weight_wakes_it(
    cluster: Cluster, namespace: str, start_operator: StartOperator, routes: Routes
) -> None:
    start_operator()
    cluster.apply(model_version("stable", "sentiment", weight=100, server=SERVER), namespace)
    cluster.apply(
        model_version("dark", "sentiment", weight=0, replicas=0, server=SERVER), namespace
    )
    eventually(lambda: version_pods_ready(cluster, namespace, "stable", 1), "a stable pod")
    # Scaled to zero, it is in the route on standby: pinning it answers 503, not 404.
    eventually(
        lambda: standby(routes, "sentiment") == {"dark": True, "stable": False}, "dark on standby"
    )
    assert condition(get(cluster, namespace, "mv", "dark"), "Routed") == ("False", "ScaledToZero")

    # A weight wakes it: it gets a replica first, then its share.
    patch_mv(cluster, namespace, "dark", {"spec": {"weight": 100}})
    eventually(lambda: replicas(cluster, namespace, "dark") == 1, "dark raised to 1 replica")
    assert routes.weights("sentiment") == {"dark": 0, "stable": 100}
    eventually(lambda: version_pods_ready(cluster, namespace, "dark", 1), "a dark pod")
    eventually(lambda: routes.weights("sentiment") == {"dark": 100, "stable": 100}, "dark routed")
    assert standby(routes, "sentiment") == {"dark": False, "stable": False}
