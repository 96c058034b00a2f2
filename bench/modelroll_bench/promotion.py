"""A promotion under load on a cluster whose pods run, with the chart's operator and gateway:
what ``make bench-promote`` measures and tests/node/test_promotion_on_node.py checks.

Model ``promoted``: ``promote-stable`` (``stable_replicas`` replicas, weight 100) and
``promote-canary`` (one replica, weight 0), both the demo model sized to a known capacity
(:class:`StandIn`). Open-loop Poisson load through the gateway's Service at ``load`` times the
stable's capacity; then ``kubectl modelroll promote promote-canary``, and once the promotion is
in force and has been watched, ``kubectl modelroll rollback promote-canary``. Every request is
recorded with the version that answered it; a sampler reads, every :data:`SAMPLE_S`, the ready
replicas of both Deployments and then the weights the gateway routes by, so the replicas a
version had when its weight came into force are those of the sample that first shows the new
weights (read just before the gateway was).
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import subprocess
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from kubernetes import client as k8s
from kubernetes import config as k8s_config

from modelroll_common.routes import VERSION_HEADER
from modelroll_devcluster import Cluster
from modelroll_devcluster.stack import venv_script
from modelroll_devcluster.traffic import BackgroundLoad, Response

from .loadgen import poisson_times
from .stats import percentile

MODEL = "promoted"
STABLE, CANARY = "promote-stable", "promote-canary"
VERSIONS = (STABLE, CANARY)
FULL = 100
"""The stable's weight before the promotion; the promotion gives it all to the canary."""
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "managed" / "sentiment-stable.yaml"
SAMPLE_S = 0.2
KUBE_PROXY_SYNC_S = 2.0
"""How long kube-proxy may take to apply an EndpointSlice change to its rules: its
minSyncPeriod (1 s by default) and the time to write them. Connections the gateway opens before
that all go to the endpoints it had, and it keeps them (--upstream-connection-max-age)."""
SETTLE_TIMEOUT_S = 240.0
"""The longest a shift may take to come into force: pods started on a small node."""
PHASES = ("before", "promoting", "promoted", "rolling back", "rolled back")
FAILURE_KINDS = ("5xx", "429", "connection", "other")


@dataclass(frozen=True)
class StandIn:
    """The demo model with a known capacity per replica. With the sidecar's maxBatchSize 1
    every request is one model call of ``fixed_ms`` (no per-token cost); ``parallel`` calls run
    at once (the model's slots and the sidecar's concurrent batches), so a replica serves
    ``parallel x 1000 / fixed_ms`` requests a second. Beyond that, ``queue`` requests wait in
    the sidecar and the next are refused with 429."""

    fixed_ms: float = 400.0
    parallel: int = 8
    queue: int = 32

    @property
    def replica_rps(self) -> float:
        return self.parallel * 1000.0 / self.fixed_ms


@dataclass(frozen=True)
class Plan:
    """The scenario: the versions, the load and how long each phase is watched."""

    stable_replicas: int = 3
    load: float = 0.7
    """Offered load as a fraction of the stable's capacity."""
    warmup_s: float = 2.0
    """Load sent before anything is counted (the gateway's first connections)."""
    before_s: float = 6.0
    """Load watched before the promotion."""
    after_s: float = 6.0
    """Load watched once a shift has settled, after the promotion and after the rollback."""
    settle_s: float = 2.0
    """After a shift comes into force, the time its new connections take to open: part of the
    shift's phase."""
    stand_in: StandIn = field(default_factory=StandIn)
    seed: int = 1

    @property
    def rate(self) -> float:
        """Requests per second offered."""
        return self.load * self.stable_replicas * self.stand_in.replica_rps

    @property
    def slo_ms(self) -> float:
        """The p99 every phase must keep: five model calls. At 70% load the queueing and the
        hops through the gateway and the sidecar keep p99 under two calls; the rest is for the
        canary's new pods, which start on the same small node that serves (on two shared cores,
        up to five calls while they start). One replica given twice its capacity keeps its
        queue full: every accepted request waits about ``queue / replica_rps`` seconds, and the
        rest get 429."""
        return 5 * self.stand_in.fixed_ms


def manifest(name: str, weight: int, replicas: int, stand_in: StandIn) -> dict[str, Any]:
    """A managed ModelVersion of the demo model (the image of examples/managed/) at the stand-in's
    capacity."""
    example: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text())
    server = dict(example["spec"]["server"])
    server["args"] = [
        "--port=8080",
        f"--fixed-ms={stand_in.fixed_ms:g}",
        "--per-token-ms=0",
        f"--parallel={stand_in.parallel}",
    ]
    return {
        "apiVersion": example["apiVersion"],
        "kind": "ModelVersion",
        "metadata": {"name": name},
        "spec": {
            "model": MODEL,
            "weight": weight,
            "replicas": replicas,
            "server": server,
            "batching": {
                "maxBatchSize": 1,
                "maxWaitMs": 0,
                "maxConcurrentBatches": stand_in.parallel,
                "maxQueueSize": stand_in.queue,
                "timeoutMs": 30000,
            },
        },
    }


def manifests(plan: Plan) -> str:
    docs = [
        manifest(STABLE, FULL, plan.stable_replicas, plan.stand_in),
        manifest(CANARY, 0, 1, plan.stand_in),
    ]
    return "\n---\n".join(json.dumps(d) for d in docs)


class OpenLoad(BackgroundLoad[Response]):
    """Poisson arrivals at ``rate`` per second on ``POST {gateway}/v1/models/{model}/infer``
    from a background thread, whatever the answers (open loop). A request's ``sent`` is its
    scheduled arrival, so a generator that falls behind charges the wait to the system.
    ``status`` 0: no HTTP answer (refused, reset, timed out)."""

    def __init__(self, gateway: str, model: str, rate: float, *, seed: int = 1) -> None:
        super().__init__(timeout=30.0)
        self.url = f"{gateway}/v1/models/{model}/infer"
        self.rate = rate
        self.seed = seed
        self._body = json.dumps({"payload": "a request of a few words"}).encode()

    async def _run(self) -> None:
        timeout = aiohttp.ClientTimeout(total=self.timeout)
        headers = {"Content-Type": "application/json"}
        pending: set[asyncio.Task[None]] = set()
        async with aiohttp.ClientSession(
            timeout=timeout, connector=aiohttp.TCPConnector(limit=0), headers=headers
        ) as http:
            start = time.monotonic()
            for i, at in enumerate(poisson_times(random.Random(self.seed), self.rate, math.inf)):
                if self._stop.is_set():
                    break
                due = start + at
                if (delay := due - time.monotonic()) > 0:
                    await asyncio.sleep(delay)
                task = asyncio.create_task(self._call(http, i, due))
                pending.add(task)
                task.add_done_callback(pending.discard)
            await asyncio.gather(*pending)

    async def _call(self, http: aiohttp.ClientSession, i: int, due: float) -> None:
        try:
            async with http.post(self.url, data=self._body) as resp:
                await resp.read()
                version = resp.headers.get(VERSION_HEADER, "")
                self.records.append(Response(i, due, time.monotonic(), resp.status, version))
        except (aiohttp.ClientError, TimeoutError) as exc:
            error = f"{type(exc).__name__}: {exc}"
            self.records.append(Response(i, due, time.monotonic(), 0, "", error))


def failure_kind(status: int) -> str | None:
    """None for a success; else which kind of failure a user sees."""
    if 200 <= status < 300:
        return None
    if status == 0:
        return "connection"
    if status == 429:
        return "429"
    return "5xx" if status >= 500 else "other"


@dataclass(frozen=True)
class Sample:
    """What the sampler read at ``at`` (seconds from the load's start): each version's ready
    replicas (its Deployment's status), the rising version's ready endpoints (its Service's
    EndpointSlices), then the weights the gateway routes by."""

    at: float
    ready: dict[str, int]
    endpoints: dict[str, int]
    weights: dict[str, int]


@dataclass(frozen=True)
class Shift:
    """One command that moves the weights (promote or rollback), as the sampler saw it."""

    command: str
    rising: str
    """The version whose share rose."""
    issued_s: float
    in_force_s: float
    """The first sample whose gateway weights were the command's."""
    ready_at_force: int
    """The rising version's ready replicas in that sample."""
    endpoints_at_force: int
    """The rising version's ready endpoints in that sample."""
    others_min_ready: int
    """The fewest ready replicas the other version had in any sample until then."""
    waited_for_capacity: bool
    """Whether the rising version's Capacity condition said WaitingForReplicas meanwhile."""
    output: str
    """What the plugin printed."""

    @property
    def to_force_s(self) -> float:
        return self.in_force_s - self.issued_s


@dataclass(frozen=True)
class Answer:
    """One request of the load: when it was sent (seconds from the load's start), its latency,
    status (0: no HTTP answer) and the version that answered."""

    sent_s: float
    latency_s: float
    status: int
    version: str


@dataclass(frozen=True)
class PromotionRun:
    """One promotion and its rollback under load."""

    label: str
    rate: float
    promote: Shift
    rollback: Shift
    phases: dict[str, tuple[float, float]]
    """Phase name to (start, end) in seconds from the load's start, by request sent time."""
    answers: list[Answer]
    ready_after: dict[str, int]
    """Each version's ready replicas once the promotion had settled."""


class ApiReads:
    """The API reads the sampler makes, through the Python client (quicker than kubectl)."""

    def __init__(self, kubeconfig: Path, namespace: str) -> None:
        api = k8s_config.new_client_from_config(str(kubeconfig))  # type: ignore[no-untyped-call]
        self.apps = k8s.AppsV1Api(api)
        self.custom = k8s.CustomObjectsApi(api)
        self.discovery = k8s.DiscoveryV1Api(api)
        self.namespace = namespace

    def ready(self, name: str) -> int:
        status = self.apps.read_namespaced_deployment_status(name, self.namespace).status
        return int((status.ready_replicas if status else None) or 0)

    def endpoints(self, name: str) -> int:
        """Ready addresses in the EndpointSlices of the version's Service: the pods kube-proxy
        spreads new connections over once it has synced."""
        slices = self.discovery.list_namespaced_endpoint_slice(
            self.namespace, label_selector=f"kubernetes.io/service-name={name}"
        )
        return sum(
            1
            for piece in slices.items
            for e in piece.endpoints or []
            if e.conditions is not None and e.conditions.ready
        )

    def capacity_reason(self, name: str) -> str:
        mv: dict[str, Any] = self.custom.get_namespaced_custom_object(  # type: ignore[assignment]
            "modelroll.io", "v1alpha1", self.namespace, "modelversions", name
        )
        for c in (mv.get("status") or {}).get("conditions") or []:
            if c.get("type") == "Capacity" and c.get("status") == "False":
                return str(c.get("reason") or "")
        return ""


def gateway_weights(admin_url: str) -> dict[str, int]:
    """{version: weight} of the model as the gateway routes it now."""
    with urllib.request.urlopen(f"{admin_url}/v1/routes", timeout=5) as resp:  # noqa: S310
        doc = json.load(resp)
    for model in doc["models"]:
        if model["model"] == MODEL:
            return {v["name"]: int(v["weight"]) for v in model["versions"]}
    return {}


def routed_by(weights: dict[str, int], wanted: dict[str, int]) -> bool:
    """Whether the gateway's weights give each version the share ``wanted`` gives it."""
    total, want = sum(weights.values()), sum(wanted.values())
    if not total or not want:
        return False
    return all(weights.get(v, 0) * want == w * total for v, w in wanted.items())


@dataclass
class Target:
    """Where the chart runs: the cluster, the release's namespace (the versions go there), and
    the gateway's Service and admin port as this host reaches them."""

    cluster: Cluster
    namespace: str
    gateway_url: str
    admin_url: str

    def plugin(self, *args: str) -> subprocess.Popen[str]:
        argv = [
            venv_script("kubectl-modelroll"),
            f"--kubeconfig={self.cluster.kubeconfig}",
            f"--namespace={self.namespace}",
            *args,
        ]
        return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


class PromotionError(Exception):
    """The scenario could not go on (a version never became Ready, a shift never settled)."""


def wait_until(what: str, check: Callable[[], bool], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise PromotionError(f"{what} did not happen within {timeout_s:g} s")
        time.sleep(SAMPLE_S)


def deploy(target: Target, api: ApiReads, plan: Plan) -> None:
    """Apply both versions and wait until they are Ready with every replica, each replica an
    endpoint of its Service, and routed 100/0."""
    target.cluster.kubectl("apply", "-f", "-", namespace=target.namespace, input=manifests(plan))
    target.cluster.kubectl(
        "wait",
        "--for=condition=Ready",
        f"--timeout={SETTLE_TIMEOUT_S:g}s",
        *(f"mv/{v}" for v in VERSIONS),
        namespace=target.namespace,
    )
    for version in VERSIONS:
        target.cluster.kubectl(
            "rollout",
            "status",
            f"deployment/{version}",
            f"--timeout={SETTLE_TIMEOUT_S:g}s",
            namespace=target.namespace,
        )
    wanted = {STABLE: plan.stable_replicas, CANARY: 1}
    wait_until(
        f"ready endpoints {wanted}",
        lambda: all(api.endpoints(v) == n for v, n in wanted.items()),
        60,
    )
    time.sleep(KUBE_PROXY_SYNC_S)
    wait_until(
        "the gateway routing promote-stable alone",
        lambda: routed_by(gateway_weights(target.admin_url), {STABLE: FULL, CANARY: 0}),
        60,
    )


def remove(target: Target) -> None:
    """Delete both versions and wait until their pods are gone."""
    target.cluster.kubectl(
        "delete",
        "mv",
        *VERSIONS,
        "--ignore-not-found",
        f"--timeout={SETTLE_TIMEOUT_S:g}s",
        namespace=target.namespace,
    )
    target.cluster.kubectl(
        "wait",
        "--for=delete",
        "pod",
        "-l",
        f"modelroll.io/model={MODEL}",
        f"--timeout={SETTLE_TIMEOUT_S:g}s",
        namespace=target.namespace,
        check=False,
    )


def shift(
    target: Target,
    api: ApiReads,
    command: str,
    rising: str,
    wanted: dict[str, int],
    start: float,
    samples: list[Sample],
) -> Shift:
    """Run ``kubectl modelroll <command> promote-canary`` and sample until the gateway routes by
    ``wanted``, then until the plugin has returned."""
    issued = time.monotonic()
    process = target.plugin(command, CANARY, "--wait=120")
    waited = False
    in_force: Sample | None = None
    first = len(samples)
    deadline = issued + SETTLE_TIMEOUT_S
    while in_force is None:
        if time.monotonic() > deadline:
            process.kill()
            raise PromotionError(
                f"`kubectl modelroll {command}` not in force within {SETTLE_TIMEOUT_S:g} s; "
                f"last sample {samples[-1] if samples else None}"
            )
        ready = {v: api.ready(v) for v in VERSIONS}
        endpoints = {rising: api.endpoints(rising)}
        waited = waited or api.capacity_reason(rising) == "WaitingForReplicas"
        at = time.monotonic() - start
        sample = Sample(at, ready, endpoints, gateway_weights(target.admin_url))
        samples.append(sample)
        if routed_by(sample.weights, wanted):
            in_force = sample
        else:
            time.sleep(SAMPLE_S)
    output, _ = process.communicate(timeout=SETTLE_TIMEOUT_S)
    if process.returncode != 0:
        raise PromotionError(f"`kubectl modelroll {command}` exited {process.returncode}: {output}")
    return Shift(
        command,
        rising,
        round(issued - start, 3),
        round(in_force.at, 3),
        in_force.ready[rising],
        in_force.endpoints[rising],
        min(x.ready[v] for x in samples[first:] for v in VERSIONS if v != rising),
        waited,
        output,
    )


def promote_and_roll_back(target: Target, plan: Plan, label: str) -> PromotionRun:
    """The whole scenario on freshly deployed versions (removed again afterwards)."""
    api = ApiReads(target.cluster.kubeconfig, target.namespace)
    remove(target)
    deploy(target, api, plan)
    samples: list[Sample] = []
    try:
        with OpenLoad(target.gateway_url, MODEL, plan.rate, seed=plan.seed) as load:
            start = time.monotonic()
            time.sleep(plan.warmup_s + plan.before_s)
            promoted = shift(target, api, "promote", CANARY, {CANARY: 1, STABLE: 0}, start, samples)
            time.sleep(plan.settle_s + plan.after_s)
            ready_after = {v: api.ready(v) for v in VERSIONS}
            rolled = shift(target, api, "rollback", STABLE, {STABLE: 1, CANARY: 0}, start, samples)
            time.sleep(plan.settle_s + plan.after_s)
            end = time.monotonic() - start
        records = load.since(start)
    finally:
        remove(target)
    answers = [
        Answer(round(r.sent - start, 4), round(r.latency, 4), r.status, r.version) for r in records
    ]
    marks = [
        plan.warmup_s,
        promoted.issued_s,
        promoted.in_force_s + plan.settle_s,
        rolled.issued_s,
        rolled.in_force_s + plan.settle_s,
        end,
    ]
    phases = {p: (marks[i], marks[i + 1]) for i, p in enumerate(PHASES)}
    return PromotionRun(label, plan.rate, promoted, rolled, phases, answers, ready_after)


# -- what a run shows ----------------------------------------------------------------------


@dataclass(frozen=True)
class Window:
    """The requests sent in one phase: how many, the failures by kind, who answered, and the
    latency percentiles of the successful ones (ms; None without any)."""

    phase: str
    requests: int
    failures: dict[str, int]
    answered_by: dict[str, int]
    failed_by: dict[str, int]
    """Failures by the version that answered them ('-': none did)."""
    p50_ms: float | None
    p95_ms: float | None
    p99_ms: float | None

    @property
    def failed(self) -> int:
        return sum(self.failures.values())


def window(phase: str, answers: Sequence[Answer]) -> Window:
    kinds: Counter[str] = Counter()
    failed_by: Counter[str] = Counter()
    for a in answers:
        if (kind := failure_kind(a.status)) is not None:
            kinds[kind] += 1
            failed_by[a.version or "-"] += 1
    ok = [a.latency_s for a in answers if failure_kind(a.status) is None]
    p50, p95, p99 = (percentile(ok, q) for q in (0.50, 0.95, 0.99))
    return Window(
        phase,
        len(answers),
        {k: kinds[k] for k in FAILURE_KINDS if kinds[k]},
        dict(sorted(Counter(a.version or "-" for a in answers).items())),
        dict(sorted(failed_by.items())),
        *(None if p is None else round(p * 1000, 1) for p in (p50, p95, p99)),
    )


def windows(run: PromotionRun) -> list[Window]:
    """The run's requests per phase, by the time each was sent."""
    return [
        window(p, [a for a in run.answers if low <= a.sent_s < high])
        for p, (low, high) in run.phases.items()
    ]


def per_second(run: PromotionRun) -> list[Window]:
    """The run's requests in one-second windows, named by their start: failures and latency over
    time."""
    seconds = math.ceil(max((a.sent_s for a in run.answers), default=0.0)) + 1
    buckets: list[list[Answer]] = [[] for _ in range(seconds)]
    for a in run.answers:
        buckets[int(a.sent_s)].append(a)
    return [window(f"{i}s", b) for i, b in enumerate(buckets)]
