"""The pod fields of spec.server against the real API server. GPU nodes cannot run
here, so their rendering is checked where it matters: the CRD admits the fields, the operator's
Deployment carrying them passes the API server's own pod validation (and a server-side dry run
of a pod from its template, which is what the ReplicaSet controller will create), and what the
API server or the CRD refuses reaches the user by name. The pods run on the real node in
tests/node/test_pod_fields_on_node.py.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from modelroll_devcluster import Cluster
from tests.support.apiserver import StartOperator, eventually, invalid_spec, model_version
from tests.support.specs import GPU_SERVER

pytestmark = pytest.mark.integration


PREREQUISITES = """
apiVersion: node.k8s.io/v1
kind: RuntimeClass
metadata: {name: nvidia}
handler: nvidia
---
apiVersion: scheduling.k8s.io/v1
kind: PriorityClass
metadata: {name: serving-high}
value: 1000
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: llm-reader}
"""
"""What GPU_SERVER's pod refers to by name."""


def test_a_gpu_version_renders_a_pod_the_api_server_accepts(
    cluster: Cluster, namespace: str, start_operator: StartOperator
) -> None:
    operator = start_operator()
    cluster.apply(model_version("llm-v2", "llm", weight=1, server=GPU_SERVER), namespace)
    deployment = eventually(
        lambda: (
            cluster.exists("deploy", "llm-v2", namespace=namespace)
            and cluster.kubectl_json("get", "deploy", "llm-v2", namespace=namespace)
        ),
        "the Deployment",
    )
    pod = deployment["spec"]["template"]["spec"]
    assert pod["runtimeClassName"] == "nvidia"
    assert pod["nodeSelector"] == GPU_SERVER["nodeSelector"]
    assert pod["tolerations"] == GPU_SERVER["tolerations"]
    assert pod["affinity"] == GPU_SERVER["affinity"]
    assert [c["name"] for c in pod["initContainers"]] == ["fetch-weights", "model"]
    model = pod["initContainers"][1]
    assert model["resources"]["limits"] == {"nvidia.com/gpu": "1"}
    assert model["startupProbe"]["failureThreshold"] == 60

    # The pod the ReplicaSet controller will make from this template, dry-run on the server:
    # validation and admission of every field, GPU limits and all, with nothing created. The
    # admission plugins look up the pod's RuntimeClass, PriorityClass and service account, as
    # a GPU cluster would have them.
    candidate = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "llm-v2-dry"}, "spec": pod}
    try:
        cluster.apply(PREREQUISITES, namespace)
        dry = cluster.kubectl(
            "create",
            "--dry-run=server",
            "-o",
            "json",
            "-f",
            "-",
            namespace=namespace,
            input=json.dumps(candidate),
        )
    finally:
        cluster.kubectl("delete", "runtimeclass", "nvidia", "--ignore-not-found", check=False)
        cluster.kubectl(
            "delete", "priorityclass", "serving-high", "--ignore-not-found", check=False
        )
    accepted = json.loads(dry.stdout)["spec"]
    assert accepted["runtimeClassName"] == "nvidia"
    assert accepted["priority"] == 1000  # the PriorityClass's value, filled in by admission
    assert not cluster.exists("pod", "llm-v2-dry", namespace=namespace)
    assert operator.errors() == []


def test_a_pod_field_the_api_server_refuses_is_the_versions_invalid_spec(
    cluster: Cluster, namespace: str, start_operator: StartOperator
) -> None:
    start_operator()
    bad = {**GPU_SERVER, "tolerations": [{"key": "gpu", "operator": "Sometimes"}]}
    cluster.apply(model_version("llm-v2", "llm", weight=1, server=bad), namespace)
    condition = invalid_spec(cluster, namespace, "llm-v2")
    assert "The API server rejected Deployment llm-v2" in condition["message"]
    assert "tolerations[0].operator" in condition["message"]


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"initContainers": [{"name": "sidecar", "image": "x"}]}, "names model and sidecar"),
        ({"env": [{"name": "A", "value": "1", "valueFrom": {}}]}, "value or valueFrom, not both"),
        ({"volumes": [{"name": "Weights!"}]}, "spec.server.volumes[0].name"),
    ],
    ids=["sidecar name", "value and valueFrom", "volume name"],
)
def test_the_crd_refuses_what_would_collide_at_apply_time(
    cluster: Cluster, namespace: str, change: dict[str, Any], says: str
) -> None:
    doc = model_version("llm-v2", "llm", weight=1, server={**GPU_SERVER, **change})
    refused = cluster.kubectl(
        "apply", "-f", "-", namespace=namespace, input=json.dumps(doc), check=False
    )
    assert refused.returncode != 0
    assert says in refused.stderr


def test_a_collision_only_the_operator_sees_is_invalid_spec_and_applies_nothing(
    cluster: Cluster, namespace: str, start_operator: StartOperator
) -> None:
    start_operator()
    clash = {**GPU_SERVER, "port": 8000}  # the sidecar's port in the pod
    cluster.apply(model_version("llm-v2", "llm", weight=1, server=clash), namespace)
    condition = invalid_spec(cluster, namespace, "llm-v2")
    assert "spec.server.port 8000 is the batching sidecar's port" in condition["message"]
    assert not cluster.exists("deploy", "llm-v2", namespace=namespace)
