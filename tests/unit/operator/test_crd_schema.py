"""crds/modelversion.yaml: the contract DESIGN.md names, and a description on every field."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

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
    assert default == ["Model", "Weight", "Share", "Ready", "Age"]
    assert wide == ["Routed", "Replicas", "Endpoint"]
