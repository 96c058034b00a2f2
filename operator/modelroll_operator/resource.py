"""The ModelVersion CRD, assembled from the declarations: the spec's (spec.py and
analysis/spec.py), the status's (here, and analysis/state.py's status.analysis), and here the
names, printer columns and the rules on the whole object. ``make generate`` (hack/generate.py)
writes it to crds/modelversion.yaml and the chart's copy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .analysis import spec as analysis_spec
from .analysis import state as analysis_state
from .capacity import CapacityStatus
from .condition import Condition
from .schema import Json, Rule, api, schema_of
from .spec import GROUP, KIND, PLURAL, VERSION, ModelVersionSpec


@dataclass(frozen=True)
class VersionStatus:
    """status: what the operator observed of the version."""

    observed_generation: int | None = api(
        "The metadata.generation this status was computed from.", default=None, format="int64"
    )
    routed_weight: int | None = api(
        "The weight the model's route in force gives this version; absent when it is not in "
        "the route. Its share of the model's traffic is this weight over the sum of the routed "
        "weights of the model's versions (`kubectl modelroll status` shows it).",
        default=None,
        format="",
        minimum=0,
    )
    endpoint: str | None = api(
        "The URL the gateway sends this version's requests to.", default=None
    )
    http_route: str | None = api(
        "The HTTPRoute that routes the version's model, when one claims it (labelled "
        "modelroll.io/model); its acceptance by its parents is the HTTPRouteAccepted condition.",
        default=None,
    )
    replicas: int | None = api("Managed mode, pods of the version's Deployment.", default=None)
    ready_replicas: int | None = api(
        "Managed mode, ready pods of the version's Deployment.", default=None
    )
    capacity: CapacityStatus | None = api(
        "Managed mode: the replicas the operator keeps the version at, at least, for its share "
        "of the model's traffic (the Capacity condition says why). Absent: spec.replicas.",
        default=None,
    )
    selector: str | None = api(
        "Managed mode, the label selector of the version's pods (for the scale subresource and "
        "autoscalers).",
        default=None,
    )
    conditions: tuple[Condition, ...] = api(
        "Ready says whether the version can serve; Routed whether the gateway sends it traffic; "
        "Capacity (managed mode) whether it has the replicas its share of the model's traffic "
        "needs, and Autoscaling (spec.scaling) whether its autoscaler is in place. A canary "
        "(spec.analysis) also has Progressing, AnalysisHealthy, Promoted and RolledBack.",
        default=(),
        extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )


DESCRIPTION = (
    "A ModelVersion is one version of a model that the modelroll gateway can route to. Its "
    "weight, relative to the other Ready versions of the same model, decides its share of the "
    "model's traffic. In managed mode (spec.server) the operator runs the model with a batching "
    "sidecar as a Deployment and Service; in external mode (spec.endpoint) it only routes to "
    "the given URL."
)
SPEC_DESCRIPTION = (
    "The desired state: which model, how much traffic, and where the version runs. Exactly one "
    "of server (managed mode) and endpoint (external mode) is set."
)
STATUS_DESCRIPTION = "The observed state, written by the modelroll operator."
ROOT_RULES = (
    Rule(
        "!has(self.spec.server) || self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$') "
        "&& self.metadata.name.size() <= 63",
        "a managed ModelVersion (spec.server) names its Deployment and Service, so its name "
        "must be a DNS-1035 label: at most 63 lowercase letters, digits and '-', starting with "
        "a letter",
        ".metadata.name",
    ),
)


def _column(name: str, kind: str, path: str, description: str = "", priority: int = 0) -> Json:
    column: Json = {"name": name, "type": kind}
    column |= {"priority": priority} if priority else {}
    column["jsonPath"] = path
    return column | ({"description": description} if description else {})


PRINTER_COLUMNS = [
    _column("Model", "string", ".spec.model", "The model this version belongs to."),
    _column(
        "Weight", "integer", ".spec.weight", "Relative routing weight among the model's versions."
    ),
    _column(
        "Ready",
        "string",
        '.status.conditions[?(@.type=="Ready")].status',
        "Whether the version can serve traffic.",
    ),
    _column(
        "Routed",
        "string",
        '.status.conditions[?(@.type=="Routed")].reason',
        "Why the version is (or is not) in the model's routes.",
    ),
    _column(
        "Analysis",
        "string",
        ".status.analysis.phase",
        "A canary's analysis phase (spec.analysis).",
    ),
    _column("Step", "integer", ".status.analysis.step", "A canary's current step (1-based)."),
    _column(
        "Capacity",
        "string",
        '.status.conditions[?(@.type=="Capacity")].reason',
        "Whether the version has the replicas its share needs (managed mode).",
    ),
    _column("Age", "date", ".metadata.creationTimestamp"),
    _column(
        "Replicas",
        "string",
        ".status.readyReplicas",
        "Ready replicas of the version's Deployment (managed mode).",
        priority=1,
    ),
    _column(
        "Endpoint",
        "string",
        ".status.endpoint",
        "Where the gateway sends this version's requests.",
        priority=1,
    ),
    _column(
        "Message",
        "string",
        '.status.conditions[?(@.type=="Ready")].message',
        "Why the version is (or is not) Ready.",
        priority=1,
    ),
]


def openapi_schema() -> Json:
    """The whole object's schema."""
    spec = schema_of(ModelVersionSpec, SPEC_DESCRIPTION, "spec")
    spec["properties"]["analysis"] = schema_of(
        analysis_spec.AnalysisSpec, analysis_spec.DESCRIPTION, "spec.analysis"
    )
    status = schema_of(VersionStatus, STATUS_DESCRIPTION, "status")
    status["properties"]["analysis"] = analysis_state.status_schema()
    return {
        "type": "object",
        "description": DESCRIPTION,
        "required": ["spec"],
        "properties": {
            "apiVersion": {
                "type": "string",
                "description": "APIVersion defines the versioned schema of this representation "
                "of an object.",
            },
            "kind": {
                "type": "string",
                "description": "Kind is a string value representing the REST resource this "
                "object represents.",
            },
            "metadata": {"type": "object", "properties": {"name": {"type": "string"}}},
            "spec": spec,
            "status": status,
        },
        "x-kubernetes-validations": [rule.to_json("") for rule in ROOT_RULES],
    }


def definition() -> dict[str, Any]:
    """The CustomResourceDefinition."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{PLURAL}.{GROUP}",
            "labels": {
                "app.kubernetes.io/name": "modelroll",
                "app.kubernetes.io/part-of": "modelroll",
            },
        },
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": KIND,
                "listKind": f"{KIND}List",
                "plural": PLURAL,
                "singular": KIND.lower(),
                "shortNames": ["mv"],
                "categories": ["modelroll"],
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {
                        "status": {},
                        "scale": {
                            "specReplicasPath": ".spec.replicas",
                            "statusReplicasPath": ".status.replicas",
                            "labelSelectorPath": ".status.selector",
                        },
                    },
                    "additionalPrinterColumns": PRINTER_COLUMNS,
                    "schema": {"openAPIV3Schema": openapi_schema()},
                }
            ],
        },
    }
