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
  own code: ``machine.start`` and ``machine.evaluate`` on the cumulative counters (statistics in
  ``modelroll_operator.analysis.statistics``). A step still undecided at maxSeconds counts as held
  (the operator would keep judging).
- modelroll with the stricter pass rule, ``falsePromotionBudget`` (``--beta``, 0.05): a pass
  needs evidence that the canary is not 1.25 maxRatio times worse.
- Flagger: every 60 s, the canary's last 60 s; the check fails when its error rate is above
  ``--flagger-max-error`` (1%, Flagger's request-success-rate min 99), when its p95
  (histogram_quantile over the buckets, as Prometheus computes it) is above
  ``--flagger-latency-factor`` (1.2) times the healthy p95 as histogram_quantile reports it with
  unlimited data, or when the canary had no request in the window (no data = failure). The
  failed checks add up over the analysis (Flagger does not reset them); at its threshold (5)
  it rolls back at the next tick (its scheduler compares the count with the threshold before
  it runs a tick's checks: 6 minutes at the earliest); a passing check moves to the next step
  (``stepWeights``), and at the last one promotes.

Scenarios: A/A rollouts (identical versions, steps 5, 25, 50) at a low and a high total rate;
A/A rollouts behind a batching sidecar (model calls of 8 and 32 requests that share their
duration, and that fail whole with probability 0, 0.2, 0.5 and 1%), judged also from the request
counters alone to show what counting each request as independent evidence does; single-step
analyses of a regression (errors 2x and 10x the baseline's, latency 1.5x) at canary weights 1%,
5% and 25%, timed from the step being reached, beside the time a fixed-sample test with the
same alpha needs; and the fast case, a canary failing 20% of 10 req/s against a baseline that
fails none.
"""

from __future__ import annotations

import argparse
import math
import random
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from statistics import NormalDist

from modelroll_common.metric_names import DURATION_BUCKETS, TTFT_BUCKETS
from modelroll_operator.analysis import counts, machine, statistics
from modelroll_operator.analysis.phases import Phase
from modelroll_operator.analysis.spec import TTFT as TTFT_CHECK
from modelroll_operator.analysis.spec import AnalysisSpec, Checks, ErrorCheck, LatencyCheck, Step

from .servers import Check
from .stats import percentile
from .suite import Suite

LES: tuple[float, ...] = (*DURATION_BUCKETS, math.inf)
"""The gateway's histogram bucket bounds, +Inf last."""
TTFT_LES: tuple[float, ...] = (*TTFT_BUCKETS, math.inf)
"""The bounds of the gateway's time-to-first-token histogram, +Inf last."""

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
    """How a version behaves: its error probability and its lognormal latency; behind a batching
    sidecar, the size of its model calls and how often one fails with every request it held."""

    error_rate: float = 0.01
    median_s: float = 0.05
    sigma: float = 0.5
    batch_size: int = 1
    """Requests per model call; they share its duration (one draw, one bucket for all)."""
    batch_failure_rate: float = 0.0
    """The probability that a model call fails whole (every request in it answered 5xx)."""
    histogram: str = "duration"
    """The histogram its times are counted in: the request ``duration``'s, or for a generation
    stream the time to first token's (``ttft``)."""

    @property
    def les(self) -> tuple[float, ...]:
        """That histogram's bucket bounds, +Inf last."""
        return TTFT_LES if self.histogram == "ttft" else LES

    def bucket_probabilities(self) -> tuple[float, ...]:
        """The probability of each bucket of ``les`` (not cumulative), +Inf last."""
        below = [
            _normal_cdf(math.log(le / self.median_s) / self.sigma) if math.isfinite(le) else 1.0
            for le in self.les
        ]
        return tuple(hi - lo for lo, hi in zip([0.0, *below[:-1]], below, strict=True))

    def p95(self) -> float:
        return self.median_s * math.exp(1.6448536269514722 * self.sigma)


@dataclass(frozen=True)
class Sample:
    """One version's counter deltas over one chunk: requests, errors, and per-bucket counts
    (not cumulative); and the same counted in model calls, each request 1/n of a call of n, as
    the gateway's model_calls counter and model_call_duration histogram count them."""

    requests: int
    errors: int
    buckets: tuple[int, ...]
    calls: float
    bad_calls: float
    call_buckets: tuple[float, ...]


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
        version = self.version
        size = version.batch_size
        calls = poisson(rng, mean_requests / size)
        failed = binomial(rng, calls, version.batch_failure_rate)
        alone = binomial(rng, (calls - failed) * size, version.error_rate)
        counts = self._buckets(rng, calls)
        return Sample(
            requests=calls * size,
            errors=failed * size + alone,
            buckets=tuple(n * size for n in counts),
            calls=float(calls),
            bad_calls=failed + alone / size,
            call_buckets=tuple(float(n) for n in counts),
        )

    def _buckets(self, rng: random.Random, n: int) -> list[int]:
        """``n`` durations as per-bucket counts (a multinomial, by conditional binomials)."""
        counts = [0] * len(self.version.les)
        left = n
        last = len(self.live) - 1
        for j, i in enumerate(self.live):
            if left == 0:
                break
            x = left if j == last else binomial(rng, left, self.conditional[j])
            counts[i] = x
            left -= x
        return counts


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
        les = self.scenario.canary.les
        return Chunk(_sum([c.canary for c in parts], les), _sum([c.baseline for c in parts], les))


def _sum(samples: Sequence[Sample], les: tuple[float, ...]) -> Sample:
    if len(samples) == 1:
        return samples[0]
    if not samples:
        return Sample(0, 0, (0,) * len(les), 0.0, 0.0, (0.0,) * len(les))
    return Sample(
        sum(s.requests for s in samples),
        sum(s.errors for s in samples),
        tuple(sum(column) for column in zip(*(s.buckets for s in samples), strict=True)),
        math.fsum(s.calls for s in samples),
        math.fsum(s.bad_calls for s in samples),
        tuple(math.fsum(column) for column in zip(*(s.call_buckets for s in samples), strict=True)),
    )


def _cumulative(counts: Sequence[float], les: tuple[float, ...] = LES) -> list[tuple[float, float]]:
    out = []
    total = 0.0
    for le, n in zip(les, counts, strict=True):
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


def modelroll(spec: AnalysisSpec, traffic: Traffic, calls: bool = True) -> Outcome:
    """The analysis exactly as the operator runs it: ``machine.start`` and ``machine.evaluate``
    on the cumulative counters, one evaluation every ``intervalSeconds``. A step still without a
    verdict at ``maxSeconds`` (Hold: the operator would go on judging) ends the run as held.
    Without ``calls``, the gateway's model-call counters are left out, so requests are judged as
    if each were a model call of its own."""
    interval = spec.interval_seconds
    now = 0.0
    decision = machine.start(spec, "baseline", 100, now, "sim")
    les, streams = traffic.scenario.canary.les, spec.judges_streams
    canary, baseline = _Counters(les, streams), _Counters(les, streams)
    step, step_reached, in_step = 0, now, 0
    while True:
        data = traffic.window(step, in_step, in_step + interval)
        in_step += interval
        now += interval
        canary.add(data.canary)
        baseline.add(data.baseline)
        gateway = counts.Tally(now, canary.counts(calls), baseline.counts(calls))
        snapshot = counts.Snapshot(now, {"pod/gateway": gateway})
        decision = machine.evaluate(spec, decision.state, snapshot, now)
        state = decision.state
        if state.phase == Phase.ROLLED_BACK:
            why = ",".join(n for n, c in state.checks.items() if c.verdict == statistics.FAIL)
            return Outcome(ROLLED_BACK, now, step, now - step_reached, why or state.reason)
        if state.phase == Phase.PROMOTED:
            return Outcome(PROMOTED, now, step, now - step_reached)
        if state.phase == Phase.HOLDING:
            return Outcome(HELD, now, step, now - step_reached)
        if state.step != step:
            step, step_reached, in_step = state.step, now, 0


class _Counters:
    """One version's cumulative counters, as the gateway exports them; with ``streams``, each
    request is a generation stream whose drawn time is its time to first token."""

    def __init__(self, les: tuple[float, ...] = LES, streams: bool = False) -> None:
        self.les = les
        self.streams = streams
        self.ok = 0
        self.errors = 0
        self.buckets = [0] * len(les)
        self.ok_calls = 0.0
        self.bad_calls = 0.0
        self.call_buckets = [0.0] * len(les)

    def add(self, sample: Sample) -> None:
        self.ok += sample.requests - sample.errors
        self.errors += sample.errors
        self.buckets = [a + b for a, b in zip(self.buckets, sample.buckets, strict=True)]
        self.ok_calls += sample.calls - sample.bad_calls
        self.bad_calls += sample.bad_calls
        self.call_buckets = [
            a + b for a, b in zip(self.call_buckets, sample.call_buckets, strict=True)
        ]

    def counts(self, calls: bool = True) -> counts.VersionCounts:
        codes = {"200": float(self.ok), "500": float(self.errors)}
        buckets = tuple(_cumulative(self.buckets, self.les))
        if self.streams:
            return counts.VersionCounts(codes, ttft_buckets=buckets)
        requests = counts.VersionCounts(codes, buckets=buckets)
        if not calls:
            return requests
        return replace(
            requests,
            calls={"200": self.ok_calls, "500": self.bad_calls},
            call_buckets=tuple(_cumulative(self.call_buckets, self.les)),
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
                # Flagger compares the failed checks with the threshold at the start of a tick,
                # before that tick's checks: it rolls back one interval after the last failure.
                t += rule.interval_s
                return Outcome(ROLLED_BACK, elapsed + t, s, t, why)
        elapsed += t
    return Outcome(PROMOTED, elapsed, len(steps) - 1, t)


# -- the experiment --------------------------------------------------------------------------

MODELROLL = "modelroll"
STRICT = "modelroll_strict"
FLAGGER = "flagger"
BY_REQUESTS = "modelroll_by_requests"
JUDGES = (MODELROLL, STRICT, FLAGGER)
BATCHED_JUDGES = (MODELROLL, BY_REQUESTS, FLAGGER)
"""The judges of the batched A/A rollouts: modelroll, modelroll fed only the request counters
(every request taken for a model call of its own), and Flagger."""


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
    batch_sizes: tuple[int, ...] = (8, 32)
    batch_failure_rates: tuple[float, ...] = (0.0, 0.002, 0.005, 0.01)
    """Per model call, on top of ``healthy.error_rate`` per request (0: shared latency only)."""
    batched_rollouts: int = 1000
    batched_rate: float = 400.0
    batched_steps: tuple[int, ...] = (25,)

    def spec(self, steps: Sequence[int]) -> AnalysisSpec:
        return AnalysisSpec(steps=tuple(Step(w) for w in steps))

    def stream_spec(self, steps: Sequence[int]) -> AnalysisSpec:
        """The errors check and the time-to-first-token check, as a chat version would list
        them (the request latency check left out: a stream's duration is its length)."""
        ttft = LatencyCheck(max_ratio=1.5)
        checks = Checks(errors=ErrorCheck(), time_to_first_token=ttft)
        return replace(self.spec(steps), checked=checks)

    @property
    def stream(self) -> Version:
        """The healthy version as generation streams: its drawn time is the time to first
        token, counted in the gateway's TTFT buckets."""
        return replace(self.healthy, histogram="ttft")

    def flagger_rule(self) -> FlaggerRule:
        healthy_p95 = histogram_quantile_of(0.95, self.healthy.bucket_probabilities())
        return FlaggerRule(
            interval_s=self.flagger_interval_s,
            max_error=self.flagger_max_error,
            max_p95_s=self.flagger_latency_factor * healthy_p95,
            threshold=self.flagger_threshold,
        )

    def label(self, name: str) -> str:
        labels = {
            MODELROLL: "modelroll",
            STRICT: f"modelroll b={self.beta:g}",
            BY_REQUESTS: "modelroll, requests",
        }
        return labels.get(name, "Flagger")

    def batched_scenarios(self) -> list[Scenario]:
        """Identical versions behind a batching sidecar: full model calls of each size, each
        failing whole at each rate, their requests sharing the call's duration."""
        out = []
        for size in self.batch_sizes:
            for rate in self.batch_failure_rates:
                version = replace(self.healthy, batch_size=size, batch_failure_rate=rate)
                name = f"batches of {size}, {rate:.1%} failing"
                out.append(Scenario(name, self.batched_rate, self.batched_steps, version, version))
        return out


def _finite(value: float | None) -> float | None:
    """None for "never" (math.inf; JSON has no infinity) and for no value at all."""
    return value if value is not None and math.isfinite(value) else None


@dataclass(frozen=True)
class Rollouts:
    """How a judge's rollouts of one scenario ended, and the median time to promote."""

    runs: int
    rolled_back: int
    promoted: int
    held: int
    rollback_rate: float
    median_promotion_s: float | None

    def text(self) -> str:
        """``rolled back/runs (rate)``."""
        return f"{self.rolled_back}/{self.runs} ({self.rollback_rate:.2%})"


@dataclass(frozen=True)
class Detection:
    """How soon a judge rolled back a regressed canary, from the step being reached (None: the
    percentile fell among runs never rolled back)."""

    runs: int
    detected: int
    promoted: int
    held: int
    median_s: float | None
    p95_s: float | None
    max_s: float | None


@dataclass(frozen=True)
class AaRow:
    """A/A rollouts at one traffic level, by judge."""

    rate: float
    judges: dict[str, Rollouts]


@dataclass(frozen=True)
class RegressionRow:
    """One regression at one canary weight, by judge, beside a fixed-sample test's time."""

    regression: str
    weight: int
    rate: float
    fixed_sample_s: float | None
    max_s: int
    judges: dict[str, Detection]


@dataclass(frozen=True)
class BatchedRow:
    """A/A rollouts behind a batching sidecar whose model calls fail whole, by judge."""

    rate: float
    batch_size: int
    batch_failure_rate: float
    judges: dict[str, Rollouts]


@dataclass(frozen=True)
class StreamRow:
    """The time-to-first-token check at one weight: A/A rollouts and a slower first token."""

    weight: int
    rate: float
    aa: Rollouts
    regression: str
    detection: Detection
    fixed_sample_s: float | None
    max_s: int


@dataclass(frozen=True)
class FastRow:
    """A canary failing a large share of little traffic against a baseline failing none."""

    rate: float
    weight: int
    canary_rate: float
    canary_error_rate: float
    baseline_error_rate: float
    judges: dict[str, Detection]


@dataclass(frozen=True)
class Measured:
    """Every scenario's outcomes, counted; scenarios keyed as the tables name them."""

    aa: dict[str, AaRow]
    detection: dict[str, RegressionRow]
    streams: dict[str, StreamRow]
    batched: dict[str, BatchedRow]
    fast: FastRow
    seconds: float = 0.0


@dataclass(frozen=True)
class Rule:
    """modelroll's analysis as the spec's defaults configure it."""

    interval_s: int
    warmup_s: int
    min_s: int
    min_requests: int
    max_s: int
    on_inconclusive: str
    max_ratio: dict[str, float]
    budget: float
    alpha_per_check_per_step: float
    alternative_multipliers: list[float]


@dataclass(frozen=True)
class Summary:
    """The rules both judges applied, the healthy version's p95, and what they decided."""

    healthy_p95_s: float
    healthy_p95_histogram_quantile_s: float
    modelroll: Rule
    flagger: FlaggerRule
    simulation: Measured


def _rollouts(outcomes: Sequence[Outcome]) -> Rollouts:
    n = len(outcomes)
    counts = {r: sum(o.result == r for o in outcomes) for r in (ROLLED_BACK, PROMOTED, HELD)}
    promoted = [o.at_s for o in outcomes if o.result == PROMOTED]
    return Rollouts(
        runs=n,
        rolled_back=counts[ROLLED_BACK],
        promoted=counts[PROMOTED],
        held=counts[HELD],
        rollback_rate=counts[ROLLED_BACK] / n if n else math.nan,
        median_promotion_s=_finite(percentile(promoted, 0.5)),
    )


def _detection(outcomes: Sequence[Outcome]) -> Detection:
    times = [o.in_step_s if o.result == ROLLED_BACK else math.inf for o in outcomes]
    return Detection(
        runs=len(outcomes),
        detected=sum(math.isfinite(x) for x in times),
        promoted=sum(o.result == PROMOTED for o in outcomes),
        held=sum(o.result == HELD for o in outcomes),
        median_s=_finite(percentile(times, 0.5)),
        p95_s=_finite(percentile(times, 0.95)),
        max_s=_finite(max(times)) if times else None,
    )


def _run_all(
    setup: Setup,
    scenario: Scenario,
    runs: int,
    judges: Sequence[str] = JUDGES,
    spec: AnalysisSpec | None = None,
) -> dict[str, list[Outcome]]:
    """Each of ``judges`` on the same ``runs`` draws of the scenario's traffic, modelroll with
    ``spec`` (default: the setup's)."""
    spec = spec or setup.spec(scenario.steps)
    rule = setup.flagger_rule()
    chunk_s = math.gcd(spec.interval_seconds, rule.interval_s)
    strict = replace(spec, false_promotion_budget=setup.beta)
    run_judge: dict[str, Callable[[Traffic], Outcome]] = {
        MODELROLL: lambda traffic: modelroll(spec, traffic),
        STRICT: lambda traffic: modelroll(strict, traffic),
        BY_REQUESTS: lambda traffic: modelroll(spec, traffic, calls=False),
        FLAGGER: lambda traffic: flagger(rule, traffic),
    }
    out: dict[str, list[Outcome]] = {name: [] for name in judges}
    for run in range(runs):
        traffic = Traffic(scenario, f"{setup.seed}/{scenario.name}/{run}", chunk_s)
        for name in judges:
            out[name].append(run_judge[name](traffic))
    return out


def batched_aa(
    setup: Setup,
    judges: Sequence[str] = BATCHED_JUDGES,
    log: Callable[[str], None] = lambda _: None,
) -> dict[str, BatchedRow]:
    """The batched A/A rollouts, by scenario name."""
    out: dict[str, BatchedRow] = {}
    for scenario in setup.batched_scenarios():
        started = time.monotonic()
        outcomes = _run_all(setup, scenario, setup.batched_rollouts, judges)
        out[scenario.name] = BatchedRow(
            rate=scenario.rate,
            batch_size=scenario.canary.batch_size,
            batch_failure_rate=scenario.canary.batch_failure_rate,
            judges={name: _rollouts(outcomes[name]) for name in judges},
        )
        took = time.monotonic() - started
        log(f"A/A, {scenario.name}: {setup.batched_rollouts} rollouts in {took:.1f} s")
    return out


REGRESSIONS: tuple[str, ...] = ("errors 2x", "errors 10x", "latency 1.5x")
"""Errors twice and ten times the baseline's; latency 1.5x the baseline's (its p95 too)."""
TTFT_REGRESSION = "TTFT 1.5x"
"""A chat canary whose time to first token is 1.5x the baseline's (its p95 too)."""


def regressed(healthy: Version, name: str) -> Version:
    if name == "errors 2x":
        return replace(healthy, error_rate=min(1.0, 2 * healthy.error_rate))
    if name == "errors 10x":
        return replace(healthy, error_rate=min(1.0, 10 * healthy.error_rate))
    if name == "latency 1.5x":
        return replace(healthy, median_s=1.5 * healthy.median_s)
    raise ValueError(name)


def bad_fraction(version: Version, check: str, baseline: Version, quantile: float) -> float:
    """The share of ``version``'s requests that ``check`` ("errors" or "latency") counts as
    bad, the latency bound taken from ``baseline`` with unlimited data, as the judge takes it."""
    if check == "errors":
        return version.error_rate
    cumulative = tuple(_cumulative(baseline.bucket_probabilities(), baseline.les))
    bound = statistics.slow_bound(cumulative, quantile)
    assert bound is not None
    probabilities = zip(version.les, version.bucket_probabilities(), strict=True)
    return max(0.0, 1.0 - math.fsum(p for le, p in probabilities if le <= bound))


def fixed_sample_s(
    spec: AnalysisSpec, canary: Version, baseline: Version, check: str, weight: int, rate: float
) -> float:
    """When a fixed-sample test with modelroll's alpha per check and step detects the
    regression with probability one half: the conditional test of the canary's share of the bad
    requests (binomial given their total, null ``maxRatio``), normal approximation, started at
    the same reading as modelroll's judging and read at the same interval. math.inf when the
    canary is no worse than ``maxRatio``."""
    ratio_check = spec.checks()[check]
    active = [c for c in spec.checks().values() if not c.dry_run]
    alpha = statistics.check_alpha(spec.false_rollback_budget, len(active), len(spec.steps))
    quantile = getattr(ratio_check, "quantile", 0.95)
    p_c = bad_fraction(canary, check, baseline, quantile)
    p_b = bad_fraction(baseline, check, baseline, quantile)
    w = weight / 100
    null = ratio_check.max_ratio * w / (ratio_check.max_ratio * w + 1 - w)
    share = w * p_c / (w * p_c + (1 - w) * p_b)
    if share <= null:
        return math.inf
    z = NormalDist().inv_cdf(1 - alpha)
    needed = z * z * null * (1 - null) / (share - null) ** 2  # bad requests, both versions
    seconds = needed / (rate * (w * p_c + (1 - w) * p_b))
    interval = spec.interval_seconds
    judging_from = math.ceil(spec.warmup_seconds / interval) * interval
    return judging_from + math.ceil(seconds / interval) * interval


def streams(setup: Setup, log: Callable[[str], None] = lambda _: None) -> dict[str, StreamRow]:
    """The time-to-first-token check, one step at each detection weight: A/A rollouts (false
    rollbacks) and a canary whose first token comes 1.5x later, judged by modelroll alone."""
    healthy = setup.stream
    slower = replace(healthy, median_s=1.5 * healthy.median_s)
    out: dict[str, StreamRow] = {}
    for weight in setup.detect_weights:
        started = time.monotonic()
        spec = setup.stream_spec((weight,))
        rate = setup.detect_rate
        aa = Scenario(f"streams-aa-w{weight}", rate, (weight,), healthy, healthy)
        later = Scenario(f"streams-ttft-w{weight}", rate, (weight,), slower, healthy)
        aa_runs = _run_all(setup, aa, setup.detect_seeds, (MODELROLL,), spec)[MODELROLL]
        caught = _run_all(setup, later, setup.detect_seeds, (MODELROLL,), spec)[MODELROLL]
        fixed = fixed_sample_s(spec, slower, healthy, TTFT_CHECK, weight, rate)
        out[f"{weight}%"] = StreamRow(
            weight=weight,
            rate=rate,
            aa=_rollouts(aa_runs),
            regression=TTFT_REGRESSION,
            detection=_detection(caught),
            fixed_sample_s=_finite(fixed),
            max_s=spec.max_seconds,
        )
        took = time.monotonic() - started
        log(f"streams at {weight}%: {2 * setup.detect_seeds} runs in {took:.1f} s")
    return out


def simulate(setup: Setup, log: Callable[[str], None] = lambda _: None) -> Measured:
    """Every scenario, each judge's outcomes counted."""
    started_all = time.monotonic()
    aa: dict[str, AaRow] = {}
    for label, rate in (("low", setup.low_rate), ("high", setup.high_rate)):
        started = time.monotonic()
        scenario = Scenario(f"aa-{label}", rate, setup.steps, setup.healthy, setup.healthy)
        outcomes = _run_all(setup, scenario, setup.rollouts)
        aa[label] = AaRow(rate, {name: _rollouts(outcomes[name]) for name in JUDGES})
        log(
            f"A/A at {rate:g} req/s: {setup.rollouts} rollouts in "
            f"{time.monotonic() - started:.1f} s"
        )
    detection = regressions(setup, log)
    found_streams = streams(setup, log)
    batched = batched_aa(setup, log=log)
    weight = setup.steps[0]
    fast = Scenario(
        "fast",
        setup.fast_canary_rate / (weight / 100),
        setup.steps,
        replace(setup.healthy, error_rate=setup.fast_error_rate),
        replace(setup.healthy, error_rate=0.0),
    )
    outcomes = _run_all(setup, fast, setup.detect_seeds)
    fast_row = FastRow(
        rate=fast.rate,
        weight=weight,
        canary_rate=setup.fast_canary_rate,
        canary_error_rate=setup.fast_error_rate,
        baseline_error_rate=0.0,
        judges={name: _detection(outcomes[name]) for name in JUDGES},
    )
    seconds = round(time.monotonic() - started_all, 1)
    return Measured(aa, detection, found_streams, batched, fast_row, seconds)


def regressions(
    setup: Setup, log: Callable[[str], None] = lambda _: None
) -> dict[str, RegressionRow]:
    """Each regression at each detection weight, one step, by ``name @ weight%``."""
    out: dict[str, RegressionRow] = {}
    for name in REGRESSIONS:
        canary = regressed(setup.healthy, name)
        for weight in setup.detect_weights:
            started = time.monotonic()
            scenario = Scenario(
                f"{name}-w{weight}", setup.detect_rate, (weight,), canary, setup.healthy
            )
            outcomes = _run_all(setup, scenario, setup.detect_seeds)
            check = "latency" if name.startswith("latency") else "errors"
            scenario_spec = setup.spec(scenario.steps)
            fixed = fixed_sample_s(
                scenario_spec, canary, setup.healthy, check, weight, setup.detect_rate
            )
            out[f"{name} @ {weight}%"] = RegressionRow(
                regression=name,
                weight=weight,
                rate=setup.detect_rate,
                fixed_sample_s=_finite(fixed),
                max_s=scenario_spec.max_seconds,
                judges={judge: _detection(outcomes[judge]) for judge in JUDGES},
            )
            log(
                f"{name} at {weight}%: {setup.detect_seeds} runs in "
                f"{time.monotonic() - started:.1f} s"
            )
    return out


def summarize(setup: Setup, measured: Measured) -> Summary:
    """The rules the judges applied (from the setup alone) beside what they decided."""
    spec = setup.spec(setup.steps)
    checks = len([c for c in spec.checks().values() if not c.dry_run])
    rule = Rule(
        interval_s=spec.interval_seconds,
        warmup_s=spec.warmup_seconds,
        min_s=spec.min_seconds,
        min_requests=spec.min_requests,
        max_s=spec.max_seconds,
        on_inconclusive=str(spec.on_inconclusive),
        max_ratio={n: c.max_ratio for n, c in spec.checks().items()},
        budget=spec.false_rollback_budget,
        alpha_per_check_per_step=statistics.check_alpha(
            spec.false_rollback_budget, checks, len(spec.steps)
        ),
        alternative_multipliers=list(statistics.MULTIPLIERS),
    )
    probabilities = setup.healthy.bucket_probabilities()
    return Summary(
        healthy_p95_s=round(setup.healthy.p95(), 6),
        healthy_p95_histogram_quantile_s=round(histogram_quantile_of(0.95, probabilities), 6),
        modelroll=rule,
        flagger=setup.flagger_rule(),
        simulation=measured,
    )


def checks(setup: Setup, summary: Summary) -> list[Check]:
    """The targets, judged on modelroll with the spec's defaults (not the strict variant)."""
    found: list[Check] = []
    measured = summary.simulation
    for row in measured.aa.values():
        ours, theirs = row.judges[MODELROLL], row.judges[FLAGGER]
        found.append(
            (
                f"A/A at {row.rate:g} req/s: modelroll false rollbacks <= 1%",
                ours.rollback_rate <= 0.01,
                ours.text(),
            )
        )
        found.append(
            (
                f"A/A at {row.rate:g} req/s: modelroll rolls back no more than Flagger",
                ours.rolled_back <= theirs.rolled_back,
                f"modelroll {ours.rolled_back}, Flagger {theirs.rolled_back} of {ours.runs}",
            )
        )
    fast, ours_fast = measured.fast, measured.fast.judges[MODELROLL]
    found.append(
        (
            f"{fast.canary_error_rate:.0%} errors at {fast.canary_rate:g} req/s of canary "
            "traffic: every run rolled back within 15 s of reaching the step",
            ours_fast.detected == ours_fast.runs and (ours_fast.max_s or math.inf) <= 15,
            f"{ours_fast.detected}/{ours_fast.runs} rolled back, max {_seconds(ours_fast.max_s)}",
        )
    )
    for name, batched in measured.batched.items():
        ours = batched.judges[MODELROLL]
        found.append(
            (
                f"A/A, {name}, {batched.rate:g} req/s: modelroll false rollbacks <= 1%",
                ours.rollback_rate <= 0.01,
                ours.text(),
            )
        )
    for cell, regression in measured.detection.items():
        mine = regression.judges[MODELROLL].median_s
        flaggers = regression.judges[FLAGGER].median_s
        found.append(_against_fixed_sample(cell, regression, mine))
        if flaggers is not None:
            found.append(
                (
                    f"{cell} at {regression.rate:g} req/s: modelroll's median time to detect <= "
                    "1/10 of Flagger's",
                    mine is not None and mine * 10 <= flaggers,
                    f"modelroll {_seconds(mine)}, Flagger {_seconds(flaggers)}",
                )
            )
    for cell, stream in measured.streams.items():
        found.append(
            (
                f"timeToFirstToken check, A/A at {cell}, {stream.rate:g} req/s: false "
                "rollbacks <= 1%",
                stream.aa.rollback_rate <= 0.01,
                stream.aa.text(),
            )
        )
        name = f"{stream.regression} @ {cell}"
        found.append(_against_fixed_sample(name, stream, stream.detection.median_s))
    return found


def _against_fixed_sample(cell: str, row: RegressionRow | StreamRow, ours: float | None) -> Check:
    """modelroll's median time to detect a regression against a fixed-sample test's."""
    fixed = row.fixed_sample_s
    if fixed is None or 2 * fixed > row.max_s:
        # No test with this budget detects it in half of maxSeconds: nothing to compare.
        met, seen = True, f"fixed-sample {_seconds(fixed)}: beyond maxSeconds/2"
    else:
        met = ours is not None and ours <= 2 * fixed
        seen = f"modelroll {_seconds(ours)}, fixed-sample {_seconds(fixed)}"
    return (
        f"{cell} at {row.rate:g} req/s: modelroll's median time to detect <= 2x a "
        "fixed-sample test's with the same budget",
        met,
        seen,
    )


def _seconds(value: float | None) -> str:
    return "never" if value is None else f"{value:g} s"


def render(setup: Setup, summary: Summary) -> str:
    """The tables docs/analysis.md shows."""
    labels = {name: setup.label(name) for name in (*JUDGES, BY_REQUESTS)}
    h, m, f = setup.healthy, summary.modelroll, summary.flagger
    measured = summary.simulation
    lines = [
        f"Healthy version: {h.error_rate:.1%} errors, lognormal latency median "
        f"{h.median_s * 1000:g} ms sigma {h.sigma:g} (p95 "
        f"{summary.healthy_p95_s * 1000:.0f} ms; histogram_quantile "
        f"{summary.healthy_p95_histogram_quantile_s * 1000:.0f} ms).",
        f"modelroll: interval {m.interval_s} s, warm-up {m.warmup_s} s, min {m.min_s} s "
        f"and {m.min_requests} canary requests, max {m.max_s} s then "
        f"{m.on_inconclusive}, maxRatio 1.5, budget {m.budget:.0%} -> alpha "
        f"{m.alpha_per_check_per_step:.3g} per check and step (3 steps); pass: Lambda <= 1. "
        f"{labels[STRICT]}: the same, but a pass needs every likelihood ratio <= "
        f"{setup.beta:g}.",
        f"Flagger: every {f.interval_s} s over the last {f.interval_s} s, the canary's "
        f"errors > {f.max_error:.0%}, p95 > {f.max_p95_s * 1000:.0f} ms or no request "
        f"fails the check; rollback at {f.threshold} failed checks.",
        "",
        f"A/A rollouts (identical versions), steps {', '.join(f'{w}%' for w in setup.steps)}:",
        f"  {'traffic':<12} {'judge':<18} {'rolled back':>14} {'promoted':>9} {'held':>6} "
        f"{'median promotion':>17}",
    ]
    for aa in measured.aa.values():
        for name in JUDGES:
            r = aa.judges[name]
            lines.append(
                f"  {aa.rate:>6g} req/s {labels[name]:<18} "
                f"{r.rolled_back:>6} ({r.rollback_rate:>5.1%}) {r.promoted:>9} "
                f"{r.held:>6} {_seconds(r.median_promotion_s):>17}"
            )
    lines += [
        "",
        f"Regressions, one step at the weight, {setup.detect_rate:g} req/s in all, "
        f"{setup.detect_seeds} runs each; time from the step being reached to the rollback "
        "(never: promoted or held):",
        f"  {'regression':<13} {'weight':>6}  {'judge':<18} {'caught':>6} {'promoted':>9} "
        f"{'median':>7} {'p95':>7} {'vs Flagger':>10}",
    ]
    for row in measured.detection.values():
        lines.append(
            f"  {row.regression:<13} {str(row.weight) + '%':>6}  "
            f"{'fixed-sample test':<18} {'':>6} {'':>9} {_seconds(row.fixed_sample_s):>7}"
        )
        flagger_median = row.judges[FLAGGER].median_s
        for name in JUDGES:
            d = row.judges[name]
            speedup = (
                f"{flagger_median / d.median_s:.1f}x faster"
                if name != FLAGGER and d.median_s and flagger_median
                else ""
            )
            lines.append(
                f"  {'':<13} {'':>6}  {labels[name]:<18} "
                f"{d.detected:>6} {d.promoted:>9} {_seconds(d.median_s):>7} "
                f"{_seconds(d.p95_s):>7} {speedup:>10}"
            )
    if measured.batched:
        lines += [
            "",
            f"A/A rollouts behind a batching sidecar (step {setup.batched_steps}, "
            f"{setup.batched_rate:g} req/s; whole model calls fail on top of "
            f"{h.error_rate:.1%} of requests; a call's requests share its duration):",
            f"  {'traffic':<30} {'judge':<20} {'rolled back':>14} {'promoted':>9} {'held':>6}",
        ]
        for name, batched in measured.batched.items():
            for i, judge_name in enumerate(BATCHED_JUDGES):
                if judge_name not in batched.judges:
                    continue
                b = batched.judges[judge_name]
                lines.append(
                    f"  {name if i == 0 else '':<30} {labels[judge_name]:<20} "
                    f"{b.rolled_back:>6} ({b.rollback_rate:>5.1%}) {b.promoted:>9} "
                    f"{b.held:>6}"
                )
    if measured.streams:
        lines += [
            "",
            f"Generation streams, judged on errors and timeToFirstToken (maxRatio 1.5), one step "
            f"at the weight, {setup.detect_rate:g} req/s in all, {setup.detect_seeds} runs "
            f"each; time to first token lognormal, median {h.median_s * 1000:g} ms sigma "
            f"{h.sigma:g}, in the gateway's TTFT buckets:",
            f"  {'weight':>6}  {'A/A rolled back':>16} {'promoted':>9}  "
            f"{'TTFT 1.5x: caught':>18} {'median':>7} {'p95':>7} {'fixed-sample':>13}",
        ]
        for cell, stream in measured.streams.items():
            a, d = stream.aa, stream.detection
            lines.append(
                f"  {cell:>6}  {a.rolled_back:>7} ({a.rollback_rate:>5.1%}) "
                f"{a.promoted:>9}  {d.detected:>18} {_seconds(d.median_s):>7} "
                f"{_seconds(d.p95_s):>7} {_seconds(stream.fixed_sample_s):>13}"
            )
    fast = measured.fast
    lines += [
        "",
        f"Fast case: the canary fails {fast.canary_error_rate:.0%} of {fast.canary_rate:g} "
        f"req/s (step 1, {fast.weight}% of {fast.rate:g} req/s), the baseline none; "
        f"{setup.detect_seeds} runs:",
    ]
    for name in JUDGES:
        d = fast.judges[name]
        lines.append(
            f"  {labels[name]:<18} rolled back {d.detected}/{d.runs}: median "
            f"{_seconds(d.median_s)}, p95 {_seconds(d.p95_s)}, max {_seconds(d.max_s)}"
        )
    return "\n".join(lines)


class AnalysisSuite(Suite[Setup, Measured, Summary]):
    name = "analysis"
    help = "canary analysis vs Flagger's rule, on simulated traffic"
    description = __doc__ or ""
    setup_type = Setup
    measured_type = Measured

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
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
            "--detect-rate",
            type=float,
            default=d.detect_rate,
            help="req/s of the regressions (200)",
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
        parser.add_argument(
            "--batched-rollouts",
            type=int,
            default=d.batched_rollouts,
            help="A/A rollouts per batched scenario (1000)",
        )
        parser.add_argument(
            "--batched-rate",
            type=float,
            default=d.batched_rate,
            help="req/s of the batched A/A rollouts (400)",
        )

    def setup(self, args: argparse.Namespace) -> Setup:
        return Setup(
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
            batched_rollouts=args.batched_rollouts,
            batched_rate=args.batched_rate,
        )

    async def measure(self, setup: Setup) -> Measured:
        return simulate(setup, log=lambda line: print(line, file=sys.stderr, flush=True))

    summarize = staticmethod(summarize)
    render = staticmethod(render)
    checks = staticmethod(checks)


SUITE = AnalysisSuite()
