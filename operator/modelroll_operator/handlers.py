"""kopf handlers: settings at startup, indices of what the operator watches, and triggers.

Indexers keep snapshots of ModelVersions (by model) and of managed Deployments and Services (by
version). Event handlers only name the model that may need a pass; the Reconciler (reconcile.py)
does the work from the indices. Deleting a ModelVersion waits, through our finalizer, until its
model's route no longer lists it, so the gateway stops sending it traffic before its workload
is garbage-collected.
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Any
from wsgiref.simple_server import WSGIServer

import kopf
from kubernetes.client import ApiClient
from kubernetes.config import kube_config
from prometheus_client import CollectorRegistry

from modelroll_common.kube import connect
from modelroll_common.routes import CONFIGMAP_NAME

from .analysis.access import ReadAccess
from .analysis.daemon import Canaries
from .analysis.exporter import AnalysisMetrics, serve
from .analysis.reader import MetricsReader
from .api import Api
from .config import OperatorConfig, configure
from .httproute import GATEWAY_GROUP, GATEWAY_VERSION, HTTPROUTES, HTTPRouteInfo
from .reconcile import TRANSIENT, Reconciler, VersionIndex, WorkloadIndex
from .snapshots import ModelKey, VersionInfo, VersionKey, WorkloadInfo
from .spec import GROUP, LABEL_MANAGED_BY, LABEL_MODEL, MANAGED_BY, PLURAL, VERSION

MANAGED = {LABEL_MANAGED_BY: MANAGED_BY}
log = logging.getLogger("modelroll_operator")


# kopf passes indices to every handler, but its ActivityFn protocol lists only the activity's
# own keywords, so mypy refuses a startup handler that names an index (kopf 1.45).
@kopf.on.startup()  # type: ignore[arg-type]
async def start(
    settings: kopf.OperatorSettings,
    memo: kopf.Memo,
    versions_by_model: VersionIndex,
    deployments_by_version: WorkloadIndex,
    services_by_version: WorkloadIndex,
    **indices: Any,
) -> None:
    """Tune kopf, open the API session, and start the reconciler's workers.

    kopf passes every index as a keyword argument named after its indexer function (the
    handler's id): the reconciler reads the cluster state from these three.
    """
    config: OperatorConfig = memo.get("config") or OperatorConfig()
    configure(settings, config)
    if memo.get("analysis_metrics") is None:  # not on a retry of this handler
        registry = CollectorRegistry()
        memo.analysis_metrics = AnalysisMetrics(registry)
        if config.metrics_port:
            try:
                memo.metrics_server = serve(registry, config.metrics_port)
            except OSError as exc:
                msg = f"Cannot serve metrics on port {config.metrics_port}: {exc}"
                raise kopf.PermanentError(msg) from exc
    client: ApiClient | None = memo.get("client")
    if client is None:
        memo.client = client = connect(config.kubeconfig).client
    api = Api(client)
    reconciler = Reconciler(
        api,
        config,
        versions_by_model,
        deployments_by_version,
        services_by_version,
        indices.get("httproutes_by_model"),  # registered with --gateway-api only
    )
    reconciler.start()
    memo.reconciler = reconciler
    memo.canaries = Canaries(
        api,
        lambda key: list(versions_by_model.get(key) or ()),
        MetricsReader(
            api,
            access=ReadAccess.of(config.analysis_url_prefixes, config.analysis_gateway_namespaces),
        ),
        memo.analysis_metrics,
        planes=reconciler.planes,
    )
    mode = f"peering {config.peering!r}" if config.peering else "standalone"
    log.info("Started the modelroll operator (%s, sidecar image %s)", mode, config.sidecar_image)


@kopf.on.login()
def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    """kopf logs in through the official client's configuration too, so it has the same
    credentials as our own calls, exec and auth-provider plugins included: the service account
    in a pod, else the kubeconfig (--kubeconfig is exported as $KUBECONFIG by cli.py)."""
    if path := os.environ.get("KUBECONFIG"):
        # The client reads $KUBECONFIG once, when it is imported: before cli.py exported it.
        kube_config.KUBE_CONFIG_DEFAULT_LOCATION = path
    return kopf.login_via_client(**kwargs)


@kopf.on.cleanup()
async def stop(memo: kopf.Memo, **_: Any) -> None:
    reconciler: Reconciler | None = memo.get("reconciler")
    if reconciler is not None:
        await reconciler.stop()
    canaries: Canaries | None = memo.get("canaries")
    if canaries is not None:
        await canaries.reader.close()
    server: WSGIServer | None = memo.get("metrics_server")
    if server is not None:
        await asyncio.to_thread(server.shutdown)  # waits for its loop (at most 0.5 s)
        server.server_close()
    client: ApiClient | None = memo.get("client")
    if client is not None:
        client.close()  # type: ignore[no-untyped-call]
    log.info("Stopped the modelroll operator")


@kopf.on.probe(id="pending")
def pending_models(memo: kopf.Memo, **_: Any) -> int:
    """Liveness detail: models waiting for a pass or a retry."""
    reconciler: Reconciler | None = memo.get("reconciler")
    return reconciler.pending if reconciler is not None else 0


@kopf.on.probe(id="passes")
def passes(memo: kopf.Memo, **_: Any) -> int:
    """Liveness detail: passes over models since the start (what a change costs)."""
    reconciler: Reconciler | None = memo.get("reconciler")
    return reconciler.passes if reconciler is not None else 0


# -- indices ----------------------------------------------------------------------------------


@kopf.index(GROUP, VERSION, PLURAL)
def versions_by_model(body: kopf.Body, **_: Any) -> dict[ModelKey, VersionInfo]:
    info = VersionInfo.from_body(body)
    return {info.model_key: info} if info is not None else {}


@kopf.index("apps", "v1", "deployments", labels=MANAGED)
def deployments_by_version(body: kopf.Body, **_: Any) -> dict[VersionKey, WorkloadInfo]:
    info = WorkloadInfo.from_body("Deployment", body)
    return {info.key: info} if info is not None else {}


@kopf.index("v1", "services", labels=MANAGED)
def services_by_version(body: kopf.Body, **_: Any) -> dict[VersionKey, WorkloadInfo]:
    info = WorkloadInfo.from_body("Service", body)
    return {info.key: info} if info is not None else {}


def httproutes_by_model(body: kopf.Body, **_: Any) -> dict[ModelKey, HTTPRouteInfo]:
    info = HTTPRouteInfo.from_body(body)
    return {info.model_key: info} if info is not None else {}


def httproute_changed(
    namespace: str | None,
    name: str | None,
    type: str | None,
    labels: kopf.Labels,
    memo: kopf.Memo,
    **_: Any,
) -> None:
    """An HTTPRoute claiming a model changed: the model's pass writes its weights back if they
    drifted, and reports the parents' verdict. The watch selects the claiming routes, so a
    route whose label is removed arrives as DELETED."""
    if namespace and name:
        model = None if type == "DELETED" else labels.get(LABEL_MODEL)
        _reconciler(memo).httproute_changed(namespace, name, model or None)


def register_gateway_api(registry: kopf.OperatorRegistry | None = None) -> None:
    """Watch the HTTPRoutes that claim models (--gateway-api): without it the operator needs
    no Gateway API CRDs and no access to HTTPRoutes."""
    claiming = {LABEL_MODEL: kopf.PRESENT}
    kopf.index(GATEWAY_GROUP, GATEWAY_VERSION, HTTPROUTES, labels=claiming, registry=registry)(
        httproutes_by_model
    )
    kopf.on.event(GATEWAY_GROUP, GATEWAY_VERSION, HTTPROUTES, registry=registry)(httproute_changed)


# -- triggers ---------------------------------------------------------------------------------


def _reconciler(memo: kopf.Memo) -> Reconciler:
    reconciler: Reconciler = memo.reconciler
    return reconciler


@kopf.on.event(GROUP, VERSION, PLURAL)
def version_changed(namespace: str | None, spec: kopf.Spec, memo: kopf.Memo, **_: Any) -> None:
    """Any change of a ModelVersion (spec, status, deletion) may change its model's route."""
    model = spec.get("model")
    if namespace and model:
        _reconciler(memo).enqueue((namespace, model))


@kopf.on.event("apps", "v1", "deployments", labels=MANAGED)
def deployment_changed(
    namespace: str | None, labels: kopf.Labels, memo: kopf.Memo, **_: Any
) -> None:
    """Ready replicas come and go; a Deployment deleted by hand is re-created."""
    if namespace and (model := labels.get(LABEL_MODEL)):
        _reconciler(memo).enqueue((namespace, model))


@kopf.on.event("v1", "services", labels=MANAGED)
def service_changed(namespace: str | None, labels: kopf.Labels, memo: kopf.Memo, **_: Any) -> None:
    if namespace and (model := labels.get(LABEL_MODEL)):
        _reconciler(memo).enqueue((namespace, model))


@kopf.on.event("v1", "configmaps", field="metadata.name", value=CONFIGMAP_NAME)
def routes_changed(
    namespace: str | None, type: str | None, body: kopf.Body, memo: kopf.Memo, **_: Any
) -> None:
    """The routes changed: re-queue only the models whose key is not what the operator wrote
    (someone else's edit, a deleted ConfigMap, a model without versions). The operator's own
    writes re-queue nothing."""
    if namespace:
        data = None if type == "DELETED" else dict(body.get("data") or {})
        _reconciler(memo).routes_changed(namespace, data)


@kopf.on.delete(GROUP, VERSION, PLURAL)
async def unroute_deleted_version(
    namespace: str | None,
    name: str,
    spec: kopf.Spec,
    memo: kopf.Memo,
    **_: Any,
) -> None:
    """Hold the deletion (our finalizer) until the version is out of the route the gateway has.
    Nothing else holds it: a pass that fails elsewhere (a sibling's workload, a status) does not,
    nor does a route that cannot be written, if this version was not in it anyway."""
    model = spec.get("model")
    if not namespace or not model:
        return
    try:
        result = await _reconciler(memo).reconcile((namespace, model))
    except TRANSIENT as exc:
        raise kopf.TemporaryError(
            f"Could not remove {name} from the routes of model {model}: {exc}", delay=2
        ) from exc
    if result.in_force is not None and result.in_force.version(name) is not None:
        why = "; ".join(result.problems) or "the routes were not updated"
        raise kopf.TemporaryError(f"{name} is still in the routes of model {model}: {why}", delay=2)
    log.info("Removed ModelVersion %s/%s from the routes of model %s", namespace, name, model)


# -- canary analyses --------------------------------------------------------------------------


def _has_analysis(spec: kopf.Spec, **_: Any) -> bool:
    return bool(spec.get("analysis"))


@kopf.daemon(GROUP, VERSION, PLURAL, when=_has_analysis, cancellation_timeout=10.0)
async def analyse(
    namespace: str | None, name: str | None, memo: kopf.Memo, stopped: kopf.DaemonStopped, **_: Any
) -> None:
    """A canary's analysis (analysis/daemon.py), as long as it has one and it is not finished."""
    if not namespace or not name:
        return

    async def sleep(seconds: float) -> bool:
        await stopped.wait(seconds)
        return bool(stopped)

    canaries: Canaries = memo.canaries
    await canaries.run(namespace, name, sleep)
