"""A managed version's autoscaler (spec.scaling): a KEDA ScaledObject on the ModelVersion's scale
subresource, which KEDA turns into an autoscaling/v2 HorizontalPodAutoscaler that
kube-controller-manager runs. Its metric is a Prometheus query over the version's sidecar
series (the chart's PodMonitor labels them with namespace, model and version), at the
Prometheus the platform names (--prometheus-url), never one a namespace chooses.

The ScaledObject is the version's child (owner reference): it goes with the version, and the
operator deletes it when spec.scaling goes. Its minReplicaCount is spec.scaling.minReplicas,
raised to the version's floor while its share of the model's traffic moves (capacity.py), so
that the autoscaler and scale before shift never pull apart.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Mapping
from typing import Any

import kopf

from modelroll_common import metric_names as names

from .api import Api, KubeApiError
from .config import OperatorConfig
from .manifests import workload_labels
from .snapshots import VersionInfo, VersionKey
from .spec import API_VERSION, KIND, Scaling
from .status import AUTOSCALING, Autoscaling

log = logging.getLogger("modelroll_operator")

KEDA_GROUP = "keda.sh"
KEDA_VERSION = "v1alpha1"
SCALED_OBJECTS = "scaledobjects"
POLLING_INTERVAL_S = 10
"""How often KEDA reads the trigger's query (KEDA's default is 30 s; a model's load moves
faster than that, and one query per version every 10 s is little for Prometheus)."""
WINDOW = "1m"
"""The range of the rates and quantiles the queries take."""


def scaled_object_path(namespace: str, name: str | None = None) -> str:
    path = f"/apis/{KEDA_GROUP}/{KEDA_VERSION}/namespaces/{namespace}/{SCALED_OBJECTS}"
    return path + (f"/{name}" if name else "")


def _quantile_ms(histogram: str, selector: str) -> str:
    """The 95th percentile over WINDOW in milliseconds; 0 when there were no requests."""
    rate = f"sum by (le) (rate({histogram}_bucket{{{selector}}}[{WINDOW}]))"
    return f"(1000 * histogram_quantile(0.95, {rate})) > 0 or vector(0)"


def trigger(
    scaling: Scaling, chat: bool, namespace: str, model: str, version: str
) -> tuple[str, str, int]:
    """The metric's query, KEDA's metricType for it, and its target."""
    selector = f'namespace="{namespace}",model="{model}",version="{version}"'
    ((name, target),) = scaling.targets().items()
    match name:
        case "inFlight":
            gauge = names.LLM_IN_FLIGHT if chat else names.REQUESTS_IN_FLIGHT
            return f"sum({gauge}{{{selector}}}) or vector(0)", "AverageValue", target
        case "queueWaitP95Ms":
            return _quantile_ms(names.QUEUE_WAIT, selector), "Value", target
        case "timeToFirstTokenP95Ms":
            return _quantile_ms(names.LLM_TTFT, selector), "Value", target
        case _:
            rate = f"sum(rate({names.LLM_OUTPUT_TOKENS}{{{selector}}}[{WINDOW}])) or vector(0)"
            return rate, "AverageValue", target


def scaled_object(version: VersionInfo, prometheus_url: str, floor: int) -> dict[str, Any]:
    """The version's ScaledObject: between spec.scaling's bounds, its minimum at least
    ``floor``, on the target spec.scaling names."""
    spec = version.spec
    assert spec is not None
    scaling = spec.scaling
    assert scaling is not None
    query, metric_type, target = trigger(
        scaling, spec.protocol == "OpenAI", version.namespace, spec.model, version.name
    )
    manifest: dict[str, Any] = {
        "apiVersion": f"{KEDA_GROUP}/{KEDA_VERSION}",
        "kind": "ScaledObject",
        "metadata": {"name": version.name, "labels": workload_labels(spec.model, version.name)},
        "spec": {
            "scaleTargetRef": {"apiVersion": API_VERSION, "kind": KIND, "name": version.name},
            "minReplicaCount": max(scaling.min_replicas, floor),
            "maxReplicaCount": max(scaling.max_replicas, floor),
            "pollingInterval": POLLING_INTERVAL_S,
            "advanced": {
                "horizontalPodAutoscalerConfig": {
                    "name": version.name,
                    "behavior": {
                        "scaleDown": {
                            "stabilizationWindowSeconds": scaling.scale_down_stabilization_seconds
                        }
                    },
                }
            },
            "triggers": [
                {
                    "type": "prometheus",
                    "metricType": metric_type,
                    "metadata": {
                        "serverAddress": prometheus_url,
                        "query": query,
                        "threshold": str(target),
                    },
                }
            ],
        },
    }
    kopf.adopt(manifest, owner=version.owner_body())  # type: ignore[arg-type]
    return manifest


def _described(scaling: Scaling, floor: int) -> str:
    ((name, target),) = scaling.targets().items()
    low, high = max(scaling.min_replicas, floor), max(scaling.max_replicas, floor)
    raised = (
        " (its minimum raised for its share of the traffic)" if floor > scaling.min_replicas else ""
    )
    return f"between {low} and {high} replicas on {name} {target}{raised}"


class Autoscalers:
    """Applies versions' ScaledObjects, remembering what it applied."""

    def __init__(self, api: Api, config: OperatorConfig) -> None:
        self.api = api
        self.config = config
        self._applied: dict[VersionKey, str] = {}
        """Per version, the hash of the ScaledObject last applied."""

    def forget_applied(self) -> None:
        """Apply every ScaledObject once more, on its next pass."""
        self._applied.clear()

    async def reconcile(self, version: VersionInfo, floor: int) -> Autoscaling | None:
        """Make the version's ScaledObject what its spec says; its Autoscaling condition (None:
        no spec.scaling, and no ScaledObject left)."""
        spec = version.spec
        if spec is None or spec.scaling is None or spec.server is None:
            await self._remove(version)
            return None
        if self.config.autoscaler != "keda" or self.config.prometheus_url is None:
            return Autoscaling(
                False,
                "AutoscalerMissing",
                "spec.scaling is not in force: the operator runs without an autoscaler "
                "(--autoscaler keda and --prometheus-url; the chart's autoscaling values "
                "install or name KEDA). The version keeps spec.replicas.",
            )
        manifest = scaled_object(version, self.config.prometheus_url, floor)
        digest = hashlib.sha256(json.dumps(manifest, sort_keys=True).encode()).hexdigest()
        described = f"ScaledObject {version.name} scales it {_described(spec.scaling, floor)}"
        if self._applied.get(version.key) == digest:
            return Autoscaling(True, "ScaledObjectApplied", described)
        try:
            await self.api.apply(scaled_object_path(version.namespace, version.name), manifest)
        except KubeApiError as exc:
            self._applied.pop(version.key, None)
            if exc.status == 404:
                why = "the cluster has no KEDA ScaledObjects (KEDA's CRDs are not installed)"
            else:
                why = f"the API server refused ScaledObject {version.name}: {exc}"
            return Autoscaling(False, "ScaledObjectRefused", f"spec.scaling is not in force: {why}")
        self._applied[version.key] = digest
        return Autoscaling(True, "ScaledObjectApplied", described)

    async def _remove(self, version: VersionInfo) -> None:
        """Delete the ScaledObject of a version whose spec.scaling went (it had one when its
        status has an Autoscaling condition)."""
        self._applied.pop(version.key, None)
        if not _had_one(version.status) or self.config.autoscaler == "none":
            return
        await self.api.delete(scaled_object_path(version.namespace, version.name))


def _had_one(status: Mapping[str, Any]) -> bool:
    return any(
        isinstance(c, Mapping) and c.get("type") == AUTOSCALING
        for c in status.get("conditions") or []
    )
