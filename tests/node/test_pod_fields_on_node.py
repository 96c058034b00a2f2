"""The pod fields of spec.server on a node that runs the pods, as a model team uses
them: a GPU-style pool (the node labelled and tainted) that only a version with the matching
nodeSelector and toleration lands on; weights that an init container writes into a volume the
model mounts; a key from a Secret in the model's environment; a model that takes a while to load,
held back by its startup probe with no traffic until it is Ready; and a field that collides with
the injected sidecar, refused as InvalidSpec. The model server is the demo model behind a shell
that refuses to start unless the weights file and the Secret's value are there.
"""

from __future__ import annotations

import json
import urllib.request
from typing import Any

import pytest

from tests.support.incluster import InCluster
from tests.support.pods import IMAGE, pods, ready, statuses
from tests.support.stack import eventually

pytestmark = pytest.mark.node

MODEL = "podfields"
SECRET = "podfields-key"
KEY = "open-sesame"
POOL_LABEL, POOL = "modelroll.io/test-pool", "gpu"
TAINT = "modelroll.io/test-gpu"
LOAD_S = 20
"""How long the slow model "loads" before it listens."""


def model_version(
    name: str, *, tolerate: bool = True, port: int = 8080, load_s: int = 0
) -> dict[str, Any]:
    start = (
        (f"sleep {load_s}; " if load_s else "")
        + '[ "$(cat /models/weights.txt)" = weights-v1 ] || { echo no weights; exit 1; }; '
        + f'[ "$API_KEY" = {KEY} ] || {{ echo no key; exit 1; }}; '
        # 0.0.0.0: the kubelet probes the pod's IP, not localhost.
        + f"exec modelroll-demo-model --host=0.0.0.0 --port={port} --fixed-ms=1 --per-token-ms=0"
    )
    server: dict[str, Any] = {
        "image": IMAGE,
        "imagePullPolicy": "IfNotPresent",
        "command": ["sh", "-c", start],
        "port": port,
        "env": [{"name": "API_KEY", "valueFrom": {"secretKeyRef": {"name": SECRET, "key": "k"}}}],
        "volumes": [{"name": "weights", "emptyDir": {}}],
        "volumeMounts": [{"name": "weights", "mountPath": "/models", "readOnly": True}],
        "initContainers": [
            {
                "name": "fetch-weights",
                "image": IMAGE,
                "imagePullPolicy": "IfNotPresent",
                "command": ["sh", "-c", "echo weights-v1 > /models/weights.txt"],
                "volumeMounts": [{"name": "weights", "mountPath": "/models"}],
            }
        ],
        "nodeSelector": {POOL_LABEL: POOL},
        "startupProbe": {
            "httpGet": {"path": "/readyz", "port": port},
            "periodSeconds": 1,
            "failureThreshold": 120,
        },
    }
    if tolerate:
        server["tolerations"] = [{"key": TAINT, "operator": "Exists", "effect": "NoSchedule"}]
    return {
        "apiVersion": "modelroll.io/v1alpha1",
        "kind": "ModelVersion",
        "metadata": {"name": name},
        "spec": {"model": MODEL, "weight": 1, "replicas": 1, "server": server},
    }


def routed_versions(story: InCluster) -> list[str]:
    model = story.routes().get(MODEL) or {"versions": []}
    return [v["name"] for v in model["versions"]]


def infer(story: InCluster) -> dict[str, Any]:
    request = urllib.request.Request(  # noqa: S310 (http to the gateway)
        f"{story.gateway_url}/v1/models/{MODEL}/infer",
        data=json.dumps({"payload": "weights and keys"}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as resp:  # noqa: S310
        answer: dict[str, Any] = json.loads(resp.read())
    return answer


@pytest.mark.timeout(420)
def test_a_model_on_a_tainted_pool_with_weights_a_secret_and_a_slow_start(
    on_cluster: InCluster,
) -> None:
    story = on_cluster
    node = story.cluster.kubectl_json("get", "nodes")["items"][0]["metadata"]["name"]
    names = ("podfields-v1", "podfields-untolerated", "podfields-clash")
    clean_up(story, names)  # whatever an interrupted run left
    try:
        story.kubectl("create", "secret", "generic", SECRET, f"--from-literal=k={KEY}")
        story.kubectl("label", "node", node, f"{POOL_LABEL}={POOL}", "--overwrite")
        story.kubectl("taint", "node", node, f"{TAINT}=true:NoSchedule", "--overwrite")
        documents = [
            model_version("podfields-v1", load_s=LOAD_S),
            model_version("podfields-untolerated", tolerate=False),
            model_version("podfields-clash", port=8000),  # the sidecar's port in the pod
        ]
        story.kubectl("apply", "-f", "-", input="\n---\n".join(json.dumps(d) for d in documents))

        # The collision: refused by name, and no Deployment is made for it.
        clash = eventually(
            lambda: (c := ready(story, "podfields-clash")).get("reason") == "InvalidSpec" and c,
            "podfields-clash InvalidSpec",
            60,
        )
        assert clash["status"] == "False"
        assert "spec.server.port 8000 is the batching sidecar's port" in clash["message"]
        gone = story.kubectl("get", "deployment", "podfields-clash", check=False)
        assert gone.returncode != 0
        assert "NotFound" in gone.stderr

        # While the model loads: its pod runs on the pool, the init container has written the
        # weights, the model has not started, the sidecar not even begun, and nothing routes.
        def loading() -> dict[str, Any] | None:
            found = pods(story, "podfields-v1")
            if not found or "model" not in statuses(found[0]):
                return None
            model = statuses(found[0])["model"]
            return found[0] if "running" in model.get("state", {}) else None

        pod = eventually(loading, "the model container running (loading)", 120)
        assert pod["spec"]["nodeName"] == node
        status = statuses(pod)
        assert status["fetch-weights"]["state"]["terminated"]["exitCode"] == 0
        assert status["model"]["started"] is False
        assert "running" not in status.get("sidecar", {}).get("state", {})
        assert ready(story, "podfields-v1").get("status") != "True"
        assert "podfields-v1" not in routed_versions(story)

        # Loaded: Ready, routed, and answering through the gateway with the Secret's key and
        # the weights in place (the shell above refuses to start the model without them).
        eventually(lambda: ready(story, "podfields-v1").get("status") == "True", "Ready", 180)
        eventually(lambda: "podfields-v1" in routed_versions(story), "routed", 60)
        assert routed_versions(story) == ["podfields-v1"]  # the untolerated copy never runs
        answer = eventually(lambda: infer(story), "an answer through the gateway", 30)
        assert answer["version"] == "podfields-v1"
        (running,) = pods(story, "podfields-v1")
        assert statuses(running)["model"]["restartCount"] == 0  # the probe held it, no restart

        # The same spec without the toleration never leaves Pending on the tainted pool.
        (pending,) = pods(story, "podfields-untolerated")
        assert pending["status"]["phase"] == "Pending"
        (scheduled,) = [c for c in pending["status"]["conditions"] if c["type"] == "PodScheduled"]
        assert (scheduled["status"], scheduled["reason"]) == ("False", "Unschedulable")
        assert ready(story, "podfields-untolerated").get("status") == "False"
    finally:
        clean_up(story, names)
        story.kubectl("taint", "node", node, f"{TAINT}-", check=False)
        story.kubectl("label", "node", node, f"{POOL_LABEL}-", check=False)


def clean_up(story: InCluster, names: tuple[str, ...]) -> None:
    """Delete the versions, and wait until their pods are gone too (the garbage collector
    deletes them after the versions): a pending pod left behind would be scheduled the moment
    the taint goes, and run on."""
    story.kubectl("delete", "mv", *names, "--ignore-not-found", "--timeout=120s", check=False)
    story.kubectl("delete", "secret", SECRET, "--ignore-not-found", check=False)
    eventually(lambda: not any(pods(story, name) for name in names), "their pods gone", 120)
