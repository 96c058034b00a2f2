"""crds/modelversion.yaml, parsed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

CRD = Path(__file__).resolve().parents[2] / "crds" / "modelversion.yaml"


def load() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(CRD.read_text())
    return doc
