"""``modelroll-bench analysis`` (``make bench-analysis``): modelroll's canary analysis against
Flagger's rule, on the same simulated traffic. Nothing runs but this process; deterministic given
``--seed``.

Traffic: Poisson arrivals at a total rate T, the canary's share its step weight; each request
fails with its version's error probability and takes a lognormal time, counted into the gateway's
histogram buckets (``modelroll_gateway_request_duration_seconds``). The counters are drawn per
chunk of ``gcd(intervalSeconds, 60)`` seconds (3 s by default) as counts (Poisson, binomial,
multinomial by conditional binomials), never per request, so a run covers hours of traffic in
milliseconds. Each step's traffic is one stream, indexed by the time since the step was reached:
both judges read exactly the same counts at the same time into a step, even though they reach the
steps at different times.

The judges:

- modelroll: the AnalysisSpec defaults (interval 3 s, warm-up 5 s, min 30 s and 100 canary
  requests, max 600 s then Hold, both checks with maxRatio 1.5, budget 1%), run by the operator's
  own code: ``rollout.start`` and ``rollout.evaluate`` on the cumulative counters (statistics in
  ``modelroll_operator.judge``). A step still undecided at maxSeconds counts as held (the
  operator would keep judging).
- modelroll with the stricter pass rule, ``falsePromotionBudget`` (``--beta``, 0.05): a pass
  needs evidence that the canary is not 1.25 maxRatio times worse.
- Flagger: every 60 s, the canary's last 60 s; the check fails when its error rate is above
  ``--flagger-max-error`` (1%, Flagger's request-success-rate min 99), when its p95
  (histogram_quantile over the buckets, as Prometheus computes it) is above
  ``--flagger-latency-factor`` (1.2) times the healthy p95 as histogram_quantile reports it with
  unlimited data, or when the canary had no request in the window (no data = failure). The
  failed checks add up over the analysis (Flagger does not reset them); at its threshold
  (5) it rolls back; a passing check moves to the next step (``stepWeights``), and at the last one
  promotes.

Scenarios: A/A rollouts (identical versions, steps 5, 25, 50) at a low and a high total rate;
single-step analyses of a regression (errors 2x and 10x the baseline's, latency 1.5x) at canary
weights 1%, 5% and 25%, timed from the step being reached; and the fast case, a canary failing
20% of 10 req/s against a baseline that fails none.
"""

from __future__ import annotations

import argparse
import math
import random
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from modelroll_gateway.metrics import DURATION_BUCKETS
from modelroll_operator import judge, rollout
from modelroll_operator.analysis_spec import AnalysisSpec, Step

from .servers import Check, finish

LES: tuple[float, ...] = (*DURATION_BUCKETS, math.inf)
"""The gateway's histogram bucket bounds, +Inf last."""

ROLLED_BACK = "rolled back"
PROMOTED = "promoted"
HELD = "held"


# -- sampling (pure Python: numpy is not used by the benchmarks) -----------------------------


def poisson(rng: random.Random, lam: float) -> int:
    """A Poisson variate: inversion below 10, Hormann's PTRS (transformed rejection) above."""
    if lam <= 0:
        return 0
    if lam < 10:
        u = rng.random()
        k = 0
        p = math.exp(-lam)
        cumulative = p
        while u > cumulative and k < 1000:
            k += 1
            p *= lam / k
            cumulative += p
        return k
    slam = math.sqrt(lam)
    loglam = math.log(lam)
    b = 0.931 + 2.53 * slam
    a = -0.059 + 0.02483 * b
    log_invalpha = math.log(1.1239 + 1.1328 / (b - 3.4))
    vr = 0.9277 - 3.6224 / (b - 2)
    while True:
        u = rng.random() - 0.5
        v = rng.random()
        us = 0.5 - abs(u)
        if us <= 0:
            continue
        k = math.floor((2 * a / us + b) * u + lam + 0.43)
        if us >= 0.07 and v <= vr:
            return k
        if k < 0 or (us < 0.013 and v > us):
            continue
        if v > 0 and math.log(v) + log_invalpha - math.log(a / (us * us) + b) <= (
            -lam + k * loglam - math.lgamma(k + 1)
        ):
            return k


def binomial(rng: random.Random, n: int, p: float) -> int:
    """A binomial variate: inversion when n min(p, 1-p) < 10, Hormann's BTRS above."""
    if n <= 0 or p <= 0:
        return 0
    if p >= 1:
        return n
    if p > 0.5:
        return n - binomial(rng, n, 1 - p)
    if n * p < 10:
        q = 1 - p
        s = p / q
        a = (n + 1) * s
        r = q**n
        u = rng.random()
        x = 0
        while u > r and x < n:
            u -= r
            x += 1
            r *= a / x - s
        return x
    q = 1 - p
    spq = math.sqrt(n * p * q)
    b = 1.15 + 2.53 * spq
    a = -0.0873 + 0.0248 * b + 0.01 * p
    c = n * p + 0.5
    v_r = 0.92 - 4.2 / b
    alpha = (2.83 + 5.1 / b) * spq
    lpq = math.log(p / q)
    m = math.floor((n + 1) * p)
    h = math.lgamma(m + 1) + math.lgamma(n - m + 1)
    while True:
        u = rng.random() - 0.5
        v = rng.random()
        us = 0.5 - abs(u)
        if us <= 0:
            continue
        k = math.floor((2 * a / us + b) * u + c)
        if k < 0 or k > n:
            continue
        if us >= 0.07 and v <= v_r:
            return k
        if v <= 0:
            continue
        v = math.log(v * alpha / (a / (us * us) + b))
        if v <= h - math.lgamma(k + 1) - math.lgamma(n - k + 1) + (k - m) * lpq:
            return k


def _normal_cdf(z: float) -> float:
    return 0.5 * math.erfc(-z / math.sqrt(2))


# -- traffic ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Version:
    """How a version behaves: its error probability and its lognormal latency."""

    error_rate: float = 0.01
    median_s: float = 0.05
    sigma: float = 0.5

    def bucket_probabilities(self) -> tuple[float, ...]:
        """The probability of each bucket of LES (not cumulative), +Inf last."""
        below = [
            _normal_cdf(math.log(le / self.median_s) / self.sigma) if math.isfinite(le) else 1.0
            for le in LES
        ]
        return tuple(hi - lo for lo, hi in zip([0.0, *below[:-1]], below, strict=True))

    def p95(self) -> float:
        return self.median_s * math.exp(1.6448536269514722 * self.sigma)


@dataclass(frozen=True)
class Sample:
    """One version's counter deltas over one chunk: requests, errors, and per-bucket counts
    (not cumulative)."""

    requests: int
    errors: int
    buckets: tuple[int, ...]


@dataclass(frozen=True)
class Chunk:
    canary: Sample
    baseline: Sample


class _Sampler:
    """Draws one version's chunks: the bucket counts by conditional binomials, skipping the
    buckets a lognormal practically never reaches."""

    def __init__(self, version: Version) -> None:
        self.version = version
        probabilities = version.bucket_probabilities()
        live = [i for i, p in enumerate(probabilities) if p > 1e-12]
        self.live = live
        # P(bucket i | not in the live buckets before it)
        self.conditional: list[float] = []
        remaining = sum(probabilities[i] for i in live)
        for i in live:
            p = probabilities[i]
            self.conditional.append(min(1.0, p / remaining) if remaining > 0 else 1.0)
            remaining -= p

    def draw(self, rng: random.Random, mean_requests: float) -> Sample:
        n = poisson(rng, mean_requests)
        errors = binomial(rng, n, self.version.error_rate)
        counts = [0] * len(LES)
        left = n
        last = len(self.live) - 1
        for j, i in enumerate(self.live):
            if left == 0:
                break
            x = left if j == last else binomial(rng, left, self.conditional[j])
            counts[i] = x
            left -= x
        return Sample(n, errors, tuple(counts))


@dataclass(frozen=True)
class Scenario:
    name: str
    rate: float
    """Requests per second, both versions together."""
    steps: tuple[int, ...]
    canary: Version
    baseline: Version


class Traffic:
    """The counters of one run of a scenario: per step, a stream of chunks drawn on demand and
    kept, so that both judges read the same ones."""

    def __init__(self, scenario: Scenario, key: str, chunk_s: int) -> None:
        self.scenario = scenario
        self.key = key
        self.chunk_s = chunk_s
        self._canary = _Sampler(scenario.canary)
        self._baseline = _Sampler(scenario.baseline)
        self._streams: dict[int, tuple[random.Random, list[Chunk]]] = {}

    def chunk(self, step: int, index: int) -> Chunk:
        """The counts of chunk ``index`` (0-based) since ``step`` was reached."""
        stream = self._streams.get(step)
        if stream is None:
            stream = (random.Random(f"{self.key}/step{step}"), [])
            self._streams[step] = stream
        rng, chunks = stream
        weight = self.scenario.steps[step] / 100
        while len(chunks) <= index:
            canary = self._canary.draw(rng, self.scenario.rate * weight * self.chunk_s)
            baseline = self._baseline.draw(rng, self.scenario.rate * (1 - weight) * self.chunk_s)
            chunks.append(Chunk(canary, baseline))
        return chunks[index]

    def window(self, step: int, start_s: int, end_s: int) -> Chunk:
        """The counts of [start_s, end_s) since the step was reached, summed."""
        first, last = start_s // self.chunk_s, end_s // self.chunk_s
        parts = [self.chunk(step, i) for i in range(first, last)]
        return Chunk(_sum([c.canary for c in parts]), _sum([c.baseline for c in parts]))


def _sum(samples: Sequence[Sample]) -> Sample:
    if len(samples) == 1:
        return samples[0]
    return Sample(
        sum(s.requests for s in samples),
        sum(s.errors for s in samples),
        tuple(sum(column) for column in zip(*(s.buckets for s in samples), strict=True))
        if samples
        else (0,) * len(LES),
    )


def _cumulative(counts: Sequence[int]) -> list[tuple[float, float]]:
    out = []
    total = 0
    for le, n in zip(LES, counts, strict=True):
        total += n
        out.append((le, float(total)))
    return out


@dataclass(frozen=True)
class Outcome:
    result: str
    """ROLLED_BACK, PROMOTED or HELD (a step reached maxSeconds without a verdict)."""
    at_s: float
    """Seconds from the first step being reached to the result."""
    step: int
    """The step (0-based) the result came in."""
    in_step_s: float
    """Seconds from that step being reached to the result."""
    why: str = ""


# -- the judges ------------------------------------------------------------------------------


def modelroll(spec: AnalysisSpec, traffic: Traffic) -> Outcome:
    """The analysis exactly as the operator runs it: ``rollout.start`` and ``rollout.evaluate``
    on the cumulative counters, one evaluation every ``intervalSeconds``. A step still without a
    verdict at ``maxSeconds`` (Hold: the operator would go on judging) ends the run as held."""
    interval = spec.interval_seconds
    now = 0.0
    decision = rollout.start(spec, "baseline", 100, now, "sim")
    canary, baseline = _Counters(), _Counters()
    step, step_reached, in_step = 0, now, 0
    while True:
        data = traffic.window(step, in_step, in_step + interval)
        in_step += interval
        now += interval
        canary.add(data.canary)
        baseline.add(data.baseline)
        gateway = rollout.Tally(now, canary.counts(), baseline.counts())
        snapshot = rollout.Snapshot(now, {"pod/gateway": gateway})
        decision = rollout.evaluate(spec, decision.state, snapshot, now)
        state = decision.state
        if state.phase == rollout.ROLLED_BACK:
            why = ",".join(n for n, c in state.checks.items() if c.verdict == judge.FAIL)
            return Outcome(ROLLED_BACK, now, step, now - step_reached, why or state.reason)
        if state.phase == rollout.PROMOTED:
            return Outcome(PROMOTED, now, step, now - step_reached)
        if state.phase == rollout.HOLDING:
            return Outcome(HELD, now, step, now - step_reached)
        if state.step != step:
            step, step_reached, in_step = state.step, now, 0


class _Counters:
    """One version's cumulative counters, as the gateway exports them."""

    def __init__(self) -> None:
        self.ok = 0
        self.errors = 0
        self.buckets = [0] * len(LES)

    def add(self, sample: Sample) -> None:
        self.ok += sample.requests - sample.errors
        self.errors += sample.errors
        self.buckets = [a + b for a, b in zip(self.buckets, sample.buckets, strict=True)]

    def counts(self) -> rollout.VersionCounts:
        return rollout.VersionCounts(
            codes={"200": float(self.ok), "500": float(self.errors)},
            buckets=tuple(_cumulative(self.buckets)),
        )


def histogram_quantile(q: float, counts: Sequence[int]) -> float | None:
    """Prometheus's histogram_quantile over one histogram (per-bucket counts of LES); None when
    it has no observations (Prometheus returns NaN, which Flagger reports as no values)."""
    total = sum(counts)
    if total <= 0:
        return None
    rank = q * total
    cumulative = 0.0
    for i, (le, n) in enumerate(zip(LES, counts, strict=True)):
        if cumulative + n >= rank and n > 0:
            if math.isinf(le):
                return LES[-2]
            start = LES[i - 1] if i > 0 else 0.0
            return start + (le - start) * (rank - cumulative) / n
        cumulative += n
    return LES[-2]


def histogram_quantile_of(q: float, probabilities: Sequence[float]) -> float:
    """histogram_quantile with unlimited data: on the bucket probabilities themselves."""
    scale = 1e12
    value = histogram_quantile(q, [round(p * scale) for p in probabilities])
    assert value is not None
    return value


@dataclass(frozen=True)
class FlaggerRule:
    interval_s: int = 60
    max_error: float = 0.01
    max_p95_s: float = 0.0
    """The request-duration threshold (seconds); the caller sets it from the healthy p95."""
    threshold: int = 5


def flagger(rule: FlaggerRule, traffic: Traffic) -> Outcome:
    """Flagger's analysis over ``stepWeights`` = the scenario's steps."""
    steps = traffic.scenario.steps
    failed = 0
    elapsed = 0
    for s in range(len(steps)):
        t = 0
        while True:
            window = traffic.window(s, t, t + rule.interval_s).canary
            t += rule.interval_s
            why = ""
            if window.requests == 0:
                why = "no data"
            elif window.errors / window.requests > rule.max_error:
                why = "errors"
            else:
                p95 = histogram_quantile(0.95, window.buckets)
                if p95 is None or p95 > rule.max_p95_s:
                    why = "latency"
            if not why:
                break
            failed += 1
            if failed >= rule.threshold:
                return Outcome(ROLLED_BACK, elapsed + t, s, t, why)
        elapsed += t
    return Outcome(PROMOTED, elapsed, len(steps) - 1, t)


# -- the experiment --------------------------------------------------------------------------

MODELROLL = "modelroll"
STRICT = "modelroll_strict"
FLAGGER = "flagger"
JUDGES = (MODELROLL, STRICT, FLAGGER)


@dataclass(frozen=True)
class Setup:
    seed: int = 1
    rollouts: int = 2000
    """A/A rollouts per traffic level."""
    detect_seeds: int = 400
    """Runs per regression and weight."""
    low_rate: float = 1.0
    high_rate: float = 200.0
    detect_rate: float = 200.0
    """Total req/s of the regression scenarios."""
    steps: tuple[int, ...] = (5, 25, 50)
    detect_weights: tuple[int, ...] = (1, 5, 25)
    healthy: Version = field(default_factory=Version)
    fast_canary_rate: float = 10.0
    fast_error_rate: float = 0.2
    beta: float = 0.05
    """The strict pass rule's: spec.analysis.falsePromotionBudget."""
    flagger_max_error: float = 0.01
    flagger_latency_factor: float = 1.2
    flagger_threshold: int = 5
    flagger_interval_s: int = 60

    def spec(self, steps: Sequence[int]) -> AnalysisSpec:
        return AnalysisSpec(steps=tuple(Step(w) for w in steps))

    def flagger_rule(self) -> FlaggerRule:
        healthy_p95 = histogram_quantile_of(0.95, self.healthy.bucket_probabilities())
        return FlaggerRule(
            interval_s=self.flagger_interval_s,
            max_error=self.flagger_max_error,
            max_p95_s=self.flagger_latency_factor * healthy_p95,
            threshold=self.flagger_threshold,
        )

    def label(self, name: str) -> str:
        return {MODELROLL: "modelroll", STRICT: f"modelroll b={self.beta:g}"}.get(name, "Flagger")


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile; math.inf stands for "never"."""
    ordered = sorted(values)
    if not ordered:
        return math.nan
    rank = math.ceil(q * len(ordered) - 1e-9)
    return ordered[max(0, min(len(ordered), rank) - 1)]


def _finite(value: float) -> float | None:
    """None for "never" (JSON has no infinity)."""
    return value if math.isfinite(value) else None


def _rollouts(outcomes: Sequence[Outcome]) -> dict[str, Any]:
    n = len(outcomes)
    counts = {r: sum(o.result == r for o in outcomes) for r in (ROLLED_BACK, PROMOTED, HELD)}
    promoted = [o.at_s for o in outcomes if o.result == PROMOTED]
    return {
        "runs": n,
        "rolled_back": counts[ROLLED_BACK],
        "promoted": counts[PROMOTED],
        "held": counts[HELD],
        "rollback_rate": counts[ROLLED_BACK] / n if n else math.nan,
        "median_promotion_s": _finite(percentile(promoted, 0.5)) if promoted else None,
    }


def _detection(outcomes: Sequence[Outcome]) -> dict[str, Any]:
    times = [o.in_step_s if o.result == ROLLED_BACK else math.inf for o in outcomes]
    return {
        "runs": len(outcomes),
        "detected": sum(math.isfinite(x) for x in times),
        "promoted": sum(o.result == PROMOTED for o in outcomes),
        "held": sum(o.result == HELD for o in outcomes),
        "median_s": _finite(percentile(times, 0.5)),
        "p95_s": _finite(percentile(times, 0.95)),
        "max_s": _finite(max(times)) if times else None,
    }


def _run_all(setup: Setup, scenario: Scenario, runs: int) -> dict[str, list[Outcome]]:
    """Every judge on the same ``runs`` draws of the scenario's traffic."""
    spec = setup.spec(scenario.steps)
    rule = setup.flagger_rule()
    chunk_s = math.gcd(spec.interval_seconds, rule.interval_s)
    out: dict[str, list[Outcome]] = {name: [] for name in JUDGES}
    for run in range(runs):
        traffic = Traffic(scenario, f"{setup.seed}/{scenario.name}/{run}", chunk_s)
        out[MODELROLL].append(modelroll(spec, traffic))
        strict = replace(spec, false_promotion_budget=setup.beta)
        out[STRICT].append(modelroll(strict, traffic))
        out[FLAGGER].append(flagger(rule, traffic))
    return out


REGRESSIONS: tuple[str, ...] = ("errors 2x", "errors 10x", "latency 1.5x")
"""Errors twice and ten times the baseline's; latency 1.5x the baseline's (its p95 too)."""


def regressed(healthy: Version, name: str) -> Version:
    if name == "errors 2x":
        return replace(healthy, error_rate=min(1.0, 2 * healthy.error_rate))
    if name == "errors 10x":
        return replace(healthy, error_rate=min(1.0, 10 * healthy.error_rate))
    if name == "latency 1.5x":
        return replace(healthy, median_s=1.5 * healthy.median_s)
    raise ValueError(name)


def simulate(setup: Setup, log: Callable[[str], None] = lambda _: None) -> dict[str, Any]:
    """Every scenario; the report (without its targets)."""
    spec = setup.spec(setup.steps)
    checks = len([c for c in spec.checks().values() if not c.dry_run])
    report: dict[str, Any] = {
        "setup": {
            **asdict(setup),
            "healthy_p95_s": round(setup.healthy.p95(), 6),
            "healthy_p95_histogram_quantile_s": round(
                histogram_quantile_of(0.95, setup.healthy.bucket_probabilities()), 6
            ),
        },
        "modelroll": {
            "interval_s": spec.interval_seconds,
            "warmup_s": spec.warmup_seconds,
            "min_s": spec.min_seconds,
            "min_requests": spec.min_requests,
            "max_s": spec.max_seconds,
            "on_inconclusive": spec.on_inconclusive,
            "max_ratio": {n: c.max_ratio for n, c in spec.checks().items()},
            "budget": spec.false_rollback_budget,
            "alpha_per_check_per_step": judge.check_alpha(
                spec.false_rollback_budget, checks, len(spec.steps)
            ),
            "alternative_multipliers": list(judge.MULTIPLIERS),
        },
        "flagger": asdict(setup.flagger_rule()),
        "aa": {},
        "detection": {},
    }
    for label, rate in (("low", setup.low_rate), ("high", setup.high_rate)):
        started = time.monotonic()
        scenario = Scenario(f"aa-{label}", rate, setup.steps, setup.healthy, setup.healthy)
        outcomes = _run_all(setup, scenario, setup.rollouts)
        report["aa"][label] = {
            "rate": rate,
            **{name: _rollouts(outcomes[name]) for name in JUDGES},
        }
        log(f"A/A at {rate:g} req/s: {setup.rollouts} rollouts in "
            f"{time.monotonic() - started:.1f} s")  # fmt: skip
    for name in REGRESSIONS:
        canary = regressed(setup.healthy, name)
        for weight in setup.detect_weights:
            started = time.monotonic()
            scenario = Scenario(
                f"{name}-w{weight}", setup.detect_rate, (weight,), canary, setup.healthy
            )
            outcomes = _run_all(setup, scenario, setup.detect_seeds)
            report["detection"][f"{name} @ {weight}%"] = {
                "regression": name,
                "weight": weight,
                "rate": setup.detect_rate,
                **{judge_name: _detection(outcomes[judge_name]) for judge_name in JUDGES},
            }
            log(f"{name} at {weight}%: {setup.detect_seeds} runs in "
                f"{time.monotonic() - started:.1f} s")  # fmt: skip
    weight = setup.steps[0]
    fast = Scenario(
        "fast",
        setup.fast_canary_rate / (weight / 100),
        setup.steps,
        replace(setup.healthy, error_rate=setup.fast_error_rate),
        replace(setup.healthy, error_rate=0.0),
    )
    outcomes = _run_all(setup, fast, setup.detect_seeds)
    report["fast"] = {
        "rate": fast.rate,
        "weight": weight,
        "canary_rate": setup.fast_canary_rate,
        "canary_error_rate": setup.fast_error_rate,
        "baseline_error_rate": 0.0,
        **{name: _detection(outcomes[name]) for name in JUDGES},
    }
    return report


def targets(report: dict[str, Any]) -> list[Check]:
    """The targets, judged on modelroll with the spec's defaults (not the strict variant)."""
    checks: list[Check] = []
    for row in report["aa"].values():
        ours, theirs = row[MODELROLL], row[FLAGGER]
        checks.append(
            (
                f"A/A at {row['rate']:g} req/s: modelroll false rollbacks <= 1%",
                ours["rollback_rate"] <= 0.01,
                f"{ours['rolled_back']}/{ours['runs']} ({ours['rollback_rate']:.2%})",
            )
        )
        checks.append(
            (
                f"A/A at {row['rate']:g} req/s: modelroll rolls back no more than Flagger",
                ours["rolled_back"] <= theirs["rolled_back"],
                f"modelroll {ours['rolled_back']}, Flagger {theirs['rolled_back']} "
                f"of {ours['runs']}",
            )
        )
    fast = report["fast"][MODELROLL]
    checks.append(
        (
            f"{report['fast']['canary_error_rate']:.0%} errors at "
            f"{report['fast']['canary_rate']:g} req/s of canary traffic: every run rolled back "
            "within 15 s of reaching the step",
            fast["detected"] == fast["runs"] and (fast["max_s"] or math.inf) <= 15,
            f"{fast['detected']}/{fast['runs']} rolled back, max {_seconds(fast['max_s'])}",
        )
    )
    for cell, row in report["detection"].items():
        ours, theirs = row[MODELROLL]["median_s"], row[FLAGGER]["median_s"]
        checks.append(
            (
                f"{cell} at {row['rate']:g} req/s: modelroll's median time to detect <= 1/10 of "
                "Flagger's",
                ours is not None and (theirs is None or ours * 10 <= theirs),
                f"modelroll {_seconds(ours)}, Flagger {_seconds(theirs)}",
            )
        )
    return checks


def _seconds(value: float | None) -> str:
    return "never" if value is None else f"{value:g} s"


def table(report: dict[str, Any]) -> str:
    setup = report["setup"]
    labels = {name: Setup(beta=setup["beta"]).label(name) for name in JUDGES}
    h, m, f = setup["healthy"], report["modelroll"], report["flagger"]
    lines = [
        f"Healthy version: {h['error_rate']:.1%} errors, lognormal latency median "
        f"{h['median_s'] * 1000:g} ms sigma {h['sigma']:g} (p95 "
        f"{setup['healthy_p95_s'] * 1000:.0f} ms; histogram_quantile "
        f"{setup['healthy_p95_histogram_quantile_s'] * 1000:.0f} ms).",
        f"modelroll: interval {m['interval_s']} s, warm-up {m['warmup_s']} s, min {m['min_s']} s "
        f"and {m['min_requests']} canary requests, max {m['max_s']} s then "
        f"{m['on_inconclusive']}, maxRatio 1.5, budget {m['budget']:.0%} -> alpha "
        f"{m['alpha_per_check_per_step']:.3g} per check and step (3 steps); pass: Lambda <= 1. "
        f"{labels[STRICT]}: the same, but a pass needs every likelihood ratio <= "
        f"{setup['beta']:g}.",
        f"Flagger: every {f['interval_s']} s over the last {f['interval_s']} s, the canary's "
        f"errors > {f['max_error']:.0%}, p95 > {f['max_p95_s'] * 1000:.0f} ms or no request "
        f"fails the check; rollback at {f['threshold']} failed checks.",
        "",
        f"A/A rollouts (identical versions), steps {', '.join(f'{w}%' for w in setup['steps'])}:",
        f"  {'traffic':<12} {'judge':<18} {'rolled back':>14} {'promoted':>9} {'held':>6} "
        f"{'median promotion':>17}",
    ]
    for row in report["aa"].values():
        for name in JUDGES:
            s = row[name]
            lines.append(
                f"  {row['rate']:>6g} req/s {labels[name]:<18} "
                f"{s['rolled_back']:>6} ({s['rollback_rate']:>5.1%}) {s['promoted']:>9} "
                f"{s['held']:>6} {_seconds(s['median_promotion_s']):>17}"
            )
    lines += [
        "",
        f"Regressions, one step at the weight, {setup['detect_rate']:g} req/s in all, "
        f"{setup['detect_seeds']} runs each; time from the step being reached to the rollback "
        "(never: promoted or held):",
        f"  {'regression':<13} {'weight':>6}  {'judge':<18} {'caught':>6} {'promoted':>9} "
        f"{'median':>7} {'p95':>7} {'vs Flagger':>10}",
    ]
    for row in report["detection"].values():
        flagger_median = row[FLAGGER]["median_s"]
        for i, name in enumerate(JUDGES):
            d = row[name]
            speedup = (
                f"{flagger_median / d['median_s']:.1f}x faster"
                if name != FLAGGER and d["median_s"] and flagger_median
                else ""
            )
            lines.append(
                f"  {row['regression'] if i == 0 else '':<13} "
                f"{str(row['weight']) + '%' if i == 0 else '':>6}  {labels[name]:<18} "
                f"{d['detected']:>6} {d['promoted']:>9} {_seconds(d['median_s']):>7} "
                f"{_seconds(d['p95_s']):>7} {speedup:>10}"
            )
    fast = report["fast"]
    lines += [
        "",
        f"Fast case: the canary fails {fast['canary_error_rate']:.0%} of {fast['canary_rate']:g} "
        f"req/s (step 1, {fast['weight']}% of {fast['rate']:g} req/s), the baseline none; "
        f"{setup['detect_seeds']} runs:",
    ]
    for name in JUDGES:
        d = fast[name]
        lines.append(
            f"  {labels[name]:<18} rolled back {d['detected']}/{d['runs']}: median "
            f"{_seconds(d['median_s'])}, p95 {_seconds(d['p95_s'])}, max {_seconds(d['max_s'])}"
        )
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    d = Setup()
    parser.add_argument("--seed", type=int, default=d.seed, help="seeds every run (1)")
    parser.add_argument(
        "--rollouts", type=int, default=d.rollouts, help="A/A rollouts per traffic level (2000)"
    )
    parser.add_argument(
        "--detect-seeds", type=int, default=d.detect_seeds, help="runs per regression (400)"
    )
    parser.add_argument("--low-rate", type=float, default=d.low_rate, help="A/A req/s (1)")
    parser.add_argument("--high-rate", type=float, default=d.high_rate, help="A/A req/s (200)")
    parser.add_argument(
        "--detect-rate", type=float, default=d.detect_rate, help="req/s of the regressions (200)"
    )
    parser.add_argument(
        "--error-rate",
        type=float,
        default=d.healthy.error_rate,
        help="the healthy version's error rate (0.01)",
    )
    parser.add_argument(
        "--beta", type=float, default=d.beta, help="the strict pass rule's beta (0.05)"
    )
    parser.add_argument(
        "--flagger-max-error",
        type=float,
        default=d.flagger_max_error,
        help="Flagger's error-rate threshold (0.01)",
    )
    parser.add_argument(
        "--flagger-latency-factor",
        type=float,
        default=d.flagger_latency_factor,
        help="Flagger's p95 threshold over the healthy p95 (1.2)",
    )
    parser.add_argument("--out", type=Path, default=Path("bench/results/analysis.json"))


def main(args: argparse.Namespace) -> int:
    setup = Setup(
        seed=args.seed,
        rollouts=args.rollouts,
        detect_seeds=args.detect_seeds,
        low_rate=args.low_rate,
        high_rate=args.high_rate,
        detect_rate=args.detect_rate,
        healthy=Version(error_rate=args.error_rate),
        beta=args.beta,
        flagger_max_error=args.flagger_max_error,
        flagger_latency_factor=args.flagger_latency_factor,
    )
    started = time.monotonic()
    report = simulate(setup, log=lambda line: print(line, file=sys.stderr, flush=True))
    report["seconds"] = round(time.monotonic() - started, 1)
    print(table(report), flush=True)
    finish(report, targets(report), args.out)
