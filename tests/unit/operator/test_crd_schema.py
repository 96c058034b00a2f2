"""crds/modelversion.yaml: the contract docs/design.md names, and a description on every field."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from modelroll_operator.spec import BATCHING_SETTINGS, SIDECAR_SETTINGS
from modelroll_sidecar.config import SidecarConfig

CRD = Path(__file__).resolve().parents[3] / "crds" / "modelversion.yaml"


def load() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(CRD.read_text())
    return doc


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


def test_spec_keeps_unknown_fields_out() -> None:
    (version,) = load()["spec"]["versions"]
    text = yaml.safe_dump(version["schema"])
    assert "x-kubernetes-preserve-unknown-fields" not in text


def test_printer_columns_are_the_documented_ones_with_extras_for_wide() -> None:
    (version,) = load()["spec"]["versions"]
    columns = version["additionalPrinterColumns"]
    default = [c["name"] for c in columns if not c.get("priority")]
    wide = [c["name"] for c in columns if c.get("priority") == 1]
    assert default == ["Model", "Weight", "Share", "Ready", "Analysis", "Step", "Age"]
    assert wide == ["Routed", "Replicas", "Endpoint"]


def test_the_crd_bounds_and_defaults_of_sidecar_settings_are_the_operators() -> None:
    """spec.batching and spec.sidecar: each field's minimum, maximum and default in the CRD are
    the ones the operator checks and the sidecar uses (one table: spec.BATCHING_SETTINGS and
    spec.SIDECAR_SETTINGS)."""
    (version,) = load()["spec"]["versions"]
    spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    for block, settings, defaulted in (
        ("batching", BATCHING_SETTINGS, True),
        ("sidecar", SIDECAR_SETTINGS, False),
    ):
        fields = spec[block]["properties"]
        assert set(fields) == {s.key for s in settings}, block
        for s in settings:
            field = fields[s.key]
            assert (field["minimum"], field["maximum"]) == (s.low, s.high), s.key
            if defaulted:
                assert field["default"] == s.default, s.key
            else:  # left out, the sidecar's own default applies: the description says which
                assert "default" not in field, s.key
                default = f"{s.default}" if s.key != "drainTimeoutS" else "--drain-timeout-s"
                assert default in " ".join(field["description"].split()), s.key


def test_the_sidecars_defaults_are_the_operators() -> None:
    sidecar = SidecarConfig()
    for s in (*BATCHING_SETTINGS, *SIDECAR_SETTINGS):
        assert getattr(sidecar, s.attr) == s.default, s.key
