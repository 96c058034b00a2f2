"""What Pod Security "baseline" forbids in spec.server, against the real API server: the operator
refuses such a version by name and applies nothing (unless started with
--pod-security=privileged), and the chart's ValidatingAdmissionPolicy makes `kubectl apply` of it
fail with the operator's own message, while a normal version, and an update of an older version
that leaves spec.server alone, pass.
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import yaml

from modelroll_devcluster import Cluster
from modelroll_operator.pod_security import RULES, Allowed, Each, KeysStarting, Segment, violations
from tests.support import chart
from tests.support.apiserver import StartOperator, eventually, invalid_spec, model_version
from tests.support.chart import EXAMPLES

pytestmark = pytest.mark.integration

helm = chart.helm
"""helm from .bin/ with its own home directories (the chart tests' fixture)."""

IMAGE = "ghcr.io/acme/solo:1"
PRIVILEGED = {"image": IMAGE, "securityContext": {"privileged": True}}
HOST_PATH = {
    "image": IMAGE,
    "volumes": [{"name": "cache", "emptyDir": {}}, {"name": "node", "hostPath": {"path": "/"}}],
    "volumeMounts": [{"name": "node", "mountPath": "/host"}],
}
HOST_IPC = {"image": IMAGE, "hostIPC": True}
FORBIDDEN = {
    "privileged": (
        PRIVILEGED,
        'spec.server.securityContext.privileged must be false (Pod Security "baseline": '
        "Privileged Containers)",
    ),
    "host-path": (
        HOST_PATH,
        'spec.server.volumes[1].hostPath must not be set (Pod Security "baseline": '
        "HostPath Volumes)",
    ),
    "host-ipc": (
        HOST_IPC,
        'spec.server.hostIPC must be false (Pod Security "baseline": Host Namespaces)',
    ),
}
"""Versions whose pod would reach the node, and what refuses each."""


def applied_pod(cluster: Cluster, namespace: str, name: str) -> dict[str, Any]:
    """The pod template of the version's Deployment, once the operator has applied it."""
    deployment = eventually(
        lambda: (
            cluster.exists("deploy", name, namespace=namespace)
            and cluster.kubectl_json("get", "deploy", name, namespace=namespace)
        ),
        f"{name}'s Deployment",
    )
    pod: dict[str, Any] = deployment["spec"]["template"]["spec"]
    return pod


def test_the_operator_refuses_what_baseline_forbids_unless_started_privileged(
    cluster: Cluster, namespace: str, start_operator: StartOperator
) -> None:
    operator = start_operator()
    cluster.apply(model_version("plain", "plain", weight=1, server={"image": IMAGE}), namespace)
    for name, (server, _) in FORBIDDEN.items():
        cluster.apply(model_version(name, name, weight=1, server=server), namespace)
    for name, (_, says) in FORBIDDEN.items():
        condition = invalid_spec(cluster, namespace, name)
        assert condition["message"].startswith(says), condition["message"]
        assert "--pod-security=baseline" in condition["message"]
    applied_pod(cluster, namespace, "plain")
    for name in FORBIDDEN:
        assert not cluster.exists("deploy", name, namespace=namespace), name
        assert not cluster.exists("service", name, namespace=namespace), name
    operator.stop()

    start_operator("--pod-security=privileged")
    assert applied_pod(cluster, namespace, "host-ipc")["hostIPC"] is True
    volumes = applied_pod(cluster, namespace, "host-path")["volumes"]
    assert {"name": "node", "hostPath": {"path": "/", "type": ""}} in volumes
    model = applied_pod(cluster, namespace, "privileged")["initContainers"][-1]
    assert model["securityContext"]["privileged"] is True


# -- the chart's admission policy --------------------------------------------------------------

InstallPolicy = Callable[[], dict[str, Any]]
"""``admission_policy()``: install the policy; the policy as the API server holds it."""


@pytest.fixture
def admission_policy(
    helm: chart.Helm, cluster: Cluster, namespace: str, crd: None
) -> Iterator[InstallPolicy]:
    """Installs the chart's ValidatingAdmissionPolicy and its binding, rendered by helm for an
    operator that watches only the test's namespace (so no other test meets it), as they are.
    Returns once the API server has type-checked the expressions and refuses by them."""
    docs = helm.template(
        "--set", f"operator.watchNamespaces={{{namespace}}}", release=f"mr-{secrets.token_hex(3)}"
    )
    policy = [d for d in docs if d["kind"].startswith("ValidatingAdmissionPolicy")]
    assert sorted(d["kind"] for d in policy) == [
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    ]
    name = policy[0]["metadata"]["name"]

    def install() -> dict[str, Any]:
        cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(policy))
        held = eventually(lambda: checked(cluster, name), "the policy's expressions type-checked")
        eventually(lambda: refuses(cluster, namespace), "the policy in force")
        return held

    yield install
    for doc in policy:
        cluster.kubectl("delete", doc["kind"], doc["metadata"]["name"], "--ignore-not-found")


def checked(cluster: Cluster, name: str) -> dict[str, Any] | None:
    """The policy, once the API server has type-checked its current generation."""
    body: dict[str, Any] = cluster.kubectl_json("get", "validatingadmissionpolicy", name)
    status = body.get("status") or {}
    return body if status.get("observedGeneration") == body["metadata"]["generation"] else None


def apply_all(
    cluster: Cluster, namespace: str, docs: list[dict[str, Any]], *flags: str
) -> dict[str, str]:
    """``kubectl apply`` of several ModelVersions at once: by name, each one's refusal, or ``""``
    for one the API server took."""
    items = {"apiVersion": "v1", "kind": "List", "items": docs}
    result = cluster.kubectl(
        "apply", *flags, "-f", "-", namespace=namespace, input=json.dumps(items), check=False
    )
    refused = {
        match["name"]: match["message"]
        for match in re.finditer(
            r'"(?P<name>[^"]+)" is (?:forbidden|invalid: ): '
            r"ValidatingAdmissionPolicy '[^']+' with binding '[^']+' denied request: "
            r"(?P<message>.*)",
            result.stderr,
        )
    }
    taken = re.findall(r"modelversion\.modelroll\.io/(\S+) (?:created|configured)", result.stdout)
    names = [d["metadata"]["name"] for d in docs]
    assert sorted([*refused, *taken]) == sorted(names), f"{result.stdout}\n{result.stderr}"
    return {**refused, **dict.fromkeys(taken, "")}


def refuses(cluster: Cluster, namespace: str) -> bool:
    """Whether a privileged version is refused (a dry run: nothing is stored)."""
    privileged = model_version("probe", "probe", server=PRIVILEGED)
    return bool(apply_all(cluster, namespace, [privileged], "--dry-run=server")["probe"])


def test_kubectl_apply_of_what_baseline_forbids_fails_and_a_normal_version_passes(
    cluster: Cluster, namespace: str, admission_policy: InstallPolicy
) -> None:
    held = admission_policy()
    warnings = held["status"]["typeChecking"].get("expressionWarnings") or []
    assert not warnings, "\n".join(f"{w['fieldRef']}: {w['warning']}" for w in warnings)
    docs = [
        model_version(name, name, weight=1, server=server)
        for name, (server, _) in FORBIDDEN.items()
    ]
    assert apply_all(cluster, namespace, docs) == {
        name: says for name, (_, says) in FORBIDDEN.items()
    }
    for name in FORBIDDEN:
        assert not cluster.exists("mv", name, namespace=namespace)
    normal = cluster.kubectl("apply", "-f", str(EXAMPLES / "managed"), namespace=namespace)
    assert "sentiment-canary created" in normal.stdout
    assert "sentiment-stable created" in normal.stdout


def test_an_update_is_judged_only_when_it_changes_spec_server(
    cluster: Cluster, namespace: str, admission_policy: InstallPolicy
) -> None:
    """A version stored before the policy can still be promoted or rolled back (its weight),
    labelled and deleted; a change of its spec.server must leave nothing baseline forbids."""
    cluster.apply(model_version("older", "older", weight=1, server=PRIVILEGED), namespace)
    admission_policy()

    def patch(change: dict[str, Any]) -> Any:
        args = ("patch", "mv", "older", "--type=merge", "-p", json.dumps(change))
        return cluster.kubectl(*args, namespace=namespace, check=False)

    assert patch({"spec": {"weight": 0}}).returncode == 0
    assert patch({"metadata": {"labels": {"team": "search"}}}).returncode == 0
    refused = patch({"spec": {"server": {"image": "ghcr.io/acme/solo:2"}}})
    assert refused.returncode != 0
    assert FORBIDDEN["privileged"][1] in refused.stderr
    fixed = patch({"spec": {"server": {"securityContext": {"privileged": False}}}})
    assert fixed.returncode == 0, fixed.stderr
    cluster.kubectl("delete", "mv", "older", namespace=namespace)


def json_documents(text: str) -> Iterator[dict[str, Any]]:
    """The JSON objects kubectl prints one after the other (``-o json`` of several objects)."""
    decoder, at = json.JSONDecoder(), 0
    while text[at:].strip():
        document, end = decoder.raw_decode(text, text.index("{", at))
        yield document
        at = end


ITEMS: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "initContainers": ({"name": "fetch", "image": IMAGE}, {"name": "prepare", "image": IMAGE}),
    "volumes": ({"name": "cache", "emptyDir": {}}, {"name": "data"}),
    "ports": ({"containerPort": 9100}, {"containerPort": 9101}),
}
"""For a list the rules look into: an item that passes, and the base of the one at fault."""


def bad(allowed: Allowed) -> object:
    """A value ``allowed`` refuses, of the type it expects."""
    if not allowed.values:
        return {"path": "/"}
    first = allowed.values[0]
    if isinstance(first, bool):
        return not first
    return 8080 if isinstance(first, int) else "Unconfined"


def at_fault(path: tuple[Segment, ...], allowed: Allowed, field: str = "") -> Any:
    """The fields of spec.server (from ``path`` down) with one value at fault at ``path``: the
    second item of a list, beside one that passes."""
    if not path:
        return bad(allowed)
    head, rest = path[0], path[1:]
    if isinstance(head, Each):
        if not rest:
            return [allowed.values[0], bad(allowed)]
        passing, base = ITEMS[field]
        return [passing, {**base, **at_fault(rest, allowed)}]
    if isinstance(head, KeysStarting):
        return {"note": "kept", f"{head.prefix}model": at_fault(rest, allowed)}
    return {head: at_fault(rest, allowed, head)}


def test_every_rule_refuses_at_kubectl_apply_as_the_operator_does(
    cluster: Cluster, namespace: str, admission_policy: InstallPolicy
) -> None:
    """Each rule of the table at each of its places, one field at fault, as the operator reads
    the version the API server stores. kubectl's field validation is off, as anyone may turn it
    off: a field the CRD does not declare at a place (the model container's ports) is then
    pruned, and nothing is left to refuse."""
    docs = [
        model_version(
            f"rule-{i}", "rules", server={"image": IMAGE, **at_fault(p.path, p.rule.allowed)}
        )
        for i, p in enumerate(RULES)
    ]
    create = ("create", "--dry-run=server", "--validate=false", "-o", "json", "-f", "-")
    listed = json.dumps({"apiVersion": "v1", "kind": "List", "items": docs})
    stored = cluster.kubectl(*create, namespace=namespace, input=listed)
    servers = {
        item["metadata"]["name"]: item["spec"]["server"] for item in json_documents(stored.stdout)
    }
    expected = {name: next(iter(violations(server)), "") for name, server in servers.items()}
    # Nothing to refuse only where the CRD pruned the field at fault.
    for i, placed in enumerate(RULES):
        assert bool(expected[f"rule-{i}"]) == (placed.path[0] in servers[f"rule-{i}"]), placed
    admission_policy()
    assert apply_all(cluster, namespace, docs, "--dry-run=server", "--validate=false") == expected
