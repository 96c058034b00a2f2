"""The statistics of a canary analysis: is the canary's bad-request rate more than ``max_ratio``
times its baseline's? Pure functions, no I/O; docs/analysis.md explains the math for users.

Both checks (errors, latency) are the same test on different "bad" requests. Per interval the
caller passes each version's requests and bad requests (the deltas of the gateway's counters
over the interval). Given the interval's request counts ``n_c`` (canary) and ``n_b``
(baseline), and the number of bad requests, each bad request is the canary's with probability

    theta(r) = r n_c / (r n_c + n_b)        (r = canary bad rate / baseline bad rate)

H0 (the canary is acceptable) is ``r <= k`` with ``k = max_ratio``: ``theta <= theta(k)``. For
an alternative ``r1 = k m`` (``m > 1``) the interval's likelihood ratio

    theta1^e_c (1 - theta1)^e_b / (theta0^e_c (1 - theta0)^e_b)

has expectation at most 1 under H0, whatever the interval's counts, so its product over
intervals is a nonnegative supermartingale, and so is the equal-weight mixture ``Lambda`` over
the grid ``MULTIPLIERS`` of ``m``. Ville's inequality: P(Lambda ever reaches 1/alpha) <= alpha,
however often it is looked at and however long the step runs. Hence:

- FAIL when Lambda >= 1/alpha (the rollback is wrong with probability at most alpha);
- PASS when Lambda <= 1 (the data do not favour a regression); the caller accepts it only
  once its minimums (minSeconds, minRequests) are met. This pass promises nothing about
  regressions too small for the minimums' sample to show; ``verdict(..., beta=)`` is a
  stricter rule that does (a canary with r >= MULTIPLIERS[0] * k passes with probability at
  most beta);
- INCONCLUSIVE otherwise.

Each interval uses its own ``n_c``, ``n_b`` (the weights change between steps, traffic
fluctuates), so intervals are never pooled before the likelihood is computed. An interval in
which either version had no requests carries no information about the ratio (theta is 0 or 1
under every hypothesis): its bad requests are counted but change no likelihood.

The unit is the model call, not the request (:class:`Counts`): a batch's requests succeed or
fail together and share its duration, so the counts above are of calls (a request is 1/n of a
call that answered n requests) and each call contributes its bad fraction ``x`` in [0, 1]. Since
``a**x <= 1 + x (a - 1)`` on [0, 1], the interval's ratio keeps expectation at most 1 under H0
when the calls are independent given their counts; a whole-batch failure is one bad call.
Requests answered without a model call (a full queue, a deadline in the queue) are calls of one.

Exactness: the conditional binomial is exact when each version's bad calls are Poisson
given its call count. With binomial counts (each request bad with probability p) and
identical versions, the canary's share of the bad requests is hypergeometric, which is less
spread than the binomial: the test stays valid (conservative). Between r = 1 and r = k with
large bad rates (tens of %), the binomial's H0 is, strictly, on the odds ratio
p_c (1 - p_b) / (p_b (1 - p_c)) rather than the rate ratio.

The latency check's bound (:func:`slow_bound`) must not be computed from the very counts it is
applied to: the caller computes it from the baseline's counts of the step up to the previous
reading (warm-up included), then applies it (:func:`over`) to both versions' deltas of the
interval. See its docstring.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ..schema import Json, api

FAIL = "Fail"
PASS = "Pass"  # noqa: S105 (a verdict, not a password)
INCONCLUSIVE = "Inconclusive"

MULTIPLIERS: tuple[float, ...] = (1.25, 1.5, 2.0, 3.0, 5.0, 10.0, 30.0, 100.0, 1000.0)
"""The alternatives of the mixture, as multiples of max_ratio: r1 = max_ratio * m. The low ones
catch regressions just beyond the tolerance (2x with max_ratio 1.5); the high ones make a canary
failing where the baseline does not (errors 0 in the baseline) fail after a few bad requests."""

STATISTIC_CAP = 1e300
"""statistic() is capped here so that it stays a finite JSON number."""

Buckets = Sequence[tuple[float, float]]
"""A cumulative histogram: (le, count) ascending by le, the last le is +Inf (the total)."""


@dataclass(frozen=True)
class Counts:
    """Requests and bad requests, and the model calls behind them: what the likelihood is
    computed on. A request is 1/n of a call that answered n requests together, so a batch that
    failed whole is one bad call. Without ``calls``, each request is its own call."""

    requests: int
    bad: int
    calls: float | None = None
    bad_calls: float | None = None

    def units(self) -> tuple[float, float]:
        """The calls and bad calls, consistent (0 <= bad <= calls): the request counter and
        the histogram are read in one scrape but not updated atomically, so they may disagree
        by a request or two."""
        if self.calls is None:
            n, bad = float(max(0, self.requests)), float(max(0, self.bad))
        else:
            n, bad = max(0.0, self.calls), max(0.0, self.bad_calls or 0.0)
        return n, min(bad, n)


REQUESTS_SCHEMA: Json = {
    "type": "object",
    "properties": {
        "requests": {"type": "integer", "description": "Requests.", "format": "int64"},
        "bad": {
            "type": "integer",
            "description": "Of which bad (errors, or slower than the bound).",
            "format": "int64",
        },
    },
}
"""How status.analysis stores requests and bad ones."""


def _counts_schema() -> Json:
    """How status.analysis stores Counts: the requests, and the model calls if counted."""
    return {
        "type": "object",
        "properties": {
            **REQUESTS_SCHEMA["properties"],
            "calls": {
                "type": "number",
                "description": "The model calls behind the requests, what the test counts (a "
                "batch's requests are one call).",
            },
            "badCalls": {"type": "number", "description": "Of which bad."},
        },
    }


def _read_counts(raw: object, where: str) -> Counts:
    """Counts as stored; unreadable parts read as none."""
    if not isinstance(raw, Mapping):
        return Counts(0, 0)
    requests, bad = _count(raw.get("requests")), _count(raw.get("bad"))
    calls = _amount(raw.get("calls"))
    if calls is None:
        return Counts(requests, bad)
    return Counts(requests, bad, calls, _amount(raw.get("badCalls")) or 0.0)


def _write_counts(counts: Counts) -> Json:
    out: Json = {"requests": counts.requests, "bad": counts.bad}
    if counts.calls is not None:
        out["calls"], out["badCalls"] = (_round(x) for x in counts.units())
    return out


def _read_log_lr(raw: object, where: str) -> tuple[float, ...]:
    """A ``logLR`` as stored; one of another length (written for another grid of alternatives)
    or unreadable starts anew."""
    fresh = (0.0,) * len(MULTIPLIERS)
    if not isinstance(raw, list) or len(raw) != len(MULTIPLIERS):
        return fresh
    try:
        parsed = tuple(float(x) for x in raw)
    except (TypeError, ValueError):
        return fresh
    return parsed if all(math.isfinite(x) for x in parsed) else fresh


def _counts_field(description: str) -> Counts:
    return api(  # type: ignore[no-any-return]
        description,
        default=Counts(0, 0),
        stored=_counts_schema(),
        read=_read_counts,
        write=_write_counts,
    )


@dataclass(frozen=True)
class Evidence:
    """What a check has judged so far in a step (stored in status.analysis.checks, floats to
    6 significant digits)."""

    canary: Counts = _counts_field("The canary's judged requests and bad ones.")
    """Requests and bad requests judged so far in this step (the sum of the interval deltas)."""
    baseline: Counts = _counts_field("The baseline's judged requests and bad ones.")
    log_lr: tuple[float, ...] = api(
        "The log likelihood ratio for each alternative of the test's mixture.",
        default=(0.0,) * len(MULTIPLIERS),
        name="logLR",
        max_items=32,
        items={"type": "number", "description": "One alternative's log likelihood ratio."},
        read=_read_log_lr,
        write=lambda values: [_round(x) for x in values],
    )
    """The log likelihood ratio of each alternative of :data:`MULTIPLIERS`, in order."""


def _round(value: float) -> float:
    return float(f"{value:.6g}")


def _amount(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return max(0.0, float(value))


def _count(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return 0
    return max(0, int(value))


def new_evidence() -> Evidence:
    return Evidence(Counts(0, 0), Counts(0, 0), (0.0,) * len(MULTIPLIERS))


def update(evidence: Evidence, max_ratio: float, canary: Counts, baseline: Counts) -> Evidence:
    """Add one interval: each version's requests and bad requests over the interval, and the
    model calls behind them (:meth:`Counts.units`), on which the likelihood is computed. A
    counter reset is the caller's to detect (its deltas are meaningless)."""
    if not max_ratio > 0 or not math.isfinite(max_ratio):
        raise ValueError(f"max_ratio must be a positive number, got {max_ratio!r}")
    n_c, e_c = canary.units()
    n_b, e_b = baseline.units()
    log_lr = evidence.log_lr
    if len(log_lr) != len(MULTIPLIERS):
        log_lr = new_evidence().log_lr
    if n_c > 0 and n_b > 0 and e_c + e_b > 0:
        theta0 = max_ratio * n_c / (max_ratio * n_c + n_b)
        step = []
        for m in MULTIPLIERS:
            r1 = max_ratio * m
            theta1 = r1 * n_c / (r1 * n_c + n_b)
            # log((1 - theta1) / (1 - theta0)) without cancellation: 1 - theta = n_b / (...)
            step.append(
                e_c * math.log(theta1 / theta0)
                + e_b * math.log((max_ratio * n_c + n_b) / (r1 * n_c + n_b))
            )
        log_lr = tuple(x + d for x, d in zip(log_lr, step, strict=True))
    return Evidence(
        canary=_plus(evidence.canary, canary),
        baseline=_plus(evidence.baseline, baseline),
        log_lr=log_lr,
    )


def _plus(total: Counts, interval: Counts) -> Counts:
    """The counts so far and an interval's: requests clamped as :meth:`Counts.units` does; calls
    kept once either has them."""
    requests = max(0, int(interval.requests))
    bad = min(max(0, int(interval.bad)), requests)
    if total.calls is None and interval.calls is None:
        return Counts(total.requests + requests, total.bad + bad)
    calls, bad_calls = total.units()
    n, e = interval.units()
    return Counts(total.requests + requests, total.bad + bad, calls + n, bad_calls + e)


def log_statistic(evidence: Evidence) -> float:
    """log(Lambda): the log of the mean of the alternatives' likelihood ratios."""
    if not evidence.log_lr:
        return 0.0
    top = max(evidence.log_lr)
    total = math.fsum(math.exp(x - top) for x in evidence.log_lr)
    return top + math.log(total / len(evidence.log_lr))


def statistic(evidence: Evidence) -> float:
    """The mixture likelihood ratio Lambda (1 for fresh evidence), capped at STATISTIC_CAP."""
    log_value = log_statistic(evidence)
    if log_value >= math.log(STATISTIC_CAP):
        return STATISTIC_CAP
    return math.exp(log_value)


def verdict(evidence: Evidence, alpha: float, beta: float | None = None) -> str:
    """FAIL when Lambda >= 1/alpha; PASS when Lambda <= 1; else INCONCLUSIVE. The minimums
    (minSeconds, minRequests) that a PASS needs are the caller's to check.

    With ``beta``, a PASS needs evidence instead: every alternative's likelihood ratio at most
    ``beta`` (then Lambda <= beta too). A canary whose bad rate is at least ``MULTIPLIERS[0]``
    times ``max_ratio`` the baseline's then passes with probability at most ``beta`` (Ville's
    inequality on the inverse likelihood ratio of that alternative), however often it is
    looked at. A check that has seen no bad request at all, in either version, passes: there
    is nothing to compare (and no regression of a rate that is 0 in both to fear much).
    """
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be within (0, 1), got {alpha!r}")
    log_value = log_statistic(evidence)
    if log_value >= -math.log(alpha):
        return FAIL
    if beta is None:
        return PASS if log_value <= 0.0 else INCONCLUSIVE
    if not 0 < beta < 1:
        raise ValueError(f"beta must be within (0, 1), got {beta!r}")
    if evidence.canary.bad + evidence.baseline.bad == 0:
        return PASS
    if evidence.log_lr and max(evidence.log_lr) <= math.log(beta):
        return PASS
    return INCONCLUSIVE


def check_alpha(budget: float, checks: int, steps: int) -> float:
    """The false-rollback budget of a whole analysis, split evenly (union bound) over its
    non-dry-run checks and its steps: each check of each step may fail a canary as good as its
    baseline with probability at most this."""
    if not 0 < budget < 1:
        raise ValueError(f"the false-rollback budget must be within (0, 1), got {budget!r}")
    return budget / (max(1, checks) * max(1, steps))


MAX_LOWER_TAIL_FACTOR = 5.0
"""The lower of the two bounds is taken only while at most this many times ``1 - quantile`` of
the baseline is above it: a baseline whose requests all fall in one bucket has no request above
the upper bound and all of them above the lower one, and a bound that every request exceeds
tells nothing (the canary's slow share cannot rise above 1)."""


def slow_bound(baseline: Buckets, quantile: float) -> float | None:
    """The latency bound of the latency check: the bucket bound ``le`` of the baseline's
    histogram nearest to its ``quantile``; None when the baseline has no requests (or the
    histogram has no finite bound).

    Of the two bounds around the quantile (the smallest ``le`` at which the baseline's
    cumulative fraction reaches ``quantile``, whose tail fraction is at most ``1 - quantile``,
    and the ``le`` below it, whose tail is above), the one whose tail fraction is nearer to
    ``1 - quantile`` by ratio: the lower one when ``tail_lo * tail_hi < (1 - quantile)**2``.
    With buckets 2-2.5x apart, always taking the upper one can leave a tail of a few in ten
    thousand (a p95 just above a bucket bound), and a test with almost no bad requests.

    The bound must come from baseline counts *before* the interval it is applied to (the
    step's earlier intervals, warm-up included): a bound taken from the same counts is chosen
    so that the baseline has few slow requests in them, which the canary does not, and an A/A
    canary fails far more often than alpha when counts are low (test_statistics.py shows it).
    """
    if not 0 < quantile < 1:
        raise ValueError(f"quantile must be within (0, 1), got {quantile!r}")
    finite = [(le, n) for le, n in baseline if math.isfinite(le)]
    total = baseline[-1][1] if baseline else 0.0
    if total <= 0 or not finite:
        return None
    target = quantile * total
    hi = next((i for i, (_, n) in enumerate(finite) if n >= target), None)
    if hi is None:  # the quantile is in the +Inf bucket: the largest finite bound
        return finite[-1][0]
    if hi == 0:
        return finite[0][0]
    tail_hi = (total - finite[hi][1]) / total
    tail_lo = (total - finite[hi - 1][1]) / total
    if tail_lo * tail_hi < (1 - quantile) ** 2 and tail_lo <= MAX_LOWER_TAIL_FACTOR * (
        1 - quantile
    ):
        return finite[hi - 1][0]
    return finite[hi][0]


def over(buckets: Buckets, bound: float) -> float:
    """Requests slower than ``bound``: the total minus the cumulative count at ``le == bound``.
    An empty histogram (no requests) has none; ``bound`` must be one of the histogram's les."""
    if not buckets:
        return 0.0
    total = buckets[-1][1]
    for le, count in buckets:
        if le == bound or math.isclose(le, bound, rel_tol=1e-9):
            return max(0.0, total - count)
    raise ValueError(f"{bound!r} is not a bucket bound of the histogram")
