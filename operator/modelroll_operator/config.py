"""Operator configuration (from the command line) and the kopf settings derived from it.

``OperatorConfig`` travels to the handlers in kopf's memo; ``configure`` tunes the framework
once, from the startup handler.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import kopf
from kopf._cogs.structs.references import Insights, NamespaceName, select_specific_namespaces

from modelroll_common.routes import CONFIGMAP_NAME

from .httproute import GATEWAY_GROUP, GATEWAY_VERSION, HTTPROUTES
from .pod_security import DEFAULT_LEVEL, PodSecurity
from .spec import FINALIZER, LABEL_MANAGED_BY, LABEL_MODEL, MANAGED_BY, PREFIX, Resources

Autoscaler = Literal["none", "keda"]
AUTOSCALERS: tuple[Autoscaler, ...] = ("none", "keda")
"""What may turn spec.scaling into a HorizontalPodAutoscaler (--autoscaler)."""
DEFAULT_SIDECAR_IMAGE = "ghcr.io/modelroll/modelroll-sidecar:0.1.0"
"""The sidecar image of the same release as the operator: its flags are the ones the operator
passes."""
GRACE_MARGIN_S = 15
"""Seconds: a managed pod's termination grace period is its sidecar's drain timeout plus this,
so the kubelet never kills a draining sidecar: the period also runs the preStop hook, before
SIGTERM (the sidecar's --prestop-delay-ms, 3 s by default), and leaves time to exit."""
SIDECAR_RESOURCES: Resources = {
    "requests": {"cpu": "100m", "memory": "128Mi"},
    "limits": {"cpu": "1", "memory": "1Gi"},
}
"""The batching sidecar's resources in managed pods unless a version sets
spec.sidecar.resources: small requests (it spends about 70 µs of CPU per request), limits
so that a namespace with a ResourceQuota on limits admits the pod."""
SIDECAR_PORT = 8000
"""The sidecar's port in managed pods, and the port of each version's Service (the sidecar's
own default, so that a pod run by hand answers on the same port)."""


@dataclass(frozen=True)
class OperatorConfig:
    """Everything the handlers need to know beyond the cluster state.

    cli.py fills it from the command line; each field says its unit, its default and why.
    """

    sidecar_image: str = DEFAULT_SIDECAR_IMAGE
    """The batching sidecar's image in managed pods (--sidecar-image). Default: the sidecar of
    this release, whose flags are the ones the operator passes."""
    sidecar_resources: Resources = field(default_factory=lambda: SIDECAR_RESOURCES)
    """The sidecar's resources in managed pods (--sidecar-resources, JSON) unless a version
    sets spec.sidecar.resources. Default SIDECAR_RESOURCES. A model container whose requests
    equal its limits for cpu and memory gets a sidecar whose requests are its limits, so that
    the pod is in the Guaranteed QoS class."""
    sidecar_port: int = SIDECAR_PORT
    """A TCP port: where the sidecar listens in managed pods and what their Service exposes.
    Default 8000, the sidecar's own default. Not a flag: the gateway reaches each version at the
    endpoint in its status, whatever the port."""
    drain_timeout_s: int = 30
    """Seconds (--drain-timeout-s): the sidecar's --drain-timeout-s unless the version sets
    spec.sidecar.drainTimeoutS; the pod's grace period is this plus GRACE_MARGIN_S. Default 30,
    the sidecar's own and Kubernetes' default grace period."""
    kubeconfig: Path | None = None
    """A kubeconfig file (--kubeconfig). Default None: $KUBECONFIG, else ~/.kube/config, else the
    in-cluster service account, as kubectl reads them."""
    workers: int = 4
    """Models reconciled at the same time (--workers); one model is never reconciled twice at
    once. Default 4: a pass mostly waits on the API server, and a few in flight keep one slow
    model from holding up the others without flooding the API server."""
    metrics_port: int = 0
    """A TCP port where /metrics is served (on every address); 0: not at all. Default 0 here, so
    that tests and embedded use open no port; the command's default (--metrics-port) is 8082,
    next to the liveness probe's 8081."""
    retry_initial_s: float = 0.5
    """Seconds before a model whose pass failed is reconciled again; doubled on each failure in a
    row, up to retry_max_s. Default 0.5: a conflict or a blip is over by then. Not a flag."""
    retry_max_s: float = 30.0
    """Seconds: the longest wait between retries of a model. Default 30: a model whose writes
    keep failing (a quota, an admission webhook) is tried twice a minute, soon enough once the
    cause is gone, rarely enough to spare the API server. Not a flag."""
    peering: str | None = None
    """A kopf peering name (--peering): replicas with the same name elect one active operator.
    Default None: standalone, which needs no peering CRDs and suits a single replica."""
    gateway_api: bool = False
    """Whether models may be routed by Gateway API HTTPRoutes (--gateway-api): the operator
    watches the HTTPRoutes labelled modelroll.io/model and writes their weights. Default False:
    no Gateway API CRDs needed, no access to HTTPRoutes."""
    pod_security: PodSecurity = DEFAULT_LEVEL
    """What a managed version's spec.server may put in its pod (--pod-security). Default
    "baseline": what Pod Security "baseline" forbids (privileged containers, hostPath volumes,
    hostIPC, added capabilities, ...; pod_security.py) is the version's InvalidSpec, and nothing
    is applied, whatever the namespace's own Pod Security level (Kubernetes' default is
    "privileged"). "privileged" refuses none of it."""
    analysis_url_prefixes: tuple[str, ...] = ()
    """URL prefixes that a canary analysis may read besides its own namespace's Services
    (--analysis-url-prefix, repeatable; analysis/access.py says how a URL matches one). Default
    none: an analysis reads only Services of its version's namespace, since the operator reads
    from its own network position for whoever may write a ModelVersion."""
    analysis_gateway_namespaces: tuple[str, ...] = ()
    """Namespaces besides its own whose gateway pods a canary analysis may read
    (--analysis-gateway-namespace, repeatable). Default none: the chart's gateway serves the
    models of its own namespace, so their versions find it there."""
    scale_before_shift: bool = True
    """Whether a managed version whose share of its model's traffic rises first gets the ready
    replicas that share needs, and one whose share fell stays warm (--scale-before-shift;
    capacity.py). Default True: a promotion never sends a model's traffic to a version sized for
    a tenth of it. False moves weights at once."""
    autoscaler: Autoscaler = "none"
    """What turns spec.scaling into a HorizontalPodAutoscaler (--autoscaler): "keda" (a KEDA
    ScaledObject per version, autoscaling.py) or "none". Default "none": KEDA is installed by
    choice (the chart's autoscaling values), and without it nothing serves the metrics."""
    prometheus_url: str | None = None
    """The Prometheus that scrapes the sidecars (--prometheus-url), which the autoscaler's
    triggers query: a platform setting, never a namespace's choice. Default None (needed with an
    autoscaler)."""
    priority: int = 0
    """The peering priority (--priority): the replica with the highest is active. Default 0
    (standalone, unused); with --peering and no --priority, cli.py draws a random one, because
    kopf pauses every replica when the highest priority is shared."""

    @property
    def termination_grace_s(self) -> int:
        """The pods' grace period for the default drain (a version may set its own)."""
        return self.drain_timeout_s + GRACE_MARGIN_S


class NoDiffBase(kopf.AnnotationsDiffBaseStorage):
    """A diff-base storage that stores nothing, and drops what an older operator stored.

    kopf reads the diff base (its "last handled configuration") only to tell creation, update,
    resumption and no-op apart and to compute ``diff``/``old``/``new``
    (``kopf._core.reactor.processing._detect_causes`` and ``causes.detect_changing_cause``),
    for on.create/update/resume/field handlers and daemons. The operator has none of them:
    on.event handlers and indices get the raw object, and on.delete is chosen from
    ``deletionTimestamp`` and our finalizer alone. With nothing fetched, every event of a live
    object is a "creation" that no handler serves, so kopf writes nothing for it.

    kopf's annotation storage wrote the whole spec into one annotation, in the same patch that
    removes our finalizer (``processing.process_changing_cause``): with a spec over the
    annotations' 256 KiB limit, that patch was refused and the object could never be deleted.
    Here, ``store`` only removes the annotation if an older operator left one (the patch gets
    smaller, so it is always accepted): such objects are deleted as any other.
    """

    def __init__(self) -> None:
        super().__init__(prefix=PREFIX, key="last-handled-configuration")

    def fetch(self, *, body: kopf.Body) -> kopf.BodyEssence | None:
        return None

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: kopf.BodyEssence) -> None:
        annotations = body.metadata.annotations
        for key in self.make_keys(self.key, body=body):
            if key in annotations:
                patch.metadata.annotations[key] = None


def served_namespaces(patterns: Iterable[str]) -> Insights:
    """kopf's view of the served namespaces, with the exactly named ones in it from the start.

    kopf lists namespaces at startup and serves those that match ``--namespace``, but it skips a
    namespace that is already being deleted and still holds content (``revise_namespaces`` in
    ``kopf._core.reactor.observation`` keeps serving such a namespace only if it was served
    before): an operator started then would never watch it, never remove our finalizer from its
    ModelVersions, and the namespace would stay Terminating forever. A namespace put here before
    that listing stays served until it is gone (kopf drops it on its deletion as usual).
    Patterns with globs still depend on the listing.
    """
    insights = Insights()
    insights.namespaces.update(NamespaceName(ns) for ns in select_specific_namespaces(patterns))
    return insights


def configure(settings: kopf.OperatorSettings, config: OperatorConfig) -> None:
    """Tune kopf: our own finalizer and annotations, quiet events, narrow watches, peering."""
    settings.persistence.finalizer = FINALIZER
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=PREFIX)
    settings.persistence.diffbase_storage = NoDiffBase()
    # kopf would post an event for every handler run; the operator posts its own routing
    # events, so only kopf's warnings and errors become events.
    settings.posting.level = logging.WARNING
    settings.posting.reporting_component = MANAGED_BY
    settings.posting.reporting_instance = socket.gethostname()
    # Watch only what the operator manages (server-side selectors), not every object.
    managed = f"{LABEL_MANAGED_BY}={MANAGED_BY}"
    settings.watching.label_selectors["apps", "v1", "deployments"] = managed
    settings.watching.label_selectors["v1", "services"] = managed
    settings.watching.field_selectors["v1", "configmaps"] = f"metadata.name={CONFIGMAP_NAME}"
    # Only the HTTPRoutes that claim a model; one whose label goes arrives as DELETED.
    settings.watching.label_selectors[GATEWAY_GROUP, GATEWAY_VERSION, HTTPROUTES] = LABEL_MODEL
    # Reconnect soon after the API server comes back.
    settings.watching.reconnect_backoff = 1.0
    settings.networking.error_backoffs = [1, 1, 2, 3, 5, 8]
    if config.peering:
        settings.peering.name = config.peering
        settings.peering.mandatory = True
        settings.peering.standalone = False
        settings.peering.priority = config.priority
    else:
        settings.peering.standalone = True
