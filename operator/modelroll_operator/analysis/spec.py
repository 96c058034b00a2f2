"""spec.analysis of a ModelVersion: the canary analysis that moves its weight step by step.

A ModelVersion with ``spec.analysis`` is a canary. The operator sets its weight to each step's
in turn (its baseline gets the rest of 100), judges it against the baseline on the gateway's
per-version metrics, and promotes it (canary 100, baseline 0) or rolls it back (canary 0, the
baseline's weight from before the analysis). The CRD validates and defaults every field (CEL);
parsing here applies the same defaults to an object stored before a default existed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from modelroll_common.metric_names import GATEWAY_ADMIN_PORT

from ..spec import SpecError

HOLD = "Hold"
ROLLBACK = "Rollback"
PROMOTE = "Promote"
INCONCLUSIVE_POLICIES = (HOLD, ROLLBACK, PROMOTE)
"""What to do when a step ends (maxSeconds) without a verdict, or metrics cannot be read."""

DEFAULT_GATEWAY_SELECTOR = {
    "app.kubernetes.io/name": "modelroll",
    "app.kubernetes.io/component": "gateway",
}
"""The labels of the chart's gateway pods."""


@dataclass(frozen=True)
class Step:
    """One step: the canary's weight (the baseline gets 100 - weight), and whether the analysis
    waits for ``kubectl modelroll analysis resume`` once the step has passed."""

    weight: int
    pause: bool = False


@dataclass(frozen=True)
class RatioCheck:
    """A check of the canary against the baseline: "bad" requests (errors, or slower than the
    baseline's quantile) may be at most ``max_ratio`` times as frequent in the canary."""

    max_ratio: float
    dry_run: bool = False


DEFAULT_ERROR_CODES = ("5xx", "422", "429")
"""What a version's own failure looks like at the gateway: a server error, the model failing
an item (the sidecar's 422), the version overloaded (its queue full: 429). Other 4xx are the
client's doing and the same for every version."""


STREAM_ERROR = "stream_error"
"""The pseudo status code of a stream that ended badly under a status line that said it went
well (rollout.VersionCounts.judged): an error for every error check, whatever its codes."""


@dataclass(frozen=True)
class ErrorCheck(RatioCheck):
    codes: tuple[str, ...] = DEFAULT_ERROR_CODES
    """Status codes that count as errors: "5xx"-style classes or exact codes ("429")."""

    def is_error(self, code: str) -> bool:
        return code == STREAM_ERROR or any(
            code == c or (len(c) == 3 and c.endswith("xx") and code[:1] == c[:1])
            for c in self.codes
        )


@dataclass(frozen=True)
class LatencyCheck(RatioCheck):
    quantile: float = 0.95
    """The bound is the baseline's latency at this quantile, from its counts of the step before
    the interval judged (statistics.slow_bound)."""


ERRORS = "errors"
LATENCY = "latency"
TTFT = "timeToFirstToken"
TPOT = "timePerOutputToken"
STREAM_CHECKS = (TTFT, TPOT)
"""The latency checks of generation streams (OpenAI versions), judged on the gateway's stream
histograms: each stream that got a first token (or a second) is one request of the check."""


@dataclass(frozen=True)
class Guardrail:
    """An absolute limit: a canary error ratio above ``max_error_ratio`` (after ``min_requests``
    judged requests) rolls back at once, without waiting for the comparison."""

    max_error_ratio: float
    min_requests: int = 20
    dry_run: bool = False


@dataclass(frozen=True)
class ShadowGate:
    """Before its first step, the canary (a version with spec.shadow, at weight 0) is judged
    on shadow copies alone: once ``min_copies`` of its answers were compared with the
    baseline's, it goes on to step 1 if their mean agreement is at least ``min_agreement``,
    and is rolled back (never having had live traffic) if not."""

    min_agreement: float = 0.99
    min_copies: int = 100


@dataclass(frozen=True)
class MetricsSource:
    """Where the per-version counters come from: the gateway pods' /metrics (default, found by
    label selector, or a fixed URL), or a Prometheus server."""

    selector: Mapping[str, str] = field(default_factory=lambda: dict(DEFAULT_GATEWAY_SELECTOR))
    namespace: str | None = None
    """The gateway pods' namespace (default: the ModelVersion's)."""
    port: int = GATEWAY_ADMIN_PORT
    """The gateway pods' admin port, where they serve /metrics."""
    url: str | None = None
    """A fixed /metrics URL of the gateway (a gateway outside the cluster, say)."""
    prometheus_url: str | None = None


@dataclass(frozen=True)
class AnalysisSpec:
    steps: tuple[Step, ...]
    baseline: str | None = None
    """The baseline version; default: the model's highest-weight Ready version but this one."""
    interval_seconds: int = 3
    warmup_seconds: int = 5
    warmup_requests: int = 0
    min_seconds: int = 30
    min_requests: int = 100
    max_seconds: int = 600
    errors: ErrorCheck | None = field(default_factory=lambda: ErrorCheck(max_ratio=1.5))
    latency: LatencyCheck | None = field(default_factory=lambda: LatencyCheck(max_ratio=1.5))
    time_to_first_token: LatencyCheck | None = None
    time_per_output_token: LatencyCheck | None = None
    guardrail: Guardrail | None = None
    shadow: ShadowGate | None = None
    false_rollback_budget: float = 0.01
    """The chance, over the whole analysis, that a canary as good as its baseline is rolled back;
    split evenly over the checks and the steps (docs/analysis.md)."""
    false_promotion_budget: float | None = None
    """With it, a check passes only on evidence: a canary worse than 1.25 x maxRatio passes a
    check of a step with at most this chance. Without it, a check passes when the data do not
    favour a regression (docs/analysis.md, Verdicts)."""
    on_inconclusive: str = HOLD
    metrics: MetricsSource = field(default_factory=MetricsSource)

    def checks(self) -> dict[str, RatioCheck]:
        """The comparison checks in use, by name (their keys in ``spec.analysis.checks``)."""
        named: dict[str, RatioCheck | None] = {
            ERRORS: self.errors,
            LATENCY: self.latency,
            TTFT: self.time_to_first_token,
            TPOT: self.time_per_output_token,
        }
        return {name: check for name, check in named.items() if check is not None}

    @property
    def judges_streams(self) -> bool:
        """Whether a check reads the gateway's stream histograms."""
        return any(name in STREAM_CHECKS for name in self.checks())


def _number(raw: Mapping[str, Any], key: str, where: str, default: float) -> float:
    value = raw.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise SpecError(f"{where}.{key} must be a number, got {value!r}")
    return float(value)


def _int(raw: Mapping[str, Any], key: str, where: str, default: int) -> int:
    value = raw.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise SpecError(f"{where}.{key} must be a non-negative integer, got {value!r}")
    return value


def _block(raw: Mapping[str, Any], key: str, where: str) -> Mapping[str, Any] | None:
    value = raw.get(key)
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise SpecError(f"{where}.{key} must be an object")
    return value


def _latency(raw: Mapping[str, Any], name: str, where: str) -> LatencyCheck | None:
    if (block := _block(raw, name, where)) is None:
        return None
    return LatencyCheck(
        max_ratio=_number(block, "maxRatio", f"{where}.{name}", 1.5),
        dry_run=bool(block.get("dryRun", False)),
        quantile=_number(block, "quantile", f"{where}.{name}", 0.95),
    )


def _checks(
    raw: Mapping[str, Any], where: str
) -> tuple[ErrorCheck | None, LatencyCheck | None, Guardrail | None]:
    errors = guardrail = None
    if (e := _block(raw, "errors", where)) is not None:
        codes = e.get("codes") or list(DEFAULT_ERROR_CODES)
        if not isinstance(codes, list) or not all(isinstance(c, str) for c in codes):
            raise SpecError(f"{where}.errors.codes must be a list of strings")
        errors = ErrorCheck(
            max_ratio=_number(e, "maxRatio", f"{where}.errors", 1.5),
            dry_run=bool(e.get("dryRun", False)),
            codes=tuple(codes),
        )
    latency = _latency(raw, LATENCY, where)
    if (g := _block(raw, "guardrail", where)) is not None:
        guardrail = Guardrail(
            max_error_ratio=_number(g, "maxErrorRatio", f"{where}.guardrail", 0.5),
            min_requests=_int(g, "minRequests", f"{where}.guardrail", 20),
            dry_run=bool(g.get("dryRun", False)),
        )
    return errors, latency, guardrail


def _metrics(raw: Mapping[str, Any] | None, where: str) -> MetricsSource:
    if raw is None:
        return MetricsSource()
    prometheus = _block(raw, "prometheus", where)
    gateway = _block(raw, "gateway", where) or {}
    selector = gateway.get("selector") or DEFAULT_GATEWAY_SELECTOR
    if not isinstance(selector, Mapping):
        raise SpecError(f"{where}.gateway.selector must be an object of labels")
    return MetricsSource(
        selector={str(k): str(v) for k, v in selector.items()},
        namespace=gateway.get("namespace") or None,
        port=_int(gateway, "port", f"{where}.gateway", GATEWAY_ADMIN_PORT),
        url=gateway.get("url") or None,
        prometheus_url=(prometheus or {}).get("url") or None,
    )


def _shadow_gate(raw: Mapping[str, Any] | None, where: str) -> ShadowGate | None:
    if raw is None:
        return None
    return ShadowGate(
        min_agreement=_number(raw, "minAgreement", where, 0.99),
        min_copies=max(1, _int(raw, "minCopies", where, 100)),
    )


def parse_analysis(raw: object) -> AnalysisSpec | None:
    """spec.analysis, or None when the version is no canary."""
    if raw is None:
        return None
    where = "spec.analysis"
    if not isinstance(raw, Mapping):
        raise SpecError(f"{where} must be an object")
    steps = []
    for i, item in enumerate(raw.get("steps") or []):
        if not isinstance(item, Mapping):
            raise SpecError(f"{where}.steps[{i}] must be an object")
        weight = _int(item, "weight", f"{where}.steps[{i}]", 0)
        if not 1 <= weight <= 99:
            raise SpecError(f"{where}.steps[{i}].weight must be within 1..99, got {weight}")
        steps.append(Step(weight=weight, pause=bool(item.get("pause", False))))
    if not steps:
        raise SpecError(f"{where}.steps must list at least one step")
    checks = _block(raw, "checks", where)
    errors: ErrorCheck | None = ErrorCheck(max_ratio=1.5)
    latency: LatencyCheck | None = LatencyCheck(max_ratio=1.5)
    guardrail = None
    if checks is not None:
        errors, latency, guardrail = _checks(checks, f"{where}.checks")
    given = checks or {}
    policy = raw.get("onInconclusive", HOLD)
    if policy not in INCONCLUSIVE_POLICIES:
        raise SpecError(f"{where}.onInconclusive must be one of {', '.join(INCONCLUSIVE_POLICIES)}")
    baseline = raw.get("baseline") or None
    return AnalysisSpec(
        steps=tuple(steps),
        baseline=str(baseline) if baseline else None,
        interval_seconds=max(1, _int(raw, "intervalSeconds", where, 3)),
        warmup_seconds=_int(raw, "warmupSeconds", where, 5),
        warmup_requests=_int(raw, "warmupRequests", where, 0),
        min_seconds=_int(raw, "minSeconds", where, 30),
        min_requests=_int(raw, "minRequests", where, 100),
        max_seconds=_int(raw, "maxSeconds", where, 600),
        errors=errors,
        latency=latency,
        time_to_first_token=_latency(given, TTFT, f"{where}.checks"),
        time_per_output_token=_latency(given, TPOT, f"{where}.checks"),
        guardrail=guardrail,
        shadow=_shadow_gate(_block(raw, "shadow", where), f"{where}.shadow"),
        false_rollback_budget=_number(raw, "falseRollbackBudget", where, 0.01),
        false_promotion_budget=(
            _number(raw, "falsePromotionBudget", where, 0.0)
            if raw.get("falsePromotionBudget") is not None
            else None
        ),
        on_inconclusive=str(policy),
        metrics=_metrics(_block(raw, "metrics", where), f"{where}.metrics"),
    )
