"""``modelroll-bench promote`` (``make bench-promote``): a one-replica canary promoted under load
on the local node, with and without scale before shift, paired by round.

The scenario is :mod:`modelroll_bench.promotion`'s: a stable of ``--stable-replicas`` replicas of
the demo model at a known capacity (``--fixed-ms`` a call, ``--parallel`` calls at once, so
``parallel x 1000 / fixed_ms`` requests a second a replica; ``--queue`` more wait, the next get
429), a canary of one replica at weight 0, open-loop Poisson load at ``--load`` times the stable's
capacity through the chart's gateway, ``kubectl modelroll promote`` of the canary, and once that
has been watched, ``kubectl modelroll rollback``. Each round runs both arms on fresh versions, in
alternating order: the chart's operator with scale before shift (its default) and with
``operator.scaleBeforeShift=false`` (``--no-scale-before-shift``: the weights move at once),
switched with ``helm upgrade``.

Per arm: the requests of each phase (before, promoting: from the promote to 2 s after its weight
is in force, promoted, rolling back, rolled back) with their failures by kind (5xx, 429,
connection, other) and the p50/p95/p99 of the successful ones, medians over rounds; the
failures and p99 over time around the promote; the time from ``promote`` to the weight in force
(the wait for replicas) and the canary's ready replicas then; and the promoted phase's p99 of
the weights-at-once arm over scale before shift's, paired by round.

The node (``make node-bins``, ``make images``; root) is started here and the chart installed with
the images ``make images`` built, unless ``--kubeconfig`` names a cluster where the chart runs
(release ``modelroll`` in namespace ``modelroll``, its gateway's Service reachable from here).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from modelroll_devcluster import Cluster, ControlPlane, default_bin_dir
from modelroll_devcluster.node import Node, detect_node_ip

from .figures import PairedRatio
from .promotion import (
    CANARY,
    PHASES,
    Plan,
    PromotionRun,
    StandIn,
    Target,
    Window,
    promote_and_roll_back,
    window,
    windows,
)
from .servers import Check
from .stats import Spread, spread
from .suite import Suite, markdown

RELEASE = NAMESPACE = "modelroll"
CHART = Path(__file__).resolve().parents[2] / "charts" / "modelroll"
ARMS = {"scale before shift": True, "weights at once": False}
"""Each arm's operator.scaleBeforeShift."""
LOCAL_VALUES = ("operator.image.pullPolicy=Never", "gateway.image.pullPolicy=Never")
"""The local node pulls nothing: the images `make images` imported are used as they are."""
TIMELINE_S = (-4, 20, 2)
"""The timeline around the promote: from, to and step, in seconds."""


@dataclass(frozen=True)
class Setup:
    rounds: int = 3
    plan: Plan = field(default_factory=Plan)
    kubeconfig: str | None = None
    arms: tuple[str, ...] = tuple(ARMS)


@dataclass(frozen=True)
class Round:
    index: int
    runs: list[PromotionRun]
    """Both arms, in the order they ran."""


@dataclass(frozen=True)
class Measured:
    rounds: list[Round]


@dataclass(frozen=True)
class Phase:
    """One phase of one arm over the rounds: requests and failures by kind summed, the
    percentiles' median and range."""

    phase: str
    requests: int
    failures: dict[str, int]
    p50_ms: Spread | None
    p95_ms: Spread | None
    p99_ms: Spread | None


@dataclass(frozen=True)
class Arm:
    arm: str
    phases: list[Phase]
    to_force_s: Spread | None
    """From ``promote`` to the canary's weight in force."""
    ready_at_force: list[int]
    """The canary's ready replicas then, per round."""
    endpoints_at_force: list[int]
    """The canary's ready endpoints (its Service's) then, per round."""
    rollback_to_force_s: Spread | None
    timeline: list[Window]
    """The first round's requests in windows around the promote, named by their start."""


@dataclass(frozen=True)
class Summary:
    rate: float
    replica_rps: float
    slo_ms: float
    arms: list[Arm]
    promoted_p99_ratio: PairedRatio
    """Weights at once over scale before shift: the promoted phase's p99, paired by round."""


def runs_of(measured: Measured, arm: str) -> list[PromotionRun]:
    return [run for r in measured.rounds for run in r.runs if run.label == arm]


def phases_of(runs: list[PromotionRun]) -> list[Phase]:
    per_run = [{w.phase: w for w in windows(run)} for run in runs]
    found = []
    for phase in PHASES:
        ws = [p[phase] for p in per_run]
        failures: dict[str, int] = {}
        for w in ws:
            for kind, n in w.failures.items():
                failures[kind] = failures.get(kind, 0) + n
        found.append(
            Phase(
                phase,
                sum(w.requests for w in ws),
                failures,
                spread([w.p50_ms for w in ws], 1),
                spread([w.p95_ms for w in ws], 1),
                spread([w.p99_ms for w in ws], 1),
            )
        )
    return found


def timeline(run: PromotionRun) -> list[Window]:
    """The run's requests in windows of TIMELINE_S around its promote."""
    start, stop, step = TIMELINE_S
    at = run.promote.issued_s
    return [
        window(f"{t:+d}s", [a for a in run.answers if at + t <= a.sent_s < at + t + step])
        for t in range(start, stop, step)
    ]


def summarize(setup: Setup, measured: Measured) -> Summary:
    arms = []
    for arm in setup.arms:
        runs = runs_of(measured, arm)
        arms.append(
            Arm(
                arm,
                phases_of(runs),
                spread([r.promote.to_force_s for r in runs], 2),
                [r.promote.ready_at_force for r in runs],
                [r.promote.endpoints_at_force for r in runs],
                spread([r.rollback.to_force_s for r in runs], 2),
                timeline(runs[0]) if runs else [],
            )
        )
    p99 = {a: [_promoted_p99(r) for r in runs_of(measured, a)] for a in ARMS}
    with_scaling, at_once = ARMS
    plan = setup.plan
    return Summary(
        plan.rate,
        plan.stand_in.replica_rps,
        plan.slo_ms,
        arms,
        PairedRatio.of(p99[at_once], p99[with_scaling]) if all(p99.values()) else PairedRatio(),
    )


def _promoted_p99(run: PromotionRun) -> float | None:
    (promoted,) = [w for w in windows(run) if w.phase == "promoted"]
    return promoted.p99_ms


def _spread(s: Spread | None, unit: str = "") -> str:
    if s is None:
        return "-"
    return f"{s.median:g}{unit} ({s.low:g}-{s.high:g})"


def _failures(failures: dict[str, int]) -> str:
    return ", ".join(f"{n} {k}" for k, n in failures.items()) or "0"


def render(setup: Setup, summary: Summary) -> str:
    plan = setup.plan
    head = (
        f"Promotion under load: stable {plan.stable_replicas} replicas x "
        f"{summary.replica_rps:g} req/s (demo model, {plan.stand_in.fixed_ms:g} ms a call, "
        f"{plan.stand_in.parallel} at once, queue {plan.stand_in.queue}), canary 1 replica; "
        f"{summary.rate:g} req/s offered ({plan.load:.0%} of the stable); SLO p99 "
        f"{summary.slo_ms:g} ms; {setup.rounds} paired rounds (medians, range)."
    )
    rows = [
        [
            a.arm,
            p.phase,
            str(p.requests),
            _failures(p.failures),
            _spread(p.p50_ms),
            _spread(p.p95_ms),
            _spread(p.p99_ms),
        ]
        for a in summary.arms
        for p in a.phases
    ]
    phases = markdown(["arm", "phase", "requests", "failed", "p50 ms", "p95 ms", "p99 ms"], rows)
    shifts = markdown(
        [
            "arm",
            "promote -> in force",
            "canary ready / endpoints then",
            "rollback -> in force",
        ],
        [
            [
                a.arm,
                _spread(a.to_force_s, " s"),
                ", ".join(
                    f"{r}/{e}" for r, e in zip(a.ready_at_force, a.endpoints_at_force, strict=True)
                ),
                _spread(a.rollback_to_force_s, " s"),
            ]
            for a in summary.arms
        ],
    )
    names = [w.phase for w in summary.arms[0].timeline] if summary.arms else []
    over_time = markdown(
        ["from promote", *(f"{a.arm}: failed / p99 ms" for a in summary.arms)],
        [[name, *(_point(a.timeline, i) for a in summary.arms)] for i, name in enumerate(names)],
    )
    ratio = summary.promoted_p99_ratio.spread
    return "\n\n".join(
        [
            head,
            phases,
            shifts,
            f"Over time, round 1 ({TIMELINE_S[2]} s windows by send time):\n\n{over_time}",
            "Promoted phase p99, weights at once / scale before shift, paired by round: "
            + (_spread(ratio, "x") if ratio else "-"),
        ]
    )


def _point(timeline: list[Window], i: int) -> str:
    if i >= len(timeline):
        return "-"
    w = timeline[i]
    return f"{w.failed} of {w.requests} / {w.p99_ms if w.p99_ms is not None else '-'}"


def checks(setup: Setup, summary: Summary) -> list[Check]:
    with_scaling = next((a for a in summary.arms if a.arm == "scale before shift"), None)
    if with_scaling is None:
        return []  # not measured
    failed = sum(sum(p.failures.values()) for p in with_scaling.phases)
    worst = max((p.p99_ms.high for p in with_scaling.phases if p.p99_ms), default=None)
    needed = setup.plan.stable_replicas
    return [
        (
            "scale before shift: no request failed in any phase",
            failed == 0,
            f"{failed} failed",
        ),
        (
            f"scale before shift: p99 within {summary.slo_ms:g} ms in every phase and round",
            worst is not None and worst <= summary.slo_ms,
            f"worst {worst} ms",
        ),
        (
            f"scale before shift: {CANARY} had {needed} ready replicas when its weight came "
            "into force",
            bool(with_scaling.ready_at_force) and min(with_scaling.ready_at_force) >= needed,
            f"{with_scaling.ready_at_force}",
        ),
    ]


class Helm:
    """helm from .bin/, with its own home directories, against one cluster."""

    def __init__(self, cluster: Cluster, home: Path) -> None:
        self.path = default_bin_dir() / "helm"
        self.cluster = cluster
        self.env = {
            **cluster.env,
            "HELM_CACHE_HOME": str(home / "cache"),
            "HELM_CONFIG_HOME": str(home / "config"),
            "HELM_DATA_HOME": str(home / "data"),
        }

    def run(self, *args: str) -> None:
        argv = [str(self.path), *args, "--namespace", NAMESPACE, "--wait", "--timeout=240s"]
        result = subprocess.run(
            argv, capture_output=True, text=True, env=self.env, timeout=300, check=False
        )
        if result.returncode != 0:
            raise SystemExit(f"helm {' '.join(args)}: {result.stderr}{result.stdout}")

    def set_arm(self, scale_before_shift: bool) -> None:
        """The operator with or without scale before shift, its old pod gone."""
        value = f"operator.scaleBeforeShift={str(scale_before_shift).lower()}"
        self.run("upgrade", RELEASE, str(CHART), "--reuse-values", "--set", value)
        selector = f"app.kubernetes.io/instance={RELEASE},app.kubernetes.io/component=operator"
        deadline = time.monotonic() + 240
        while True:
            pods = self.cluster.kubectl_json("get", "pods", "-l", selector, namespace=NAMESPACE)
            items = pods["items"]
            flag = "--no-scale-before-shift"
            if len(items) == 1 and all(
                (flag in pod["spec"]["containers"][0].get("args", [])) != scale_before_shift
                and any(
                    c["type"] == "Ready" and c["status"] == "True"
                    for c in pod.get("status", {}).get("conditions", [])
                )
                for pod in items
            ):
                return
            if time.monotonic() > deadline:
                raise SystemExit(f"the operator did not restart with {value} within 240 s")
            time.sleep(0.5)


def target_of(cluster: Cluster) -> Target:
    gateway = cluster.kubectl_json("get", "service", f"{RELEASE}-gateway", namespace=NAMESPACE)
    admin = cluster.kubectl_json("get", "service", f"{RELEASE}-gateway-admin", namespace=NAMESPACE)
    return Target(
        cluster,
        NAMESPACE,
        f"http://{gateway['spec']['clusterIP']}:{gateway['spec']['ports'][0]['port']}",
        f"http://{admin['spec']['clusterIP']}:{admin['spec']['ports'][0]['port']}",
    )


@contextlib.contextmanager
def node(setup: Setup) -> Iterator[tuple[Target, Helm]]:
    """The chart on the given cluster, or on a local node started (and stopped) here."""
    with tempfile.TemporaryDirectory(prefix="modelroll-bench-promote-") as tmp:
        if setup.kubeconfig is not None:
            cluster = Cluster.existing(Path(setup.kubeconfig))
            yield target_of(cluster), Helm(cluster, Path(tmp))
            return
        print("Starting a local node and installing the chart ...", file=sys.stderr, flush=True)
        with (
            ControlPlane(Path(tmp) / "node", default_bin_dir(), node_ip=detect_node_ip()) as plane,
            Node(plane) as running,
        ):
            cluster = Cluster.local(plane, running)
            helm = Helm(cluster, Path(tmp) / "helm")
            values = [arg for v in LOCAL_VALUES for arg in ("--set", v)]
            helm.run("install", RELEASE, str(CHART), "--create-namespace", *values)
            yield target_of(cluster), helm


def measure(setup: Setup) -> Measured:
    rounds: list[Round] = []
    with node(setup) as (target, helm):
        for index in range(setup.rounds):
            order = list(setup.arms) if index % 2 == 0 else list(reversed(setup.arms))
            runs = []
            for arm in order:
                print(f"Round {index + 1}/{setup.rounds}: {arm}", file=sys.stderr, flush=True)
                helm.set_arm(ARMS[arm])
                runs.append(promote_and_roll_back(target, setup.plan, arm))
            rounds.append(Round(index, runs))
        helm.set_arm(True)
    return Measured(rounds)


class PromoteSuite(Suite[Setup, Measured, Summary]):
    name = "promote"
    help = "a canary promoted under load on the local node, with and without scale before shift"
    description = __doc__ or ""
    setup_type = Setup
    measured_type = Measured

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        plan, stand_in = Plan(), StandIn()
        parser.add_argument("--rounds", type=int, default=Setup.rounds, help="paired rounds")
        parser.add_argument("--stable-replicas", type=int, default=plan.stable_replicas)
        parser.add_argument(
            "--load", type=float, default=plan.load, help="offered load, of the stable's capacity"
        )
        parser.add_argument("--fixed-ms", type=float, default=stand_in.fixed_ms)
        parser.add_argument("--parallel", type=int, default=stand_in.parallel)
        parser.add_argument("--queue", type=int, default=stand_in.queue)
        parser.add_argument(
            "--watch-seconds",
            type=float,
            default=plan.after_s,
            help="load watched before the promote and after each shift settled",
        )
        parser.add_argument(
            "--arm",
            dest="arms",
            action="append",
            choices=list(ARMS),
            help="measure only this arm (repeatable; default: both, paired)",
        )
        parser.add_argument(
            "--kubeconfig",
            help="a cluster where the chart runs (default: start a local node here)",
        )

    def setup(self, args: argparse.Namespace) -> Setup:
        if args.rounds < 1 or args.stable_replicas < 1:
            raise SystemExit("--rounds and --stable-replicas must be at least 1")
        if not 0 < args.load <= 1:
            raise SystemExit(f"--load must be above 0 and at most 1, got {args.load}")
        if args.kubeconfig is None and os.geteuid() != 0:
            raise SystemExit("a local node needs root (or give --kubeconfig)")
        stand_in = StandIn(args.fixed_ms, args.parallel, args.queue)
        plan = Plan(
            args.stable_replicas,
            args.load,
            before_s=args.watch_seconds,
            after_s=args.watch_seconds,
            stand_in=stand_in,
        )
        return Setup(args.rounds, plan, args.kubeconfig, tuple(args.arms or ARMS))

    async def measure(self, setup: Setup) -> Measured:
        return measure(setup)

    summarize = staticmethod(summarize)
    render = staticmethod(render)
    checks = staticmethod(checks)


SUITE = PromoteSuite()
