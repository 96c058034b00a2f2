"""``modelroll-bench rollback`` (``make bench-rollback``): how long a rollback takes to stop
traffic, on a real control plane.

Two stand-in versions of one model (``stable`` and ``canary``, weight 1 each, external endpoints
that record when each request reaches them) sit behind a real ``modelroll-gateway`` watching the
routes ConfigMap, with Poisson load through the gateway the whole time. Each flip sets the
canary's weight to 0 and measures from the moment ``kubectl patch`` starts to the last request
that reaches the canary; then the weight goes back to 1 (the time to the canary's first request
is reported as well) before the next flip. A watch of the ConfigMap (the official client's, as
the gateway's) also times the patch -> ConfigMap step alone. Two modes, in this order:

``configmap``: the gateway's half: ``kubectl patch`` of the routes ConfigMap, no operator running.
``operator``:  the whole path: ``kubectl patch modelversion canary`` -> modelroll-operator ->
               ConfigMap -> gateway.

The control plane is started for the run (``make cluster-bins`` builds it) unless ``--kubeconfig``
names a running one. Resolution: the canary gets half the load, so with ``--rate`` R a delay is
known to within about 2/R seconds (the gap between two of its requests).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import aiohttp
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes import watch as k8s_watch
from urllib3.exceptions import ProtocolError

from modelroll_common.routes import CONFIGMAP_NAME, ModelRoute, VersionRoute, configmap_patch
from modelroll_devcluster import Cluster, ControlPlane, namespace_name
from modelroll_devcluster.processes import free_port

from . import plots
from .runs import bar, load_average, machine
from .stats import percentile
from .systems import serve

MODEL = "bench"
VERSIONS = ("stable", "canary")
CRD = Path(__file__).resolve().parents[2] / "crds" / "modelversion.yaml"


@dataclass(frozen=True)
class Setup:
    flips: int = 20
    rate: float = 400.0
    """Requests per second through the gateway, all the time."""
    quiet_s: float = 1.0
    """The canary has stopped once it got nothing for this long while the stable version did."""
    timeout_s: float = 15.0
    modes: tuple[str, ...] = ("configmap", "operator")
    kubeconfig: Path | None = None


class Load:
    """Poisson arrivals through the gateway until stopped; answers counted by status."""

    def __init__(self, url: str, rate: float, seed: int = 1) -> None:
        self.url = url
        self.rate = rate
        self.rng = random.Random(seed)
        self.statuses: Counter[int] = Counter()
        self.stopping = asyncio.Event()

    async def run(self) -> None:
        body = json.dumps({"payload": "a short request"}).encode()
        headers = {"Content-Type": "application/json"}
        tasks: set[asyncio.Task[None]] = set()
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=connector) as http:

            async def send() -> None:
                try:
                    async with http.post(self.url, data=body, headers=headers) as resp:
                        await resp.read()
                        self.statuses[resp.status] += 1
                except (aiohttp.ClientError, TimeoutError):
                    self.statuses[599] += 1

            due = time.monotonic()
            while not self.stopping.is_set():
                due += self.rng.expovariate(self.rate)
                if (delay := due - time.monotonic()) > 0:
                    await asyncio.sleep(delay)
                task = asyncio.create_task(send())
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            if tasks:
                await asyncio.wait(tasks)


async def arrivals(http: aiohttp.ClientSession, recorder: str, after: float) -> dict[str, Any]:
    async with http.get(recorder + "/arrivals", params={"after": repr(after)}) as resp:
        resp.raise_for_status()
        answer: dict[str, Any] = await resp.json()
        return answer


async def stopped_at(
    http: aiohttp.ClientSession, recorders: dict[str, str], t0: float, setup: Setup
) -> float | None:
    """When the canary got its last request after ``t0``: once it has had none for ``quiet_s``
    while the stable version kept getting them. ``t0`` itself if it got none; None on timeout."""
    while time.monotonic() < t0 + setup.timeout_s:
        canary = await arrivals(http, recorders["canary"], t0)
        last = canary["last"] if canary["count"] else t0
        now = time.monotonic()
        if now - last >= setup.quiet_s:
            stable = await arrivals(http, recorders["stable"], last + setup.quiet_s / 2)
            if stable["count"]:
                return float(last)
        await asyncio.sleep(0.05)
    return None


async def resumed_at(
    http: aiohttp.ClientSession, recorders: dict[str, str], t0: float, setup: Setup
) -> float | None:
    """When the canary got its first request after ``t0``; None on timeout."""
    while time.monotonic() < t0 + setup.timeout_s:
        canary = await arrivals(http, recorders["canary"], t0)
        if canary["count"]:
            return float(canary["first"])
        await asyncio.sleep(0.02)
    return None


class WeightChanges:
    """When each change of one object reached a watch of it (the official client's, in a thread),
    with the canary's weight as that object says it."""

    def __init__(
        self,
        list_call: Callable[..., Any],
        weight_of: Callable[[dict[str, Any]], int | None],
        *args: str,
        name: str,
    ) -> None:
        self.seen: list[tuple[float, int | None]] = []
        self.watch = k8s_watch.Watch()  # type: ignore[no-untyped-call]
        events = self.watch.stream(  # type: ignore[no-untyped-call]
            list_call, *args, field_selector=f"metadata.name={name}"
        )

        def follow() -> None:
            # The API server stopping at the end of a run ends the watch mid-chunk.
            with contextlib.suppress(ProtocolError):
                for event in events:
                    self.seen.append((time.monotonic(), weight_of(event["raw_object"])))

        threading.Thread(target=follow, name=f"watch-{name}", daemon=True).start()

    @classmethod
    def of_configmap(cls, client: k8s.ApiClient, namespace: str) -> WeightChanges:
        def weight_of(configmap: dict[str, Any]) -> int | None:
            document = json.loads((configmap.get("data") or {}).get(MODEL) or "{}")
            weights = {v["name"]: v["weight"] for v in document.get("versions", [])}
            return weights.get("canary")

        api = k8s.CoreV1Api(client)
        return cls(api.list_namespaced_config_map, weight_of, namespace, name=CONFIGMAP_NAME)

    @classmethod
    def of_httproute(cls, client: k8s.ApiClient, namespace: str, name: str) -> WeightChanges:
        """The weight of the canary's backendRef (its Service, ``canary``) in an HTTPRoute."""

        def weight_of(route: dict[str, Any]) -> int | None:
            for rule in (route.get("spec") or {}).get("rules") or []:
                for ref in rule.get("backendRefs") or []:
                    if ref.get("name") == "canary":
                        return int(ref.get("weight", 1))
            return None

        api = k8s.CustomObjectsApi(client)
        return cls(
            api.list_namespaced_custom_object,
            weight_of,
            "gateway.networking.k8s.io",
            "v1",
            namespace,
            "httproutes",
            name=name,
        )

    @classmethod
    def of_canary(cls, client: k8s.ApiClient, namespace: str) -> WeightChanges:
        def weight_of(version: dict[str, Any]) -> int | None:
            weight = (version.get("spec") or {}).get("weight")
            return weight if isinstance(weight, int) else None

        api = k8s.CustomObjectsApi(client)
        return cls(
            api.list_namespaced_custom_object,
            weight_of,
            "modelroll.io",
            "v1alpha1",
            namespace,
            "modelversions",
            name="canary",
        )

    def stop(self) -> None:
        self.watch.stop()  # type: ignore[no-untyped-call]

    async def started(self, timeout_s: float = 30.0) -> None:
        """Once the watch has listed the object: later events are changes, not the start."""

        async def listed() -> bool:
            return bool(self.seen)

        await wait_for("the first event of a watch", listed, timeout_s)

    async def changed(self, after: float, canary_weight: int, timeout_s: float) -> float | None:
        """When the object first showed ``canary_weight`` after ``after``; None on timeout."""
        while time.monotonic() < after + timeout_s:
            for at, weight in self.seen:
                if at > after and weight == canary_weight:
                    return at
            await asyncio.sleep(0.005)
        return None


def timed(action: Callable[[], object]) -> tuple[float, float]:
    """Run ``action``; (monotonic time it started, seconds it took)."""
    started = time.monotonic()
    action()
    return started, time.monotonic() - started


class Routes:
    """How a mode changes the canary's weight, as one ``kubectl patch``."""

    def __init__(self, cluster: Cluster, namespace: str, recorders: dict[str, str]) -> None:
        self.cluster = cluster
        self.namespace = namespace
        self.recorders = recorders

    def route(self, canary_weight: int) -> ModelRoute:
        weights = {"stable": 1, "canary": canary_weight}
        versions = tuple(VersionRoute(v, weights[v], self.recorders[v]) for v in VERSIONS)
        return ModelRoute(MODEL, versions)

    def patch_configmap(self, canary_weight: int) -> None:
        patch = json.dumps(configmap_patch(self.route(canary_weight)))
        self.cluster.kubectl(
            "patch",
            "configmap",
            CONFIGMAP_NAME,
            "--type=merge",
            "-p",
            patch,
            namespace=self.namespace,
        )

    def patch_version(self, canary_weight: int) -> None:
        patch = json.dumps({"spec": {"weight": canary_weight}})
        self.cluster.kubectl(
            "patch",
            "modelversion",
            "canary",
            "--type=merge",
            "-p",
            patch,
            namespace=self.namespace,
        )

    def create_configmap(self) -> None:
        self.cluster.apply(
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": CONFIGMAP_NAME},
                **configmap_patch(self.route(1)),
            },
            namespace=self.namespace,
        )

    def create_versions(self) -> None:
        for version in VERSIONS:
            self.cluster.apply(
                {
                    "apiVersion": "modelroll.io/v1alpha1",
                    "kind": "ModelVersion",
                    "metadata": {"name": version},
                    "spec": {"model": MODEL, "weight": 1, "endpoint": self.recorders[version]},
                },
                namespace=self.namespace,
            )

    def routed_weight(self, version: str) -> str:
        """The weight the routes in force give ``version`` (its status.routedWeight)."""
        return self.cluster.kubectl(
            "get",
            "modelversion",
            version,
            "-o",
            "jsonpath={.status.routedWeight}",
            namespace=self.namespace,
            check=False,
        ).stdout


async def flips(
    mode: str,
    routes: Routes,
    recorders: dict[str, str],
    setup: Setup,
    configmap: WeightChanges,
    progress: Any,
    canary: WeightChanges | None = None,
) -> list[dict[str, Any]]:
    """``configmap``: a watch of what the data plane follows (the routes ConfigMap, or an
    HTTPRoute); ``canary``: a watch of the canary ModelVersion, to time the operator's step
    alone."""
    patch = routes.patch_configmap if mode == "configmap" else routes.patch_version
    rows: list[dict[str, Any]] = []
    for watch in (configmap, canary):
        if watch is not None:
            await watch.started()
    async with aiohttp.ClientSession() as http:
        for i in range(1, setup.flips + 1):
            progress.set_postfix_str(f"{mode} flip {i}")
            t0, kubectl_s = await asyncio.to_thread(timed, lambda: patch(0))
            written = await configmap.changed(t0, 0, setup.timeout_s)
            patched = await canary.changed(t0, 0, setup.timeout_s) if canary else None
            last = await stopped_at(http, recorders, t0, setup)
            t1, _ = await asyncio.to_thread(timed, lambda: patch(1))
            first = await resumed_at(http, recorders, t1, setup)
            rows.append(
                {
                    "flip": i,
                    "rollback_ms": None if last is None else round((last - t0) * 1000, 1),
                    "restore_ms": None if first is None else round((first - t1) * 1000, 1),
                    "kubectl_ms": round(kubectl_s * 1000, 1),
                    "configmap_ms": None if written is None else round((written - t0) * 1000, 1),
                    "operator_ms": (
                        round((written - patched) * 1000, 1) if written and patched else None
                    ),
                }
            )
            progress.update()
            await asyncio.sleep(0.3)
    return rows


@dataclass(frozen=True)
class Delays:
    """One delay over the flips: p50/p99 (None where every flip timed out), the range, and the
    flips that timed out and that did not."""

    p50_ms: float | None
    p99_ms: float | None
    max_ms: float | None
    min_ms: float | None
    timeouts: int
    samples: int


def summarize(rows: list[dict[str, Any]], key: str) -> Delays:
    values = [r[key] for r in rows if r[key] is not None]
    p50, p99 = percentile(values, 0.50), percentile(values, 0.99)
    return Delays(
        p50_ms=None if p50 is None else round(p50, 1),
        p99_ms=None if p99 is None else round(p99, 1),
        max_ms=max(values, default=None),
        min_ms=min(values, default=None),
        timeouts=sum(1 for r in rows if r[key] is None),
        samples=len(values),
    )


async def wait_for(what: str, check: Callable[[], Any], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not await check():
        if time.monotonic() > deadline:
            raise SystemExit(f"modelroll-bench rollback: {what} did not happen in {timeout_s:g} s")
        await asyncio.sleep(0.1)


async def run(cluster: Cluster, namespace: str, setup: Setup, plots_dir: Path) -> dict[str, Any]:
    python = sys.executable
    ports = {v: free_port() for v in VERSIONS}
    recorders = {v: f"http://127.0.0.1:{p}" for v, p in ports.items()}
    routes = Routes(cluster, namespace, recorders)
    await asyncio.to_thread(routes.create_configmap)
    gport = free_port()
    kube = ["--kubeconfig", str(cluster.kubeconfig), "--namespace", namespace]
    gateway = [python, "-m", "modelroll_gateway", "--host", "127.0.0.1", "--port", str(gport)]
    gateway += ["--admin-port", "0"]  # no metrics read here
    report: dict[str, Any] = {
        "setup": {**asdict(setup), "kubeconfig": str(setup.kubeconfig or "")},
        "modes": {},
    }
    report["machine"] = machine()
    async with (
        serve(
            [python, "-m", "modelroll_bench.recorder", *map(str, ports.values())], ports["stable"]
        ),
        serve([*gateway, *kube, "--log-level", "WARNING"], gport) as gw,
        aiohttp.ClientSession() as http,
    ):
        load = Load(f"{gw}/v1/models/{MODEL}/infer", setup.rate)
        loading = asyncio.create_task(load.run())
        client = k8s_config.new_client_from_config(str(cluster.kubeconfig))  # type: ignore[no-untyped-call]
        try:
            started = time.monotonic()

            async def both_routed() -> bool:
                got = [await arrivals(http, recorders[v], started) for v in VERSIONS]
                return all(g["count"] for g in got)

            await wait_for("traffic to both versions", both_routed)
            with bar(setup.flips * len(setup.modes), "rollback", unit="flip") as progress:
                for mode in setup.modes:
                    before = Counter(load.statuses)
                    if mode == "operator":
                        rows = await with_operator(
                            cluster, namespace, routes, recorders, setup, client, progress
                        )
                    else:
                        configmap = WeightChanges.of_configmap(client, namespace)
                        try:
                            rows = await flips(mode, routes, recorders, setup, configmap, progress)
                        finally:
                            configmap.stop()
                    errors = {
                        str(c): n - before.get(c, 0)
                        for c, n in load.statuses.items()
                        if not 200 <= c < 300 and n - before.get(c, 0)
                    }
                    report["modes"][mode] = {
                        "rollback": summarize(rows, "rollback_ms"),
                        "restore": summarize(rows, "restore_ms"),
                        "kubectl": summarize(rows, "kubectl_ms"),
                        "configmap": summarize(rows, "configmap_ms"),
                        "operator": summarize(rows, "operator_ms"),
                        "errors": errors,
                        "flips": rows,
                    }
        finally:
            load.stopping.set()
            await loading
    report["requests"] = {str(c): n for c, n in sorted(load.statuses.items())}
    report["load_average_1m_end"] = round(load_average(), 2)
    print_report(report, setup)
    delays = {
        f"{mode} (p50 {_ms(m['rollback'].p50_ms)}, p99 {_ms(m['rollback'].p99_ms)} ms)": [
            r["rollback_ms"] for r in m["flips"] if r["rollback_ms"] is not None
        ]
        for mode, m in report["modes"].items()
    }
    mode = list(report["modes"])[-1]
    kubectl = (mode, [r["kubectl_ms"] for r in report["modes"][mode]["flips"]])
    title = f"Rollback: kubectl patch -> last request to the version ({setup.rate:g} req/s)"
    written = plots.rollback(delays, kubectl, title, plots_dir)
    print("Plots: " + ", ".join(str(p) for p in written))
    return report


async def with_operator(
    cluster: Cluster,
    namespace: str,
    routes: Routes,
    recorders: dict[str, str],
    setup: Setup,
    client: k8s.ApiClient,
    progress: Any,
) -> list[dict[str, Any]]:
    """Start the operator, hand it the route as two ModelVersions, and flip through it."""
    await asyncio.to_thread(
        cluster.kubectl, "apply", "--server-side", "--force-conflicts", "-f", str(CRD)
    )
    await asyncio.to_thread(cluster.wait_established, "modelversions.modelroll.io")
    operator = [sys.executable, "-m", "modelroll_operator", "--namespace", namespace]
    operator += ["--kubeconfig", str(cluster.kubeconfig), "--liveness", ""]
    operator += ["--log-level", "WARNING"]
    with tempfile.TemporaryFile() as log:
        proc = await asyncio.create_subprocess_exec(
            *operator, stdout=asyncio.subprocess.DEVNULL, stderr=log
        )
        try:
            await asyncio.to_thread(routes.create_versions)

            async def routed() -> bool:
                weights = [await asyncio.to_thread(routes.routed_weight, v) for v in VERSIONS]
                return weights == ["1", "1"] and proc.returncode is None

            await wait_for("the operator routing both ModelVersions", routed)
            configmap = WeightChanges.of_configmap(client, namespace)
            canary = WeightChanges.of_canary(client, namespace)
            try:
                return await flips(
                    "operator", routes, recorders, setup, configmap, progress, canary
                )
            finally:
                configmap.stop()
                canary.stop()
        finally:
            if proc.returncode is None:
                proc.terminate()
                await proc.wait()


def _ms(value: float | None) -> str:
    """A percentile in ms, or ``-`` where every sample timed out."""
    return "-" if value is None else f"{value:.1f}"


def print_report(report: dict[str, Any], setup: Setup) -> None:
    print(
        f"\n{setup.flips} flips per mode at {setup.rate:g} req/s through the gateway "
        f"(resolution about {2000 / setup.rate:.0f} ms)."
    )
    for mode, m in report["modes"].items():
        rb, rs, kc, cm = m["rollback"], m["restore"], m["kubectl"], m["configmap"]
        print(
            f"  {mode:<9} rollback p50 {_ms(rb.p50_ms):>7} ms  p99 {_ms(rb.p99_ms):>7} ms  "
            f"(min {rb.min_ms}, timeouts {rb.timeouts}); restore p50 {_ms(rs.p50_ms)} "
            f"p99 {_ms(rs.p99_ms)} ms; kubectl itself p50 {_ms(kc.p50_ms)} ms; "
            f"errors {m['errors'] or 0}\n"
            f"  {'':<9} kubectl patch -> ConfigMap change p50 {_ms(cm.p50_ms)} ms, "
            f"max {cm.max_ms} ms ({cm.samples} patches, timeouts {cm.timeouts})"
        )
        if (op := m["operator"]).samples:
            print(
                f"  {'':<9} ModelVersion change -> ConfigMap change (the operator) "
                f"p50 {_ms(op.p50_ms)} ms, max {op.max_ms} ms ({op.samples} patches)"
            )
    print(f"Requests by status: {report['requests']}")


@contextlib.contextmanager
def cluster_for(setup: Setup) -> Iterator[tuple[Cluster, str]]:
    """A cluster and a fresh namespace in it, removed afterwards (the whole control plane, if
    this run started it)."""
    if setup.kubeconfig is not None:
        cluster = Cluster.existing(setup.kubeconfig)
        namespace = cluster.create_namespace(namespace_name("bench-rollback"))
        try:
            yield cluster, namespace
        finally:
            cluster.delete_namespace(namespace)
        return
    with tempfile.TemporaryDirectory(prefix="modelroll-bench-") as tmp:
        print("Starting a local control plane ...", file=sys.stderr, flush=True)
        with ControlPlane(Path(tmp)) as plane:
            cluster = Cluster.local(plane)
            yield cluster, cluster.create_namespace("bench-rollback")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    d = Setup()
    parser.add_argument("--flips", type=int, default=d.flips, help="flips per mode (20)")
    parser.add_argument("--rate", type=float, default=d.rate, help="req/s through the gateway")
    parser.add_argument(
        "--mode",
        dest="modes",
        action="append",
        choices=["configmap", "operator"],
        help="measure only this mode (repeatable; default: both)",
    )
    parser.add_argument(
        "--kubeconfig", type=Path, help="use this running cluster instead of starting one"
    )
    parser.add_argument("--out", type=Path, default=Path("bench/results/rollback.json"))
    parser.add_argument("--plots", type=Path, default=Path("bench/results"))


def main(args: argparse.Namespace) -> int:
    setup = Setup(
        flips=args.flips,
        rate=args.rate,
        modes=tuple(args.modes or Setup.modes),
        kubeconfig=args.kubeconfig,
    )
    with cluster_for(setup) as (cluster, namespace):
        report = asyncio.run(run(cluster, namespace, setup, args.plots))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))
    print(f"Results in {args.out}")
    return 0
