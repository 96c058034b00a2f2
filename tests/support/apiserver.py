"""Test helpers for the operator against a real API server (in the spirit of kopf.testing).

Polling, ModelVersion manifests, the operator process and its JSON log, and the routes
ConfigMap as the gateway reads it; reading back what the operator wrote (objects, conditions,
Events, HTTPRoutes). The fixtures built on them are in tests/integration/conftest.py.
They live with the tests, not in the operator's package: the product ships no test code.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import pytest

from modelroll_common.routes import CONFIGMAP_NAME
from modelroll_operator.spec import API_VERSION, FINALIZER, KIND

if TYPE_CHECKING:
    from modelroll_devcluster import Cluster
    from tests.support.processes import Proc

T = TypeVar("T")
CRD_NAME = "modelversions.modelroll.io"


def crd_path() -> Path:
    """crds/modelversion.yaml of the checkout this package is installed (editable) from."""
    for directory in Path(__file__).resolve().parents:
        candidate = directory / "crds" / "modelversion.yaml"
        if candidate.is_file():
            return candidate
    raise FileNotFoundError("crds/modelversion.yaml not found above the modelroll_operator package")


def apply_crd(cluster: Cluster) -> None:
    """Apply the CRD and wait until ModelVersions can be listed.

    Right after a CRD is Established the API server may still answer 429 "storage is
    (re)initializing" for a moment; an operator started then would log (and retry) that.
    """
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(crd_path()))
    cluster.wait_established(CRD_NAME)
    eventually(
        lambda: cluster.kubectl("get", "modelversions", "-A", check=False).returncode == 0,
        "listing ModelVersions",
    )


def wait_for_garbage_collection(cluster: Cluster, namespace: str = "default") -> None:
    """Wait until kube-controller-manager's garbage collector follows ModelVersion owners.

    The garbage collector picks up new resource kinds on its periodic resync (every 30 s), so
    for a while after the CRD is created the children of a deleted ModelVersion linger. A probe:
    a ConfigMap owned by a ModelVersion, which must go when its owner does.
    """
    probe = f"gc-probe-{int(time.time() * 1000) % 10**9}"
    owner = model_version(probe, "gc-probe", endpoint="http://gc-probe:8000")
    cluster.apply(owner, namespace=namespace)
    uid = cluster.kubectl_json("get", "mv", probe, namespace=namespace)["metadata"]["uid"]
    cluster.apply(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": probe,
                "ownerReferences": [
                    {"apiVersion": API_VERSION, "kind": KIND, "name": probe, "uid": uid}
                ],
            },
        },
        namespace=namespace,
    )
    cluster.kubectl("delete", "mv", probe, "--cascade=background", namespace=namespace)
    cluster.wait_gone("configmap", probe, namespace=namespace, timeout=90)


def eventually(check: Callable[[], T | None], what: str, within: float = 30.0) -> T:
    """Poll ``check`` until it returns something truthy; fail naming ``what`` and the last value.

    An AssertionError raised by ``check`` counts as "not yet" (and is shown if time runs out).
    """
    deadline = time.monotonic() + within
    last: object = None
    while True:
        try:
            value = check()
        except AssertionError as exc:
            last = exc
        else:
            if value:
                return value
            last = value
        if time.monotonic() > deadline:
            pytest.fail(f"{what} did not happen within {within:g}s; last saw: {last}")
        time.sleep(0.1)


def model_version(name: str, model: str, **spec: Any) -> dict[str, Any]:
    """A ModelVersion manifest; ``spec`` holds the CRD's fields (weight, endpoint, server, …)."""
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": name},
        "spec": {"model": model, **spec},
    }


def mark_pods_ready(cluster: Cluster, namespace: str, selector: str) -> int:
    """Report the selected pods Ready, as a kubelet would once their probes pass.

    The test control plane has no kubelet or scheduler, so pods never run. Patching the pods'
    status lets the real ReplicaSet and Deployment controllers count them ready and set the
    Deployment's readyReplicas; patching the Deployment's status directly does not stick (the
    Deployment controller recomputes it from its ReplicaSets at once). Returns how many pods.
    """
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    ready = [
        {"type": kind, "status": "True", "lastTransitionTime": now}
        for kind in ("PodScheduled", "Initialized", "ContainersReady", "Ready")
    ]
    patch = json.dumps({"status": {"phase": "Running", "conditions": ready}})
    names = cluster.kubectl(
        "get", "pods", "-l", selector, "-o", "name", namespace=namespace
    ).stdout.split()
    for name in names:
        cluster.kubectl(
            "patch",
            name,
            "--subresource=status",
            "--type=merge",
            "-p",
            patch,
            namespace=namespace,
        )
    return len(names)


def version_pods_ready(cluster: Cluster, namespace: str, version: str, count: int) -> bool:
    """Report every pod of a managed ``version`` Ready; True once there are ``count`` of them."""
    return mark_pods_ready(cluster, namespace, f"modelroll.io/version={version}") >= count


class OperatorProcess:
    """A running ``modelroll-operator`` and what it wrote to its JSON log."""

    def __init__(self, proc: Proc, liveness: str) -> None:
        self.proc = proc
        self.liveness = liveness

    def records(self) -> list[dict[str, Any]]:
        out = []
        for line in self.proc.log().splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                record = {"message": line, "severity": "raw"}
            out.append(record if isinstance(record, dict) else {"message": line})
        return out

    def errors(self, since: int = 0) -> list[dict[str, Any]]:
        """Log records at error level or worse (or lines that are not JSON, e.g. tracebacks)."""
        bad = ("error", "fatal", "raw")
        return [r for r in self.records()[since:] if r.get("severity") in bad]

    def messages(self) -> list[str]:
        return [str(r.get("message")) for r in self.records()]

    def logged(self, fragment: str) -> bool:
        """Whether some log message contains ``fragment``."""
        return any(fragment in message for message in self.messages())

    def running(self) -> bool:
        return self.proc.popen.poll() is None

    def stop(self) -> None:
        self.proc.stop()


StartOperator = Callable[..., OperatorProcess]
"""The ``start_operator`` fixture: ``start_operator(*extra_flags)``."""


class Routes:
    """The namespace's routes ConfigMap as the gateway would read it."""

    def __init__(self, cluster: Cluster, namespace: str) -> None:
        self.cluster = cluster
        self.namespace = namespace

    def configmap(self) -> dict[str, Any] | None:
        if not self.cluster.exists("configmap", CONFIGMAP_NAME, namespace=self.namespace):
            return None
        doc: dict[str, Any] = self.cluster.kubectl_json(
            "get", "configmap", CONFIGMAP_NAME, namespace=self.namespace
        )
        return doc

    def data(self) -> dict[str, str]:
        return dict((self.configmap() or {}).get("data") or {})

    def weights(self, model: str) -> dict[str, int] | None:
        """{version: weight} of the model's entry; None when it has no key."""
        text = self.data().get(model)
        if text is None:
            return None
        return {v["name"]: v["weight"] for v in json.loads(text)["versions"]}

    def endpoints(self, model: str) -> dict[str, str]:
        text = self.data().get(model)
        return {v["name"]: v["endpoint"] for v in json.loads(text)["versions"]} if text else {}

    def resource_version(self) -> str:
        return str((self.configmap() or {})["metadata"]["resourceVersion"])


OPERATOR_RBAC_KINDS = ("ServiceAccount", "Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding")


def chart_operator_rbac(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The operator's service account and RBAC objects among the Helm chart's rendered documents."""
    return [
        doc
        for doc in docs
        if doc["kind"] in OPERATOR_RBAC_KINDS
        and (doc["metadata"].get("labels") or {}).get("app.kubernetes.io/component") == "operator"
    ]


def finalizer_holders(cluster: Cluster, namespace: str) -> list[str]:
    """The ModelVersions of ``namespace`` that carry our finalizer, as ``modelversion/<name>``."""
    result = cluster.kubectl("get", "modelversions", "-o", "json", namespace=namespace, check=False)
    if result.returncode != 0:
        return []
    return [
        f"modelversion/{item['metadata']['name']}"
        for item in json.loads(result.stdout)["items"]
        if FINALIZER in (item["metadata"].get("finalizers") or [])
    ]


def get(cluster: Cluster, namespace: str, *what: str) -> dict[str, Any]:
    doc: dict[str, Any] = cluster.kubectl_json("get", *what, namespace=namespace)
    return doc


def maybe(cluster: Cluster, namespace: str, *what: str) -> dict[str, Any] | None:
    return get(cluster, namespace, *what) if cluster.exists(*what, namespace=namespace) else None


def condition(body: dict[str, Any], kind: str) -> tuple[str, str]:
    for cond in (body.get("status") or {}).get("conditions") or []:
        if cond["type"] == kind:
            return cond["status"], cond["reason"]
    return "", ""


def containers(deployment: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Every container of the pod template by name, the model's native-sidecar one included."""
    pod = deployment["spec"]["template"]["spec"]
    return {c["name"]: c for c in (*pod.get("initContainers", []), *pod["containers"])}


def warning_reasons(cluster: Cluster, namespace: str, name: str) -> list[str]:
    """The reasons of the Warning events about the ModelVersion ``name`` (not about the
    Deployment or Service of the same name)."""
    selector = f"involvedObject.kind=ModelVersion,involvedObject.name={name},type=Warning"
    events = cluster.kubectl_json(
        "get", "events", f"--field-selector={selector}", namespace=namespace
    )["items"]
    return [str(e["reason"]) for e in events]


def patch_mv(cluster: Cluster, namespace: str, name: str, patch: dict[str, Any]) -> None:
    cluster.kubectl(
        "patch", "mv", name, "--type=merge", "-p", json.dumps(patch), namespace=namespace
    )


def conditions(body: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in (body.get("status") or {}).get("conditions") or []}


def httproute(name: str, model: str | None = "sentiment") -> dict[str, Any]:
    """A route as a user writes it: their Gateway, another app's rule, and the model's rule
    with a filter of its own and no backends yet."""
    return {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "HTTPRoute",
        "metadata": {"name": name, "labels": {"modelroll.io/model": model} if model else {}},
        "spec": {
            "parentRefs": PARENTS,
            "hostnames": ["models.example.com"],
            "rules": [
                OTHER_RULE,
                {
                    "name": "sentiment",
                    "matches": [{"path": {"type": "PathPrefix", "value": "/v1/models/sentiment"}}],
                    "filters": [
                        {
                            "type": "URLRewrite",
                            "urlRewrite": {
                                "path": {"type": "ReplaceFullPath", "replaceFullPath": "/v1/infer"}
                            },
                        }
                    ],
                },
            ],
        },
    }


def model_refs(cluster: Cluster, namespace: str, name: str = "models") -> list[dict[str, Any]]:
    (rule,) = [
        r
        for r in route_of(cluster, namespace, name)["spec"]["rules"]
        if r.get("name") == "sentiment"
    ]
    refs: list[dict[str, Any]] = rule.get("backendRefs") or []
    return refs


def invalid_spec(cluster: Cluster, namespace: str, name: str) -> dict[str, Any]:
    """The version's Ready condition, once it says InvalidSpec."""

    def condition() -> dict[str, Any] | None:
        body = cluster.kubectl_json("get", "mv", name, namespace=namespace)
        for c in (body.get("status") or {}).get("conditions") or []:
            if c["type"] == "Ready" and c["reason"] == "InvalidSpec":
                return dict(c)
        return None

    found: dict[str, Any] = eventually(condition, f"{name} Ready=False, InvalidSpec")
    return found


OTHER_RULE = {
    "name": "other",
    "matches": [{"path": {"type": "PathPrefix", "value": "/other"}}],
    "backendRefs": [{"group": "", "kind": "Service", "name": "other", "port": 80, "weight": 1}],
}


PARENTS = [{"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "edge"}]


def route_of(cluster: Cluster, namespace: str, name: str = "models") -> dict[str, Any]:
    route: dict[str, Any] = cluster.kubectl_json("get", "httproute", name, namespace=namespace)
    return route
