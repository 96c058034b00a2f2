"""crds/modelversion.yaml: the contract docs/design.md names, and a description on every field."""

from __future__ import annotations

from typing import Any

import pytest

from modelroll_common.settings import BATCHING_CHOICES
from modelroll_sidecar.config import SidecarConfig
from tests.support.crd import load


def walk(schema: dict[str, Any], path: str) -> list[str]:
    """Paths of the fields under ``schema`` that have no description."""
    missing = [] if schema.get("description") else [path]
    for name, child in (schema.get("properties") or {}).items():
        if path == "" and name == "metadata":
            continue  # the API server's own ObjectMeta
        missing += walk(child, f"{path}.{name}")
    if "items" in schema:
        missing += walk(schema["items"], f"{path}[]")
    extra = schema.get("additionalProperties")
    if isinstance(extra, dict) and "properties" in extra:
        missing += walk(extra, f"{path}.*")
    return missing


def test_the_crd_has_the_names_in_the_design() -> None:
    spec = load()["spec"]
    assert spec["group"] == "modelroll.io"
    assert spec["scope"] == "Namespaced"
    assert spec["names"]["plural"] == "modelversions"
    assert spec["names"]["shortNames"] == ["mv"]
    assert spec["names"]["categories"] == ["modelroll"]
    (version,) = spec["versions"]
    assert version["name"] == "v1alpha1"
    assert version["subresources"]["scale"]["specReplicasPath"] == ".spec.replicas"
    assert "status" in version["subresources"]


def test_every_field_has_a_description_for_kubectl_explain() -> None:
    (version,) = load()["spec"]["versions"]
    assert walk(version["schema"]["openAPIV3Schema"], "") == []


PASSED_THROUGH = {
    "spec.server.env[].valueFrom",
    "spec.server.envFrom[]",
    "spec.server.startupProbe",
    "spec.server.readinessProbe",
    "spec.server.livenessProbe",
    "spec.server.securityContext",
    "spec.server.topologySpreadConstraints[]",
    "spec.server.volumes[]",
    "spec.server.initContainers[]",
    "spec.server.tolerations[]",
    "spec.server.affinity",
}
"""The Kubernetes objects spec.server passes into the pod as given (a volume, a probe, an init
container...): the API server checks them when the operator applies the Deployment, so the CRD
keeps their fields instead of repeating the whole pod schema (docs/design.md, "Managed pods")."""


def unknown_fields_kept(schema: dict[str, Any], path: str = "") -> set[str]:
    """The paths under ``schema`` whose unknown fields the API server keeps."""
    found = {path.lstrip(".")} if schema.get("x-kubernetes-preserve-unknown-fields") else set()
    for name, child in (schema.get("properties") or {}).items():
        found |= unknown_fields_kept(child, f"{path}.{name}")
    if isinstance(schema.get("items"), dict):
        found |= unknown_fields_kept(schema["items"], f"{path}[]")
    return found


def test_unknown_fields_are_pruned_except_in_the_pod_objects_passed_through() -> None:
    """Anything else a spec or status holds that the CRD does not declare is dropped by the API
    server (a typo such as spec.batching.maxBatchsize does not linger unnoticed)."""
    (version,) = load()["spec"]["versions"]
    kept = unknown_fields_kept(version["schema"]["openAPIV3Schema"])
    assert kept == PASSED_THROUGH


def test_printer_columns_are_the_documented_ones_with_extras_for_wide() -> None:
    (version,) = load()["spec"]["versions"]
    columns = version["additionalPrinterColumns"]
    default = [c["name"] for c in columns if not c.get("priority")]
    wide = [c["name"] for c in columns if c.get("priority") == 1]
    assert default == ["Model", "Weight", "Ready", "Routed", "Analysis", "Step", "Capacity", "Age"]
    assert wide == ["Replicas", "Endpoint", "Message"]
    # `kubectl get mv -o wide` says why a version is not Ready (as cert-manager's Certificates do).
    (message,) = [c for c in columns if c["name"] == "Message"]
    assert message["jsonPath"] == '.status.conditions[?(@.type=="Ready")].message'


def test_kubectl_explain_says_what_each_batching_choice_does() -> None:
    """spec.batching's enum fields (written from BATCHING_CHOICES by make generate): the
    description of each names every value it takes."""
    (version,) = load()["spec"]["versions"]
    fields = version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["batching"]
    for c in BATCHING_CHOICES:
        field = fields["properties"][c.key]
        described = " ".join(field["description"].split())
        for value in c.values:
            assert f"{value}:" in described or f"{value} (the default):" in described, value


def test_the_rule_on_max_wait_and_timeout_is_the_sidecars() -> None:
    """The CRD refuses maxWaitMs above timeoutMs, which the sidecar refuses at start (a CR
    with it would crash-loop its pods)."""
    (version,) = load()["spec"]["versions"]
    batching = version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["batching"]
    rules = [r["rule"] for r in batching["x-kubernetes-validations"]]
    assert any("self.maxWaitMs <= self.timeoutMs" in r for r in rules)
    with pytest.raises(ValueError, match=r"--max-wait-ms \(500\) must not exceed --timeout-ms"):
        SidecarConfig(max_wait_ms=500, timeout_ms=100)
