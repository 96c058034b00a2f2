"""``modelroll-bench dataplanes`` (``make bench-dataplanes``): the modelroll gateway and a Gateway
API data plane (Traefik, with its kubernetesGateway provider) side by side, in one run, on one
local control plane, driven by the same operator.

The backends are the rollback benchmark's recorders: two versions of one model, ``stable`` and
``canary``, that answer at once and remember when each request arrived, so what is measured is
the data plane alone. They listen on loopback (the gateway's endpoints) and on this host's
address (the Services' EndpointSlices: Kubernetes refuses loopback there). Two namespaces hold
the same two ModelVersions at weight 1 each: one routed by the routes ConfigMap and a
``modelroll-gateway``, one claimed by an HTTPRoute attached to Traefik's Gateway. The operator
(``--gateway-api``) serves both.

1. The cost of the hop, alternating the arms in every round: Poisson arrivals at ``--rate`` for
   ``--latency-s`` straight to the recorder, through the gateway and through Traefik (added
   p50/p95/p99 = through minus direct, in the same round), then each arm's saturation rate with
   wrk for ``--duration-s`` (the ratio to direct's rate in the same round). Medians over rounds.
2. Rollback: with load through each data plane, ``kubectl patch modelversion canary`` to weight
   0, timed to the last request that reaches the canary, ``--flips`` times each; the requests
   that failed meanwhile are counted.

Traefik applies a new configuration at most every ``providers.providersThrottleDuration``; the
devcluster sets 200 ms (Traefik's default is 2 s), which bounds how soon it follows a route.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import aiohttp
from kubernetes import client as k8s
from kubernetes import config as k8s_config

from modelroll_devcluster import Cluster
from modelroll_devcluster.node import detect_node_ip
from modelroll_devcluster.processes import free_port
from modelroll_devcluster.traefik import Traefik, create_gateway, install_gateway_api_crds

from . import results, wrk
from .figures import PairedRatio
from .loadgen import json_bodies, open_loop
from .rollback import (
    CRD,
    MODEL,
    VERSIONS,
    Load,
    Routes,
    WeightChanges,
    arrivals,
    cluster_for,
    flips,
    summarize,
    wait_for,
)
from .rollback import Setup as FlipSetup
from .runs import bar, load_average, machine
from .stats import Spread, spread
from .systems import serve

SERVICE_PORT = 8000
ROUTE = "bench"
ARMS = ("direct", "gateway", "traefik")
PAYLOAD = json.dumps({"payload": "a short request"})


@dataclass(frozen=True)
class Setup:
    rounds: int = 5
    rate: float = 200.0
    """Requests per second of the latency part, in each arm."""
    latency_s: float = 5.0
    duration_s: int = 5
    """Seconds of wrk per arm and round."""
    connections: int = 32
    flips: int = 10
    flip_rate: float = 400.0
    """Requests per second through each data plane while its flips run."""
    kubeconfig: Path | None = None


def httproute_manifests(
    address: str, ports: dict[str, int], parent: dict[str, str]
) -> list[dict[str, Any]]:
    """The Services (no selector) and EndpointSlices of both versions, at ``address``, and the
    HTTPRoute that claims the model, attached to ``parent``."""
    manifests: list[dict[str, Any]] = []
    for version, port in ports.items():
        manifests.append(
            {
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {"name": version},
                "spec": {"ports": [{"name": "http", "port": SERVICE_PORT, "targetPort": port}]},
            }
        )
        manifests.append(
            {
                "apiVersion": "discovery.k8s.io/v1",
                "kind": "EndpointSlice",
                "metadata": {
                    "name": version,
                    "labels": {"kubernetes.io/service-name": version},
                },
                "addressType": "IPv4",
                "ports": [{"name": "http", "port": port, "protocol": "TCP"}],
                "endpoints": [{"addresses": [address], "conditions": {"ready": True}}],
            }
        )
    manifests.append(
        {
            "apiVersion": "gateway.networking.k8s.io/v1",
            "kind": "HTTPRoute",
            "metadata": {"name": ROUTE, "labels": {"modelroll.io/model": MODEL}},
            "spec": {
                "parentRefs": [parent],
                "rules": [
                    {"name": MODEL, "matches": [{"path": {"type": "Exact", "value": "/v1/infer"}}]}
                ],
            },
        }
    )
    return manifests


class Versions(Routes):
    """The two ModelVersions of a namespace; in the HTTPRoute's, with their Services as
    backends."""

    def __init__(
        self, cluster: Cluster, namespace: str, recorders: dict[str, str], backends: bool
    ) -> None:
        super().__init__(cluster, namespace, recorders)
        self.backends = backends

    def create_versions(self) -> None:
        for version in VERSIONS:
            spec: dict[str, Any] = {
                "model": MODEL,
                "weight": 1,
                "endpoint": self.recorders[version],
            }
            if self.backends:
                spec["backendRef"] = {"name": version, "port": SERVICE_PORT}
            self.cluster.apply(
                {
                    "apiVersion": "modelroll.io/v1alpha1",
                    "kind": "ModelVersion",
                    "metadata": {"name": version},
                    "spec": spec,
                },
                namespace=self.namespace,
            )


@contextlib.asynccontextmanager
async def operator(cluster: Cluster, namespaces: list[str]) -> AsyncIterator[None]:
    """modelroll-operator with --gateway-api, serving ``namespaces``."""
    argv = [sys.executable, "-m", "modelroll_operator", "--gateway-api", "--liveness", ""]
    argv += ["--kubeconfig", str(cluster.kubeconfig), "--log-level", "WARNING"]
    for namespace in namespaces:
        argv += ["--namespace", namespace]
    with tempfile.TemporaryFile() as log:
        proc = await asyncio.create_subprocess_exec(
            *argv, stdout=asyncio.subprocess.DEVNULL, stderr=log
        )
        try:
            yield
        finally:
            if proc.returncode is None:
                proc.terminate()
                await proc.wait()


@dataclass(frozen=True)
class Hop:
    """One data plane against calling the backends directly, paired by round: what it adds to
    p50/p95/p99, its rate and its rate over direct's, and its failed requests."""

    added_p50_ms: Spread | None
    added_p95_ms: Spread | None
    added_p99_ms: Spread | None
    rps: Spread | None
    of_direct: PairedRatio
    errors: int


@dataclass(frozen=True)
class HopSummary:
    direct_rps: Spread | None
    planes: dict[str, Hop]
    traefik_of_gateway: PairedRatio
    """Traefik's rate over the gateway's, paired by round."""


def _minus(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a - b


def hop_summary(rounds: list[dict[str, Any]]) -> HopSummary:
    """Each data plane over direct calls, and Traefik over the gateway, round by round."""

    def rps(label: str) -> list[float]:
        return [row[label]["rps"] for row in rounds]

    def added(label: str, q: str) -> Spread | None:
        return spread(_minus(row[label][f"{q}_ms"], row["direct"][f"{q}_ms"]) for row in rounds)

    def errors(label: str) -> int:
        return sum(
            sum(row[label]["errors"].values()) + row[label]["wrk_failures"] for row in rounds
        )

    planes = {
        label: Hop(
            added_p50_ms=added(label, "p50"),
            added_p95_ms=added(label, "p95"),
            added_p99_ms=added(label, "p99"),
            rps=spread(rps(label)),
            of_direct=PairedRatio.of(rps(label), rps("direct")),
            errors=errors(label),
        )
        for label in ARMS[1:]
    }
    return HopSummary(spread(rps("direct")), planes, PairedRatio.of(rps("traefik"), rps("gateway")))


async def hop_cost(urls: dict[str, str], setup: Setup) -> dict[str, Any]:
    """Added latency and saturation rate of each data plane against direct calls, by round."""
    bodies = json_bodies([json.loads(PAYLOAD)["payload"]])
    rounds: list[dict[str, Any]] = []
    for url in urls.values():
        await open_loop(url, bodies, setup.rate, 2, label="warm-up")
    for r in range(setup.rounds):
        row: dict[str, Any] = {}
        for label, url in urls.items():
            latency = (
                await open_loop(url, bodies, setup.rate, setup.latency_s, seed=r, label=label)
            ).summary()
            rate = await asyncio.to_thread(
                wrk.run,
                label,
                url,
                PAYLOAD,
                connections=setup.connections,
                duration_s=setup.duration_s,
            )
            row[label] = {
                **{k: latency[k] for k in ("p50_ms", "p95_ms", "p99_ms", "errors")},
                "rps": round(rate.rps, 1),
                "wrk_failures": rate.non_2xx + rate.socket_errors,
            }
        print(
            f"  round {r + 1}: "
            + " | ".join(
                f"{label} p50 {row[label]['p50_ms']:.2f} p99 {row[label]['p99_ms']:.2f} ms "
                f"{row[label]['rps']:.0f} req/s"
                for label in urls
            ),
            flush=True,
        )
        rounds.append(row)
    return {"rounds": rounds, "summary": hop_summary(rounds)}


async def rollbacks(
    label: str,
    url: str,
    routes: Routes,
    recorders: dict[str, str],
    setup: Setup,
    watch: Callable[[], WeightChanges],
    client: k8s.ApiClient,
    progress: Any,
) -> dict[str, Any]:
    """The flips of one data plane, with load through it all the while."""
    load = Load(url, setup.flip_rate)
    loading = asyncio.create_task(load.run())
    flip_setup = FlipSetup(flips=setup.flips, rate=setup.flip_rate)
    written = await asyncio.to_thread(watch)
    canary = await asyncio.to_thread(WeightChanges.of_canary, client, routes.namespace)
    try:
        rows = await flips("operator", routes, recorders, flip_setup, written, progress, canary)
    finally:
        written.stop()
        canary.stop()
        load.stopping.set()
        await loading
    failed = {str(c): n for c, n in load.statuses.items() if not 200 <= c < 300}
    print(f"  {label}: requests by status {dict(sorted(load.statuses.items()))}", flush=True)
    return {
        "rollback": summarize(rows, "rollback_ms"),
        "restore": summarize(rows, "restore_ms"),
        "written": summarize(rows, "configmap_ms"),
        "operator": summarize(rows, "operator_ms"),
        "failed_requests": failed,
        "requests": sum(load.statuses.values()),
        "flips": rows,
    }


async def run(cluster: Cluster, namespace: str, setup: Setup) -> dict[str, Any]:
    python = sys.executable
    address = detect_node_ip()
    ports = {v: free_port() for v in VERSIONS}
    recorders = {v: f"http://127.0.0.1:{p}" for v, p in ports.items()}
    routed = cluster.create_namespace(f"{namespace}-httproute")
    gateway_ns = cluster.create_namespace(f"{namespace}-gateway")
    await asyncio.to_thread(
        cluster.kubectl, "apply", "--server-side", "--force-conflicts", "-f", str(CRD)
    )
    await asyncio.to_thread(install_gateway_api_crds, cluster)
    gport = free_port()
    gateway_argv = [python, "-m", "modelroll_gateway", "--host", "127.0.0.1", "--port", str(gport)]
    gateway_argv += ["--kubeconfig", str(cluster.kubeconfig), "--namespace", namespace]
    gateway_argv += ["--log-level", "WARNING", "--admin-port", "0"]  # no metrics read here
    recorder_argv = [python, "-m", "modelroll_bench.recorder", "--host", address]
    report: dict[str, Any] = {
        "setup": {**asdict(setup), "kubeconfig": str(setup.kubeconfig or "")},
        "machine": machine(),
        "backends": "the rollback benchmark's recorders (answer at once; no model)",
    }
    client = k8s_config.new_client_from_config(str(cluster.kubeconfig))  # type: ignore[no-untyped-call]
    with tempfile.TemporaryDirectory(prefix="modelroll-bench-traefik-") as tmp:
        traefik = await asyncio.to_thread(Traefik(cluster, Path(tmp)).start)
        try:
            dataplane = await asyncio.to_thread(create_gateway, cluster, traefik, gateway_ns)
            for manifest in httproute_manifests(address, ports, dataplane.parent_ref()):
                await asyncio.to_thread(cluster.apply, manifest, namespace=routed)
            plain = Routes(cluster, namespace, recorders)
            claimed = Versions(cluster, routed, recorders, backends=True)
            async with (
                serve([*recorder_argv, *map(str, ports.values())], ports["stable"]),
                serve(gateway_argv, gport) as gateway_url,
                operator(cluster, [namespace, routed]),
            ):
                for routes in (plain, claimed):
                    await asyncio.to_thread(routes.create_versions)
                urls = {
                    "direct": recorders["stable"] + "/v1/infer",
                    "gateway": f"{gateway_url}/v1/models/{MODEL}/infer",
                    "traefik": f"{traefik.url}/v1/infer",
                }
                await both_versions_answer(urls, recorders)
                print("The cost of the hop:", flush=True)
                report["hop"] = await hop_cost(urls, setup)
                print("Rollbacks:", flush=True)
                watches = {
                    "gateway": (plain, lambda: WeightChanges.of_configmap(client, namespace)),
                    "traefik": (
                        claimed,
                        lambda: WeightChanges.of_httproute(client, routed, ROUTE),
                    ),
                }
                report["rollback"] = {}
                with bar(setup.flips * len(watches), "rollback", unit="flip") as progress:
                    for label, (routes, watch) in watches.items():
                        report["rollback"][label] = await rollbacks(
                            label, urls[label], routes, recorders, setup, watch, client, progress
                        )
        finally:
            traefik.stop()
    report["load_average_1m_end"] = round(load_average(), 2)
    print_report(report, setup)
    return report


async def both_versions_answer(urls: dict[str, str], recorders: dict[str, str]) -> None:
    """Wait until requests through each data plane reach both versions."""
    async with aiohttp.ClientSession() as http:
        for label in ARMS[1:]:

            async def split(url: str = urls[label]) -> bool:
                started = time.monotonic()
                for _ in range(20):
                    async with http.post(url, data=PAYLOAD) as resp:
                        await resp.read()
                got = [await arrivals(http, recorders[v], started) for v in VERSIONS]
                return all(g["count"] for g in got)

            await wait_for(f"traffic through the {label} to both versions", split, 60.0)


def print_report(report: dict[str, Any], setup: Setup) -> None:
    hop: HopSummary = report["hop"]["summary"]
    print(
        f"\nThe hop ({setup.rounds} rounds; latency at {setup.rate:g} req/s, rate with wrk "
        f"{setup.connections} connections; stand-in backends that answer at once; medians "
        "of the rounds):"
    )
    print(f"  direct      {_median(hop.direct_rps, '8.0f')} req/s")
    for label, h in hop.planes.items():
        print(
            f"  {label:<10}  {_median(h.rps, '8.0f')} req/s "
            f"({_median(h.of_direct.spread, '.2f')} of direct)  "
            f"added p50 {_median(h.added_p50_ms)} p95 {_median(h.added_p95_ms)} "
            f"p99 {_median(h.added_p99_ms)} ms  errors {h.errors}"
        )
    ratio = _median(hop.traefik_of_gateway.spread, ".3f")
    print(f"  Traefik's rate over the gateway's, paired by round: {ratio}")
    print(f"Rollback, kubectl patch -> last request to the canary ({setup.flip_rate:g} req/s):")
    for label, r in report["rollback"].items():
        rb, wr = r["rollback"], r["written"]
        print(
            f"  {label:<10} p50 {rb.p50_ms} ms  p99 {rb.p99_ms} ms  max {rb.max_ms} ms "
            f"(timeouts {rb.timeouts}); route written p50 {wr.p50_ms} ms; failed "
            f"requests {r['failed_requests'] or 0} of {r['requests']}"
        )


def _median(found: Spread | None, fmt: str = "+.2f") -> str:
    return "-" if found is None else format(found.median, fmt)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    d = Setup()
    parser.add_argument("--rounds", type=int, default=d.rounds)
    parser.add_argument("--rate", type=float, default=d.rate, help="req/s of the latency part")
    parser.add_argument("--latency-s", type=float, default=d.latency_s)
    parser.add_argument("--duration-s", type=int, default=d.duration_s, help="wrk per arm")
    parser.add_argument("--connections", type=int, default=d.connections)
    parser.add_argument("--flips", type=int, default=d.flips, help="flips per data plane")
    parser.add_argument("--flip-rate", type=float, default=d.flip_rate)
    parser.add_argument(
        "--kubeconfig", type=Path, help="use this running cluster instead of starting one"
    )
    parser.add_argument("--out", type=Path, default=Path("bench/results/dataplanes.json"))


def main(args: argparse.Namespace) -> int:
    setup = Setup(
        rounds=args.rounds,
        rate=args.rate,
        latency_s=args.latency_s,
        duration_s=args.duration_s,
        connections=args.connections,
        flips=args.flips,
        flip_rate=args.flip_rate,
        kubeconfig=args.kubeconfig,
    )
    with cluster_for(FlipSetup(kubeconfig=setup.kubeconfig)) as (cluster, namespace):
        report = asyncio.run(run(cluster, namespace, setup))
    results.write(report, args.out)
    print(f"Results in {args.out}")
    return 0
