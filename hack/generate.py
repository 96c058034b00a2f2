"""``make generate``: the files written from modelroll's declarations. ``--check`` (part of
``make lint``) writes nothing and fails, naming them, when any would change.

- ``crds/modelversion.yaml``: the CRD, from the declarations (``modelroll_operator.resource``
  assembles them): every field of spec and status with its type, default, bounds, enum, CEL
  rules and description.
- ``charts/modelroll/crds/modelversion.yaml``: the same CRD, which the chart ships.
- ``charts/modelroll/dashboards/modelroll.json``: the Grafana dashboard the chart ships, from
  ``hack/dashboard.py``.
- ``charts/modelroll/admission/pod-security.yaml``: the CEL validations of the chart's
  ValidatingAdmissionPolicy, from the Pod Security rules of
  ``modelroll_operator.pod_security``, and their table in ``docs/design.md``
  (``hack/admission.py``).
- ``charts/modelroll/templates/_operator-rules.tpl``: the operator's RBAC rules, from the table
  of its API calls in ``modelroll_operator.permissions`` (``hack/rbac.py``).
- ``charts/modelroll/values.yaml``, ``values.schema.json`` and the values table of the chart's
  README, from the values declared in ``hack/values.py`` (``hack/values_files.py``).
- the settings' tables in ``docs/design.md`` (the ModelVersion fields) and ``sidecar/README.md``
  (the flags they become), and the tables of spec and status (``spec.analysis`` and
  ``status.analysis`` apart) in ``docs/design.md``, from ``hack/reference.py``.
- the flag tables of the commands' READMEs, from their parsers (``hack/flag_tables.py``), and
  the metric tables of ``docs/design.md`` and the components' READMEs, from the metrics they
  register (``hack/metric_tables.py``).

Run from the checkout's root with the project's virtualenv: ``.venv/bin/python hack/generate.py``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import admission  # hack/admission.py, beside this script
import dashboard  # hack/dashboard.py, likewise
import flag_tables  # hack/flag_tables.py, likewise
import metric_tables  # hack/metric_tables.py, likewise
import rbac  # hack/rbac.py, likewise
import reference  # hack/reference.py, likewise
import values_files  # hack/values_files.py, likewise
import yaml

from modelroll_operator import resource

ROOT = Path(__file__).resolve().parents[1]
CRD = ROOT / "crds" / "modelversion.yaml"
CHART_CRD = ROOT / "charts" / "modelroll" / "crds" / "modelversion.yaml"
DASHBOARD = ROOT / "charts" / "modelroll" / "dashboards" / "modelroll.json"
CRD_HEADER = """\
# The ModelVersion CRD: one object per version of a model. The modelroll operator writes every
# Ready version's weight into the namespace's `modelroll-routes` ConfigMap; the gateway splits
# traffic by those weights. Written by `make generate` from the declarations in
# operator/modelroll_operator (resource.py assembles them), with the Helm chart's copy: edit
# those, not this file.
"""
CHART_HEADER = """\
# Written by `make generate` from crds/modelversion.yaml: edit that file, not this one.
"""
WIDTH = 96
"""Where folded descriptions and CEL rules wrap."""


class _Dumper(yaml.SafeDumper):
    """Block lists indented under their key, as kubectl and Helm users write them; a schema
    used in several places written out in each (no YAML anchors)."""

    def increase_indent(self, flow: bool = False, indentless: bool = False) -> None:
        super().increase_indent(flow, False)

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _text(dumper: yaml.SafeDumper, data: str) -> yaml.Node:
    style = ">" if len(data) > WIDTH // 2 else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)


def _list(dumper: yaml.SafeDumper, data: list[Any]) -> yaml.Node:
    """A list of short words on one line (``[spec]``), anything else a block."""
    flow = all(isinstance(x, str) and len(x) < 40 for x in data) and len(str(data)) < WIDTH // 2
    return dumper.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=flow)


_Dumper.add_representer(str, _text)
_Dumper.add_representer(list, _list)


def dump(doc: dict[str, Any] | list[Any]) -> str:
    text = yaml.dump(doc, Dumper=_Dumper, sort_keys=False, width=WIDTH, allow_unicode=True)
    if yaml.safe_load(text) != doc:
        raise AssertionError("the YAML layout changed what the CRD says")
    return text


def outputs() -> dict[Path, str]:
    """Every generated file and what it should hold."""
    crd = resource.definition()
    body = dump(crd)
    documents = reference.outputs(crd)
    design = documents[reference.DESIGN]
    documents[reference.DESIGN] = reference.splice(
        design, admission.rows(crd), reference.DESIGN, admission.MARKER
    )
    return {
        CRD: CRD_HEADER + body,
        CHART_CRD: CHART_HEADER + body,
        DASHBOARD: dashboard.render(),
        rbac.RULES: rbac.render(),
        values_files.VALUES_YAML: values_files.values_yaml(),
        values_files.SCHEMA: values_files.schema(),
        values_files.README: reference.splice(
            values_files.README.read_text(),
            values_files.table_rows(),
            values_files.README,
            values_files.MARKER,
        ),
        admission.VALIDATIONS: admission.HEADER + dump(admission.validations(crd)),
        **metric_tables.outputs(flag_tables.outputs(documents)),
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="write nothing; fail if stale")
    args = parser.parse_args(argv)
    stale = [
        path for path, text in outputs().items() if not path.exists() or path.read_text() != text
    ]
    if args.check:
        for path in stale:
            print(f"{path.relative_to(ROOT)} is stale: run `make generate`", file=sys.stderr)
        return 1 if stale else 0
    for path, text in outputs().items():
        if path in stale:
            path.write_text(text)
            print(f"wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
