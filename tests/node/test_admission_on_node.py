"""A managed version in a namespace that enforces Pod Security "restricted" and has a
ResourceQuota, on a node that runs its pods: refused pods are named in the version's status,
the version with a security context and resources is admitted and serves, an edit the API server
refuses changes nothing that serves, and a hung model server is restarted by its liveness probe
while the other replica serves. `kubectl logs` of a pod lands on the model server.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

import pytest

from tests.support.incluster import InCluster
from tests.support.pods import IMAGE, pods, ready, statuses
from tests.support.stack import eventually

pytestmark = pytest.mark.node

MODEL = "hardened"
NAME = "hardened-v1"
QUOTA = {
    "apiVersion": "v1",
    "kind": "ResourceQuota",
    "metadata": {"name": "hardened-compute"},
    "spec": {"hard": {"limits.cpu": "4", "limits.memory": "8Gi"}},
}
RESTRICTED = {
    "runAsNonRoot": True,
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}
SMALL = {
    "requests": {"cpu": "100m", "memory": "128Mi"},
    "limits": {"cpu": "500m", "memory": "256Mi"},
}
HANG = (
    "for p in /proc/[0-9]*; do n=${p#/proc/}; [ $n = $$ ] && continue; "
    "grep -qa modelroll-demo-model $p/cmdline 2>/dev/null && kill -STOP $n; done; true"
)
"""Stops the model server's process (seen from the model container through the pod's shared
process namespace), so that it hangs: alive, answering nothing."""


def version(*, hardened: bool) -> dict[str, Any]:
    server: dict[str, Any] = {
        "image": IMAGE,
        "imagePullPolicy": "IfNotPresent",
        "command": ["modelroll-demo-model", "--host=0.0.0.0", "--port=8080", "--fixed-ms=1"],
        "port": 8080,
        "shareProcessNamespace": True,
    }
    if hardened:
        probe = {"httpGet": {"path": "/livez", "port": "model"}, "timeoutSeconds": 1}
        server |= {
            "securityContext": RESTRICTED,
            "resources": SMALL,
            "livenessProbe": {**probe, "periodSeconds": 2, "failureThreshold": 2},
        }
    return {
        "apiVersion": "modelroll.io/v1alpha1",
        "kind": "ModelVersion",
        "metadata": {"name": NAME},
        "spec": {
            "model": MODEL,
            "weight": 1,
            "replicas": 2,
            "server": server,
            "sidecar": {"resources": SMALL},
        },
    }


def infer_request(story: InCluster) -> urllib.request.Request:
    return urllib.request.Request(  # noqa: S310 (http to the gateway)
        f"{story.gateway_url}/v1/models/{MODEL}/infer",
        data=json.dumps({"payload": "locked down"}).encode(),
        headers={"Content-Type": "application/json"},
    )


def answered(story: InCluster, count: int) -> list[int]:
    """The status of each of ``count`` requests through the gateway, one after another."""
    codes = []
    for _ in range(count):
        try:
            with urllib.request.urlopen(infer_request(story), timeout=10) as resp:  # noqa: S310
                codes.append(resp.status)
        except urllib.error.HTTPError as exc:
            codes.append(exc.code)
    return codes


def answers_now(story: InCluster) -> bool:
    """Whether one request through the gateway is answered 200 within 5 s."""
    try:
        with urllib.request.urlopen(infer_request(story), timeout=5) as resp:  # noqa: S310
            return bool(resp.status == 200)
    except OSError:  # an HTTP error status, or a timeout on a connection to the hung pod
        return False


def ready_because(story: InCluster, reason: str) -> dict[str, Any]:
    """The version's Ready condition, once its reason is ``reason``."""
    found: dict[str, Any] = eventually(
        lambda: c if (c := ready(story, NAME)).get("reason") == reason else None, reason, 60
    )
    return found


def pod_ready(pod: dict[str, Any]) -> bool:
    conditions = pod.get("status", {}).get("conditions", [])
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


@pytest.mark.timeout(420)
def test_a_version_in_a_restricted_namespace_with_a_quota_serves_and_heals(
    on_cluster: InCluster,
) -> None:
    story = on_cluster
    namespace = story.namespace
    story.kubectl("delete", "mv", NAME, "--ignore-not-found", "--timeout=120s", check=False)
    try:
        story.kubectl("apply", "-f", "-", input=json.dumps(QUOTA))
        enforce = "pod-security.kubernetes.io/enforce=restricted"
        story.kubectl("label", "namespace", namespace, enforce, "--overwrite")

        # Without a security context the model container is refused, and the version says so.
        story.kubectl("apply", "-f", "-", input=json.dumps(version(hardened=False)))
        refused = ready_because(story, "PodsRefused")
        assert refused["status"] == "False"
        assert 'violates PodSecurity "restricted' in refused["message"]
        assert 'container "sidecar"' not in refused["message"]  # the injected one complies
        assert not pods(story, NAME)

        # With its security context and resources it is admitted, runs and serves.
        story.kubectl("apply", "-f", "-", input=json.dumps(version(hardened=True)))
        eventually(
            lambda: (
                ready(story, NAME).get("reason") == "ReplicasReady"
                and len([p for p in pods(story, NAME) if pod_ready(p)]) == 2
            ),
            "both replicas Ready",
            180,
        )
        assert answered(story, 20) == [200] * 20

        # kubectl logs without -c reads the model server, not the sidecar.
        first = pods(story, NAME)[0]["metadata"]["name"]
        logs = story.kubectl("logs", first, "--tail=5")
        assert "Defaulted container" not in logs.stderr
        assert logs.stdout == story.kubectl("logs", first, "-c", "model", "--tail=5").stdout

        # An edit the API server refuses keeps the version on its previous pods, serving.
        generation = story.cluster.kubectl_json("get", "deploy", NAME, namespace=namespace)[
            "metadata"
        ]["generation"]
        bad = {"spec": {"server": {"tolerations": [{"key": "gpu", "operator": "Sometimes"}]}}}
        story.kubectl("patch", "mv", NAME, "--type=merge", "-p", json.dumps(bad))
        kept = ready_because(story, "UpdateRefused")
        assert kept["status"] == "True"
        assert "tolerations[0].operator" in kept["message"]
        assert answered(story, 20) == [200] * 20
        deployment = story.cluster.kubectl_json("get", "deploy", NAME, namespace=namespace)
        assert deployment["metadata"]["generation"] == generation
        undo = [{"op": "remove", "path": "/spec/server/tolerations"}]
        story.kubectl("patch", "mv", NAME, "--type=json", "-p", json.dumps(undo))

        # A hung model server: its pod leaves the Service, the other replica answers, and the
        # kubelet restarts the model on its liveness probe.
        story.kubectl("exec", first, "-c", "model", "--", "sh", "-c", HANG)

        def hung() -> bool:
            pod = next(p for p in pods(story, NAME) if p["metadata"]["name"] == first)
            return not pod_ready(pod)

        eventually(hung, "the hung pod NotReady", 60)
        # The Service drops it within seconds (EndpointSlice, then kube-proxy), and the gateway's
        # pooled connections to it end at their max age (10 s): from then on every request is
        # answered by the other replica.
        eventually(lambda: answers_now(story), "a request answered by the other replica", 60)
        assert answered(story, 20) == [200] * 20

        def restarted() -> dict[str, Any] | None:
            pod = next(p for p in pods(story, NAME) if p["metadata"]["name"] == first)
            model = statuses(pod)["model"]
            return pod if model["restartCount"] >= 1 and pod_ready(pod) else None

        pod = eventually(restarted, "the model restarted and the pod Ready again", 120)
        assert statuses(pod)["sidecar"]["restartCount"] == 0  # only the model was restarted
        assert ready(story, NAME)["status"] == "True"
        assert answered(story, 20) == [200] * 20
    finally:
        story.kubectl("delete", "mv", NAME, "--ignore-not-found", "--timeout=120s", check=False)
        eventually(lambda: not pods(story, NAME), "its pods gone", 120)
        unlabel = "pod-security.kubernetes.io/enforce-"
        story.kubectl("label", "namespace", namespace, unlabel, check=False)
        quota = QUOTA["metadata"]["name"]  # type: ignore[index]
        story.kubectl("delete", "resourcequota", quota, "--ignore-not-found", check=False)
