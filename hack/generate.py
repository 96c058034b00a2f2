"""``make generate``: the files written from modelroll's declarations. ``--check`` (part of
``make lint``) writes nothing and fails, naming them, when any would change.

- ``crds/modelversion.yaml``: the fields that ``modelroll_common.settings`` declares
  (spec.batching, spec.protocol and the integer fields of spec.sidecar) are written from it:
  type, default, bounds, enum and description. So are the latency checks of
  spec.analysis.checks (:data:`LATENCY_CHECKS`), which share their fields, the stream
  histograms and the shadow agreement of every counters object in status.analysis, and the
  default of spec.analysis.metrics.gateway.port, the gateway's admin port. The rest
  of the schema is edited in the file and only laid out again here, so every edit ends in the
  same layout.
- ``charts/modelroll/crds/modelversion.yaml``: the same CRD, which the chart ships.
- ``charts/modelroll/dashboards/modelroll.json``: the Grafana dashboard the chart ships, from
  ``hack/dashboard.py``.
- ``charts/modelroll/admission/pod-security.yaml``: the CEL validations of the chart's
  ValidatingAdmissionPolicy, from the Pod Security rules of
  ``modelroll_operator.pod_security``, and their table in ``docs/design.md``
  (``hack/admission.py``).
- the settings' tables in ``docs/design.md`` (the ModelVersion fields) and ``sidecar/README.md``
  (the flags they become), and the tables of ``spec.analysis`` and ``status.analysis`` in
  ``docs/design.md``, from ``hack/reference.py``.

Run from the checkout's root with the project's virtualenv: ``.venv/bin/python hack/generate.py``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import admission  # hack/admission.py, beside this script
import dashboard  # hack/dashboard.py, likewise
import reference  # hack/reference.py, likewise
import yaml

from modelroll_common.metric_names import GATEWAY_ADMIN_PORT
from modelroll_common.settings import (
    BATCHING_CHOICES,
    BATCHING_SETTINGS,
    PROTOCOL,
    SIDECAR_SETTINGS,
    Choice,
    Setting,
)

ROOT = Path(__file__).resolve().parents[1]
CRD = ROOT / "crds" / "modelversion.yaml"
CHART_CRD = ROOT / "charts" / "modelroll" / "crds" / "modelversion.yaml"
DASHBOARD = ROOT / "charts" / "modelroll" / "dashboards" / "modelroll.json"
CRD_HEADER = """\
# The ModelVersion CRD: one object per version of a model. The modelroll operator writes every
# Ready version's weight into the namespace's `modelroll-routes` ConfigMap; the gateway splits
# traffic by those weights. Edit the schema here, except the fields of
# common/modelroll_common/settings.py, and run `make generate`: it writes those fields, this
# file's layout and the Helm chart's copy.
"""
CHART_HEADER = """\
# Written by `make generate` from crds/modelversion.yaml: edit that file, not this one.
"""
WIDTH = 96
"""Where folded descriptions and CEL rules wrap."""


def integer(setting: Setting, defaulted: bool) -> dict[str, Any]:
    """A Setting's schema; with ``defaulted`` the API server fills in its default."""
    default = setting.shown_default or str(setting.default)
    bounds = f"From {setting.low} to {setting.high}" + ("" if defaulted else f"; default {default}")
    schema: dict[str, Any] = {
        "type": "integer",
        "description": f"{setting.description} {bounds}.",
        "format": "int32",
    }
    if defaulted:
        schema["default"] = setting.default
    return schema | {"minimum": setting.low, "maximum": setting.high}


def choice(setting: Choice) -> dict[str, Any]:
    return {
        "type": "string",
        "description": setting.description,
        "enum": list(setting.values),
        "default": setting.default,
    }


LATENCY_CHECKS = {
    "latency": "The share of the canary's requests slower than the baseline's latency quantile, "
    "against the baseline's own share, in the same window (from the gateway's latency histogram).",
    "timeToFirstToken": "For generation streams (an OpenAI version's): the share of the canary's "
    "streams whose first token came later than the baseline's quantile of time to first token, "
    "against the baseline's own share, in the same window (from the gateway's histogram of the "
    "streams it routed by weight). A step passes only once both versions have streamed.",
    "timePerOutputToken": "For generation streams (an OpenAI version's): the share of the "
    "canary's streams slower per output token (first token to last, over the tokens after the "
    "first) than the baseline's quantile, against the baseline's own share, in the same window "
    "(from the gateway's histogram). A step passes only once both versions have streamed.",
}
"""The checks of spec.analysis.checks that compare a latency histogram, with what each judges."""


def latency_check(name: str, description: str) -> dict[str, Any]:
    where = f"spec.analysis.checks.{name}"
    return {
        "type": "object",
        "description": description,
        "properties": {
            "quantile": {
                "type": "number",
                "description": "The baseline's value at this quantile is the bound, read from its "
                "counts of the step before each judged interval (default 0.95).",
                "default": 0.95,
                "x-kubernetes-validations": [
                    {
                        "rule": "self >= 0.5 && self < 1.0",
                        "message": f"{where}.quantile must be within 0.5..1 (1 excluded)",
                    }
                ],
            },
            "maxRatio": {
                "type": "number",
                "description": "The canary fails when its share of slow requests is, with "
                "decisive evidence, above maxRatio times the baseline's (default 1.5).",
                "default": 1.5,
                "x-kubernetes-validations": [
                    {
                        "rule": "self >= 1.0 && self <= 100.0",
                        "message": f"{where}.maxRatio must be within 1..100",
                    }
                ],
            },
            "dryRun": {
                "type": "boolean",
                "description": "Report this check's verdict, never act on it.",
                "default": False,
            },
        },
    }


STREAM_HISTOGRAMS = {
    "ttftBuckets": "modelroll_gateway_llm_time_to_first_token_seconds",
    "tpotBuckets": "modelroll_gateway_llm_time_per_output_token_seconds",
}
"""The histograms of the streams routed by weight that a counters object in status.analysis
holds while a stream check judges them, by field."""


def stream_histogram(metric: str) -> dict[str, Any]:
    return {
        "type": "array",
        "description": f"The streams routed by weight ({metric}): cumulative counts by upper "
        "bound; only while a stream check judges them.",
        "maxItems": 100,
        "items": {
            "type": "object",
            "description": "One bucket.",
            "properties": {
                "le": {
                    "type": "string",
                    "description": "The bucket's upper bound in seconds (+Inf for the last).",
                    "maxLength": 32,
                },
                "count": {"type": "number", "description": "Streams at most this slow."},
            },
        },
    }


def agreement() -> dict[str, Any]:
    """The agreement in each counters object of status.analysis (the canary's, in practice)."""
    return {
        "type": "object",
        "description": "The canary's shadow copies compared with the baseline's answers "
        "(modelroll_gateway_shadow_agreement): only while a shadow gate judges them.",
        "properties": {
            "sum": {"type": "number", "description": "The agreement of the copies, summed."},
            "count": {"type": "number", "description": "The copies compared."},
        },
    }


def with_stream_histograms(analysis: dict[str, Any]) -> None:
    """The stream histograms and the shadow agreement in each counters object of
    ``status.analysis``."""
    tallies = [
        analysis["sources"]["items"],
        analysis["stepCounts"],
        analysis["window"],
    ]
    for tally in tallies:
        for arm in ("canary", "baseline"):
            counters = tally["properties"][arm]["properties"]
            for field, metric in STREAM_HISTOGRAMS.items():
                counters[field] = stream_histogram(metric)
            counters["agreement"] = agreement()


def gateway_port() -> dict[str, Any]:
    """spec.analysis.metrics.gateway.port: where the gateway serves /metrics by default."""
    return {
        "type": "integer",
        "description": "The gateway pods' admin port, where they serve /metrics "
        f"(default {GATEWAY_ADMIN_PORT}, the gateway's --admin-port).",
        "format": "int32",
        "default": GATEWAY_ADMIN_PORT,
        "minimum": 1,
        "maximum": 65535,
    }


def with_settings(crd: dict[str, Any]) -> dict[str, Any]:
    """``crd`` with the declared fields written in place (a new one goes last)."""
    (version,) = crd["spec"]["versions"]
    spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    checks = spec["analysis"]["properties"]["checks"]["properties"]
    guardrail = checks.pop("guardrail")
    for name, description in LATENCY_CHECKS.items():
        checks[name] = latency_check(name, description)
    checks["guardrail"] = guardrail
    metrics = spec["analysis"]["properties"]["metrics"]["properties"]
    metrics["gateway"]["properties"]["port"] = gateway_port()
    status = version["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]
    with_stream_histograms(status["analysis"]["properties"])
    batching = spec["batching"]["properties"]
    for setting in BATCHING_SETTINGS:
        batching[setting.key] = integer(setting, defaulted=True)
    for option in BATCHING_CHOICES:
        batching[option.key] = choice(option)
    sidecar = spec["sidecar"]["properties"]
    for setting in SIDECAR_SETTINGS:
        sidecar[setting.key] = integer(setting, defaulted=False)
    spec[PROTOCOL.key] = choice(PROTOCOL)
    return crd


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
    crd = with_settings(yaml.safe_load(CRD.read_text()))
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
        admission.VALIDATIONS: admission.HEADER + dump(admission.validations(crd)),
        **documents,
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
