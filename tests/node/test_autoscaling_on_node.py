"""Autoscaling on the local node: a managed ModelVersion with ``spec.scaling`` on requests in
flight follows its load through the chart's KEDA and kube-controller-manager's real
HorizontalPodAutoscaler controller.

The version serves the demo model one request at a time, each costing the model MODEL_S: a
replica answers 1 / MODEL_S requests per second, and a request waits behind those queued before
it. The load is CLIENTS clients, each sending its next request as soon as its last is answered,
so the version holds CLIENTS requests in flight at every moment whatever its replicas: with
spec.scaling.inFlight at TARGET (a quarter above CLIENTS) per replica it needs one replica, and
two once the clients double, with room on both sides for the pods' series, scraped at
different moments, to add up to a little more or less than the clients hold. Its p99 then goes
from about CLIENTS x MODEL_S to twice that, and back once the second replica serves half of the
requests (the gateway's connections to the version's Service land on a pod each, at random,
and are renewed every 10 s: the split is uneven, which SLO_S allows for). When the clients halve
again, the version keeps its two replicas for the stabilization window
(spec.scaling.scaleDownStabilizationSeconds), then goes back to one, failing no request.

The module installs KEDA into the session's release (``helm upgrade`` with autoscaling.keda's
``enabled`` and ``install``) with a Prometheus of its own that the operator's ScaledObjects
query from KEDA's pod: it listens on the host's address on the pod network, and scrapes the
sidecars with the chart's PodMonitor selector like the session's. Afterwards the release goes
back to its values without KEDA.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import time
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest

from modelroll_devcluster import Cluster
from modelroll_devcluster.node import POD_CIDR
from modelroll_devcluster.prometheus import Prometheus
from modelroll_devcluster.pytest_plugin import Figures
from modelroll_devcluster.traffic import Response, Traffic, percentile
from tests.support.chart import CHART, Helm
from tests.support.incluster import InCluster
from tests.support.stack import eventually

pytestmark = pytest.mark.node

HOST_ON_POD_NETWORK = str(ipaddress.ip_network(POD_CIDR)[1])
"""The host as pods reach it: the CNI bridge, their gateway, has the pod subnet's first address
(host-local IPAM's default)."""
APISERVICE = "apiservice/v1beta1.external.metrics.k8s.io"
MODEL, VERSION = "autoscaled", "autoscaled-v1"
MODEL_S = 0.05
"""What one request costs the demo model: a replica answers 20 requests per second."""
CLIENTS = 16
"""Clients of the base load: enough connections that two replicas' random split of twice as
many stays near even (at 8, one replica holds 13 of 16 about 2% of the time)."""
TARGET = CLIENTS + CLIENTS // 4
"""spec.scaling.inFlight: one replica holds CLIENTS in flight, two hold twice as many, and neither
sits on the boundary where a scrape's skew of a request or two would tip the HPA's count."""
STABILIZATION_S = 20
"""spec.scaling.scaleDownStabilizationSeconds: short, so the story takes a minute, not five."""
SLO_S = 1.75 * CLIENTS * MODEL_S
"""The p99 the version keeps at its target: CLIENTS requests queued on a replica answer within
CLIENTS x MODEL_S, with room for the uneven split of two replicas' connections (1.4 s: one
replica holds 23 of 32 about 1% of the time). Twice the clients on one replica take about twice
CLIENTS x MODEL_S."""
HPA_S = 30.0
"""How soon the autoscaler must want the replicas the load needs: KEDA and the HPA read the
metric every few seconds (the local control plane's HPA syncs every 2 s, Prometheus scrapes
every second)."""
OBSERVE_S = 20.0
"""How long each phase's latency is measured, once it has settled."""


class Clients(Traffic):
    """``window`` clients of the gateway, each sending its next request as soon as its last one
    is answered: ``window`` requests are in flight at every moment, however slow the answers
    (unlike :class:`Traffic`'s rounds, which wait for the slowest of each round)."""

    async def _run(self) -> None:
        timeout = aiohttp.ClientTimeout(total=self.timeout)
        connector = aiohttp.TCPConnector(limit=self.window)
        async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
            await asyncio.gather(*(self._client(session, c) for c in range(self.window)))

    async def _client(self, session: aiohttp.ClientSession, client: int) -> None:
        sent = 0
        while not self._stop.is_set():
            self.responses.append(await self._call(session, sent, sent * self.window + client))
            sent += 1


def manifest() -> str:
    """The autoscaled version: the demo model one request at a time (batches of one), MODEL_S
    each; between one and four replicas, TARGET requests in flight per replica."""
    return json.dumps(
        {
            "apiVersion": "modelroll.io/v1alpha1",
            "kind": "ModelVersion",
            "metadata": {"name": VERSION},
            "spec": {
                "model": MODEL,
                "weight": 1,
                "server": {
                    "image": "ghcr.io/modelroll/modelroll-demo:0.1.0",
                    "imagePullPolicy": "IfNotPresent",
                    "command": ["modelroll-demo-model"],
                    "args": [
                        "--port=8080",
                        f"--fixed-ms={MODEL_S * 1000:g}",
                        "--per-token-ms=0",
                        "--parallel=1",
                    ],
                    "port": 8080,
                },
                "batching": {"maxBatchSize": 1, "maxWaitMs": 1, "timeoutMs": 30000},
                "scaling": {
                    "minReplicas": 1,
                    "maxReplicas": 4,
                    "inFlight": TARGET,
                    "scaleDownStabilizationSeconds": STABILIZATION_S,
                },
            },
        }
    )


def upgrade(release: InCluster, helm: Helm, *values: str) -> None:
    """``helm upgrade`` the session's release, its values kept but ``values``."""
    helm.run(
        "upgrade",
        release.release,
        str(CHART),
        "--namespace",
        release.namespace,
        "--kubeconfig",
        str(release.cluster.kubeconfig),
        "--reuse-values",
        *(arg for value in values for arg in ("--set", value)),
    )


def served(cluster: Cluster) -> bool:
    """Whether the API server reaches KEDA's metrics adapter (the APIService is Available)."""
    result = cluster.kubectl(
        "wait", "--for=condition=Available", APISERVICE, "--timeout=5s", check=False
    )
    return result.returncode == 0


@pytest.fixture(scope="module")
def keda(
    on_cluster: InCluster,
    sidecar_scrape_job: dict[str, Any],
    helm: Helm,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Prometheus]:
    """KEDA installed in the session's release, its triggers querying a Prometheus that pods
    reach; the release without KEDA again afterwards."""
    cluster = on_cluster.cluster
    if not cluster.is_local:
        pytest.skip("the Prometheus KEDA queries runs on the host of the local node")
    prometheus = Prometheus(
        tmp_path_factory.mktemp("keda-prometheus"), [sidecar_scrape_job], host=HOST_ON_POD_NETWORK
    ).start()
    try:
        upgrade(
            on_cluster,
            helm,
            "autoscaling.keda.enabled=true",
            "autoscaling.keda.install=true",
            "autoscaling.keda.image.pullPolicy=Never",
            f"autoscaling.prometheusUrl={prometheus.url}",
        )
        # KEDA's operator makes the certificates its adapter waits for, then restarts once with
        # them: minutes on a busy node, not seconds. The operator restarts with --autoscaler.
        for deployment in ("keda", "keda-adapter", "operator"):
            cluster.kubectl(
                "rollout",
                "status",
                f"deployment/{on_cluster.release}-{deployment}",
                "--timeout=300s",
                namespace=on_cluster.namespace,
                timeout=310,
            )
        eventually(lambda: served(cluster), "KEDA's APIService Available", 300)
        yield prometheus
    finally:
        # KEDA's finalizer holds a ScaledObject until KEDA's operator lets it go: the versions'
        # go before KEDA does.
        on_cluster.kubectl(
            "wait", "--for=delete", "scaledobjects", "--all", "--timeout=50s", check=False
        )
        upgrade(
            on_cluster, helm, "autoscaling.keda.install=false", "autoscaling.keda.enabled=false"
        )
        prometheus.stop()


def hpa(story: InCluster) -> dict[str, Any]:
    """The version's HorizontalPodAutoscaler (KEDA names it after the version)."""
    result = story.kubectl("get", "hpa", VERSION, "-o", "json", check=False)
    found: dict[str, Any] = json.loads(result.stdout) if result.returncode == 0 else {}
    return found


def desired(story: InCluster) -> int:
    return int(hpa(story).get("status", {}).get("desiredReplicas") or 0)


def reading(story: InCluster) -> bool:
    """Whether the HPA has read the version's metric through KEDA (its ScalingActive
    condition; kube-controller-manager may take up to 30 s to discover a new kind)."""
    conditions = hpa(story).get("status", {}).get("conditions", [])
    return any(c["type"] == "ScalingActive" and c["status"] == "True" for c in conditions)


def ready(story: InCluster) -> int:
    mv = story.cluster.kubectl_json("get", "mv", VERSION, namespace=story.namespace)
    return int(mv.get("status", {}).get("readyReplicas") or 0)


def routed(story: InCluster) -> bool:
    model = story.routes().get(MODEL) or {"versions": []}
    return VERSION in [v["name"] for v in model["versions"]]


def p99(responses: list[Response]) -> float:
    return percentile([r.latency for r in responses], 0.99)


def measure(loads: list[Clients], after: float) -> list[Response]:
    """OBSERVE_S of the loads' answers, from ``after`` on."""
    time.sleep(max(0.0, after + OBSERVE_S - time.monotonic()))
    return [r for load in loads for r in load.since(after, after + OBSERVE_S)]


@pytest.mark.timeout(1200)  # with the node's start and KEDA's, when it runs first
def test_a_version_follows_its_load_through_keda_and_the_hpa(
    keda: Prometheus, story: InCluster, figures: Figures
) -> None:
    try:
        story.kubectl("apply", "-f", "-", input=manifest())
        eventually(lambda: ready(story) == 1, f"{VERSION} Ready with one replica", 300)
        eventually(lambda: routed(story), f"the gateway routing {MODEL} to {VERSION}", 60)
        eventually(lambda: hpa(story), "KEDA's HorizontalPodAutoscaler for the version", 120)

        with Clients(story.gateway_url, MODEL, window=CLIENTS, timeout=30) as base:
            # 1. The base load: CLIENTS in flight, within one replica's target. It stays one.
            eventually(lambda: base.since(time.monotonic() - 5), "answers to the base load", 60)
            eventually(lambda: reading(story), "the HPA reading the version's metric", 120)
            settled = time.monotonic() + 10
            at_target = measure([base], settled)
            figures.add(
                "node autoscaling: one replica at its target",
                f"{CLIENTS} in flight, p99 {p99(at_target) * 1000:.0f} ms, "
                f"{len(at_target)} requests, HPA wants {desired(story)}",
            )
            assert p99(at_target) <= SLO_S
            assert (desired(story), ready(story)) == (1, 1)

            # 2. The load doubles: the HPA wants two replicas within its period.
            with Clients(story.gateway_url, MODEL, window=CLIENTS, timeout=30) as more:
                doubled = time.monotonic()
                eventually(lambda: desired(story) == 2, "the HPA wanting two replicas", HPA_S)
                wanted = time.monotonic() - doubled
                eventually(lambda: ready(story) == 2, "a second replica Ready", 300)
                scaled = time.monotonic() - doubled
                overloaded = [
                    r
                    for r in [*base.since(doubled), *more.since(doubled)]
                    if r.done < doubled + wanted
                ]
                figures.add(
                    "node autoscaling: load doubled",
                    f"HPA wanted 2 replicas after {wanted:.1f} s, 2 Ready after {scaled:.1f} s; "
                    f"p99 meanwhile {p99(overloaded) * 1000:.0f} ms",
                )
                # 3. Back within the SLO on two replicas, once every connection of the gateway's
                # has been renewed (10 s) and may have landed on the new pod.
                recovered = measure([base, more], time.monotonic() + 12)
                figures.add(
                    "node autoscaling: two replicas",
                    f"{2 * CLIENTS} in flight, p99 {p99(recovered) * 1000:.0f} ms "
                    f"(SLO {SLO_S * 1000:.0f} ms), {len(recovered)} requests",
                )
                assert p99(recovered) <= SLO_S
                assert desired(story) == 2  # the load is within two replicas' target

            # 4. The load halves: two replicas for the stabilization window, then one.
            halved = time.monotonic()
            eventually(lambda: desired(story) == 1, "the HPA wanting one replica", 300)
            down = time.monotonic() - halved
            eventually(lambda: ready(story) == 1, "one replica left", 120)
            figures.add(
                "node autoscaling: load halved",
                f"HPA went back to 1 replica after {down:.1f} s (stabilization window "
                f"{STABILIZATION_S} s)",
            )
            assert down >= STABILIZATION_S - 2  # the window held the second replica
            assert down <= STABILIZATION_S + HPA_S
            after = measure([base], time.monotonic() + 5)
            assert p99(after) <= SLO_S

        everything = [*base.responses, *more.responses]
        failed = [r for r in everything if r.status != 200]
        figures.add("node autoscaling: failed requests", f"{len(failed)} of {len(everything)}")
        assert not failed, failed[:5]
    finally:
        story.kubectl("delete", "mv", VERSION, "--ignore-not-found", "--timeout=60s", check=False)
