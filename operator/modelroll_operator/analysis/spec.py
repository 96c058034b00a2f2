"""spec.analysis of a ModelVersion: the canary analysis that moves its weight step by step.

A ModelVersion with ``spec.analysis`` is a canary. The operator sets its weight to each step's
in turn (its baseline gets the rest of 100), judges it against the baseline on the gateway's
per-version metrics, and promotes it (canary 100, baseline 0) or rolls it back (canary 0, the
baseline's weight from before the analysis). The CRD validates and defaults every field (CEL);
the classes below declare each field once (``..schema.api``), and ``make generate`` writes the
CRD's schema of spec.analysis from them; :func:`parse_analysis` reads a stored one with the same
defaults and bounds, so an object stored before a default existed reads as it would now.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from modelroll_common.metric_names import GATEWAY_ADMIN_PORT

from ..schema import Rule, api, decode

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


DESCRIPTION = (
    "Makes this version a canary: the operator moves its weight through the steps, judges it "
    "against a baseline version on the gateway's per-version metrics (the same window for "
    "both, as a comparison), and promotes it (this version takes the baseline's weight, the "
    "baseline stays up at 0) or rolls it back (this version 0, the baseline its weight from "
    "before). Remove the block to stop the analysis where it is. See docs/analysis.md."
)
"""What ``kubectl explain`` says of spec.analysis."""


@dataclass(frozen=True)
class Step:
    """One step."""

    weight: int = api(
        "The canary's weight at this step, 1 to 99 (the baseline keeps the rest, so the two can "
        "be compared; promotion follows the last step).",
        minimum=1,
        maximum=99,
    )
    """The canary's weight (the baseline gets 100 - weight)."""
    pause: bool = api(
        "Once this step has passed, wait for `kubectl modelroll analysis resume` before going on.",
        default=False,
        defaulted=True,
    )


def max_ratio(what: str) -> float:
    """A declared maxRatio, ``what`` the share it bounds."""
    return api(  # type: ignore[no-any-return]
        f"The canary fails when its {what} is, with decisive evidence, above maxRatio times the "
        "baseline's (default 1.5).",
        default=1.5,
        defaulted=True,
        rules=(Rule("self >= 1.0 && self <= 100.0", "{path} must be within 1..100"),),
    )


def dry_run(description: str = "Report this check's verdict, never act on it.") -> bool:
    return api(description, default=False, defaulted=True)  # type: ignore[no-any-return]


@dataclass(frozen=True)
class RatioCheck:
    """A check of the canary against the baseline: "bad" requests (errors, or slower than the
    baseline's quantile) may be at most ``max_ratio`` times as frequent in the canary."""

    max_ratio: float = 1.5
    dry_run: bool = dry_run()


DEFAULT_ERROR_CODES = ("5xx", "422", "429")
"""What a version's own failure looks like at the gateway: a server error, the model failing
an item (the sidecar's 422), the version overloaded (its queue full: 429). Other 4xx are the
client's doing and the same for every version."""


STREAM_ERROR = "stream_error"
"""The pseudo status code of a stream that ended badly under a status line that said it went
well (rollout.VersionCounts.judged): an error for every error check, whatever its codes."""


@dataclass(frozen=True)
class ErrorCheck(RatioCheck):
    max_ratio: float = max_ratio("error rate")
    codes: tuple[str, ...] = api(
        'Status codes that count as errors: classes such as "5xx" or single codes such as '
        '"429". Default: 5xx, 422 (the model failed the item) and 429 (the version\'s queue is '
        "full); other 4xx are the client's doing.",
        default=DEFAULT_ERROR_CODES,
        max_items=20,
        items={
            "type": "string",
            "description": 'A code ("429") or a class ("5xx").',
            "pattern": "^[1-5]([0-9]{2}|xx)$",
        },
    )
    """Status codes that count as errors: "5xx"-style classes or exact codes ("429")."""

    def is_error(self, code: str) -> bool:
        return code == STREAM_ERROR or any(
            code == c or (len(c) == 3 and c.endswith("xx") and code[:1] == c[:1])
            for c in self.codes
        )


@dataclass(frozen=True)
class LatencyCheck(RatioCheck):
    quantile: float = api(
        "The baseline's value at this quantile is the bound, read from its counts of the step "
        "before each judged interval (default 0.95).",
        default=0.95,
        defaulted=True,
        rules=(Rule("self >= 0.5 && self < 1.0", "{path} must be within 0.5..1 (1 excluded)"),),
    )
    """The bound is the baseline's latency at this quantile, from its counts of the step before
    the interval judged (statistics.slow_bound)."""
    max_ratio: float = max_ratio("share of slow requests")


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

    max_error_ratio: float = api(
        "The largest tolerated error ratio (default 0.5).",
        default=0.5,
        defaulted=True,
        rules=(Rule("self > 0.0 && self <= 1.0", "{path} must be within 0..1 (0 excluded)"),),
    )
    min_requests: int = api(
        "Judged canary requests before the guardrail applies (default 20).",
        default=20,
        defaulted=True,
        minimum=1,
        maximum=100000000,
    )
    dry_run: bool = dry_run("Report a breach, never act on it.")


@dataclass(frozen=True)
class Checks:
    """spec.analysis.checks: the comparison checks and the guardrail a spec names."""

    errors: ErrorCheck | None = api(
        "The canary's error rate against the baseline's, in the same window.", default=None
    )
    latency: LatencyCheck | None = api(
        "The share of the canary's requests slower than the baseline's latency quantile, against "
        "the baseline's own share, in the same window (from the gateway's latency histogram).",
        default=None,
    )
    time_to_first_token: LatencyCheck | None = api(
        "For generation streams (an OpenAI version's): the share of the canary's streams whose "
        "first token came later than the baseline's quantile of time to first token, against "
        "the baseline's own share, in the same window (from the gateway's histogram of the "
        "streams it routed by weight). A step passes only once both versions have streamed.",
        default=None,
    )
    time_per_output_token: LatencyCheck | None = api(
        "For generation streams (an OpenAI version's): the share of the canary's streams slower "
        "per output token (first token to last, over the tokens after the first) than the "
        "baseline's quantile, against the baseline's own share, in the same window (from the "
        "gateway's histogram). A step passes only once both versions have streamed.",
        default=None,
    )
    guardrail: Guardrail | None = api(
        "An absolute limit that rolls back at once: the canary's error ratio (errors as the "
        "errors check counts them) above maxErrorRatio.",
        default=None,
    )


def _default_checks() -> Checks:
    """Without a checks block: errors and latency, each with its defaults."""
    return Checks(errors=ErrorCheck(), latency=LatencyCheck())


@dataclass(frozen=True)
class ShadowGate:
    """Before its first step, the canary (a version with spec.shadow, at weight 0) is judged
    on shadow copies alone: once ``min_copies`` of its answers were compared with the
    baseline's, it goes on to step 1 if their mean agreement is at least ``min_agreement``,
    and is rolled back (never having had live traffic) if not."""

    min_agreement: float = api(
        "The lowest mean agreement that passes (default 0.99): 1 or 0 per copy for equal or "
        "different outputs, the cosine similarity for vectors.",
        default=0.99,
        defaulted=True,
        rules=(Rule("self >= -1.0 && self <= 1.0", "{path} must be within -1..1"),),
    )
    min_copies: int = api(
        "Shadow copies compared before the gate decides (default 100).",
        default=100,
        defaulted=True,
        minimum=1,
        maximum=1000000,
    )


HTTP_URL = Rule("self.matches('^https?://[^/?#@]+(/[^?#]*)?$')", "{path} must be an http(s) URL")


@dataclass(frozen=True)
class GatewaySource:
    """spec.analysis.metrics.gateway: the gateway pods whose /metrics are read (found by label
    selector), or one fixed URL (a gateway outside the cluster, say)."""

    selector: Mapping[str, str] = api(
        "Labels of the gateway pods (default: the chart's, app.kubernetes.io/name=modelroll and "
        "app.kubernetes.io/component=gateway).",
        default_factory=lambda: dict(DEFAULT_GATEWAY_SELECTOR),
        max_properties=20,
    )
    namespace: str | None = api(
        "The gateway pods' namespace (default this version's). Another one only if the "
        "operator's --analysis-gateway-namespace lists it.",
        default=None,
        empty_is_none=True,
        max_length=63,
    )
    port: int = api(
        "The gateway pods' admin port, where they serve /metrics "
        f"(default {GATEWAY_ADMIN_PORT}, the gateway's --admin-port).",
        default=GATEWAY_ADMIN_PORT,
        defaulted=True,
        minimum=1,
        maximum=65535,
    )
    url: str | None = api(
        "One gateway's /metrics URL instead of pods: a Service of this version's namespace, "
        "http://SERVICE.NAMESPACE.svc:PORT/metrics, or a URL under one of the operator's "
        "--analysis-url-prefix (a gateway outside the cluster). Redirects are not followed.",
        default=None,
        empty_is_none=True,
        max_length=2048,
        rules=(HTTP_URL,),
    )


@dataclass(frozen=True)
class PrometheusSource:
    """spec.analysis.metrics.prometheus: a Prometheus server that scrapes the gateway."""

    url: str = api(
        "Its base URL: a Service of this version's namespace, http://SERVICE.NAMESPACE.svc:9090, "
        "or a URL under one of the operator's --analysis-url-prefix, such as "
        "http://prometheus-operated.monitoring.svc:9090 for a Prometheus shared by namespaces. "
        "Its series are selected by namespace (the gateway pods', or the sidecars' for a model "
        "an HTTPRoute routes), model and version.",
        max_length=2048,
        rules=(HTTP_URL,),
    )


@dataclass(frozen=True)
class MetricsSource:
    """Where the per-version counters come from: the gateway pods' /metrics (default, found by
    label selector, or a fixed URL), or a Prometheus server."""

    RULES = (
        Rule(
            "!has(self.prometheus) || !has(self.gateway)",
            "{path} takes one of gateway and prometheus",
        ),
    )

    gateway: GatewaySource = api(
        "The gateway pods to read, or one URL.", default_factory=GatewaySource
    )
    prometheus: PrometheusSource | None = api(
        "A Prometheus server that scrapes the gateway.", default=None
    )

    @property
    def prometheus_url(self) -> str | None:
        return self.prometheus.url if self.prometheus is not None else None

    # The gateway's fields, read where the source is the gateway:

    @property
    def selector(self) -> Mapping[str, str]:
        return self.gateway.selector

    @property
    def namespace(self) -> str | None:
        return self.gateway.namespace

    @property
    def port(self) -> int:
        return self.gateway.port

    @property
    def url(self) -> str | None:
        return self.gateway.url


@dataclass(frozen=True)
class AnalysisSpec:
    RULES = (
        Rule(
            "!has(self.minSeconds) || !has(self.maxSeconds) || self.minSeconds <= self.maxSeconds",
            "{path}.minSeconds must not exceed {path}.maxSeconds: no step could ever pass",
        ),
    )

    steps: tuple[Step, ...] = api(
        "The canary's weight at each step, in order. At a step of weight w the canary gets w "
        "and the baseline 100 - w (scaled to the baseline's weight before the analysis, when "
        "that was above 100). After the last step passes the canary is promoted.",
        min_items=1,
        max_items=20,
    )
    baseline: str | None = api(
        "The version to compare with (a ModelVersion of the same model). Default: the model's "
        "highest-weight Ready version other than this one.",
        default=None,
        empty_is_none=True,
        max_length=253,
    )
    """The baseline version; default: the model's highest-weight Ready version but this one."""
    interval_seconds: int = api(
        "Seconds between two evaluations (1 to 3600; default 3).",
        default=3,
        defaulted=True,
        minimum=1,
        maximum=3600,
    )
    warmup_seconds: int = api(
        "Seconds after a step's weights are written during which nothing is judged (0 to 3600; "
        "default 5): the gateway takes them up, caches warm.",
        default=5,
        defaulted=True,
        minimum=0,
        maximum=3600,
    )
    warmup_requests: int = api(
        "Canary requests in a step that are not judged, besides warmupSeconds (default 0).",
        default=0,
        defaulted=True,
        minimum=0,
        maximum=100000000,
    )
    min_seconds: int = api(
        "Seconds a step must be judged before it may pass (default 30). A failing canary is "
        "rolled back as soon as the evidence is decisive, whatever this says.",
        default=30,
        defaulted=True,
        minimum=0,
        maximum=86400,
    )
    min_requests: int = api(
        "Judged canary requests a step needs before it may pass (default 100).",
        default=100,
        defaulted=True,
        minimum=0,
        maximum=100000000,
    )
    max_seconds: int = api(
        "Seconds after which a step without a verdict is inconclusive, and onInconclusive "
        "applies (default 600).",
        default=600,
        defaulted=True,
        minimum=1,
        maximum=604800,
    )
    on_inconclusive: str = api(
        "What a step without a verdict after maxSeconds leads to: Hold (the default: the "
        "weights stay, the analysis goes on and says why; never a rollback), Rollback or "
        "Promote. Metrics that cannot be read always hold.",
        default=HOLD,
        defaulted=True,
        enum=INCONCLUSIVE_POLICIES,
    )
    shadow: ShadowGate | None = api(
        "A gate before step 1 for a version with spec.shadow: the canary stays at weight 0 "
        "while its answers to shadow copies are compared with the baseline's. Once minCopies "
        "were compared, a mean agreement of at least minAgreement goes on to step 1, a lower "
        "one rolls the canary back before it ever had live traffic. Without enough copies by "
        "maxSeconds, it holds.",
        default=None,
    )
    false_rollback_budget: float = api(
        "The chance, over the whole analysis, that a canary as good as its baseline is rolled "
        "back by the comparison checks (default 0.01). It is split evenly over the checks that "
        "are not dry-run and the steps.",
        default=0.01,
        defaulted=True,
        rules=(Rule("self > 0.0 && self < 0.5", "{path} must be above 0 and below 0.5"),),
    )
    """The chance, over the whole analysis, that a canary as good as its baseline is rolled back;
    split evenly over the checks and the steps (docs/analysis.md)."""
    false_promotion_budget: float | None = api(
        "Unset (the default), a check passes when the data do not favour a regression, which a "
        "small sample never does. Set, a check passes only on evidence: a canary worse than "
        "1.25 x maxRatio passes a check of a step with at most this chance, and steps take more "
        "traffic to pass (docs/analysis.md, Verdicts).",
        default=None,
        rules=(Rule("self > 0.0 && self < 0.5", "{path} must be above 0 and below 0.5"),),
    )
    checked: Checks = api(
        "What is judged. Without this block: errors and latency, each with maxRatio 1.5. The "
        "stream checks (timeToFirstToken, timePerOutputToken) judge only when listed.",
        default_factory=_default_checks,
        name="checks",
    )
    """spec.analysis.checks (the checks in use by name: :meth:`checks`)."""
    metrics: MetricsSource = api(
        "Where the counters come from. Default: the gateway pods' /metrics, found by label "
        "selector and summed over replicas (no Prometheus, no scrape delay). A source that "
        "cannot be read, or that the operator may not read, means Hold, never Rollback: an "
        "analysis reads its own namespace only, unless the operator's flags allow more "
        "(operator/README.md, What an analysis may read).",
        default_factory=MetricsSource,
    )

    @property
    def errors(self) -> ErrorCheck | None:
        return self.checked.errors

    @property
    def latency(self) -> LatencyCheck | None:
        return self.checked.latency

    @property
    def guardrail(self) -> Guardrail | None:
        return self.checked.guardrail

    def checks(self) -> dict[str, RatioCheck]:
        """The comparison checks in use, by name (their keys in ``spec.analysis.checks``)."""
        named: dict[str, RatioCheck | None] = {
            ERRORS: self.checked.errors,
            LATENCY: self.checked.latency,
            TTFT: self.checked.time_to_first_token,
            TPOT: self.checked.time_per_output_token,
        }
        return {name: check for name, check in named.items() if check is not None}

    @property
    def judges_streams(self) -> bool:
        """Whether a check reads the gateway's stream histograms."""
        return any(name in STREAM_CHECKS for name in self.checks())


def parse_analysis(raw: object) -> AnalysisSpec | None:
    """spec.analysis, or None when the version is no canary."""
    return None if raw is None else decode(AnalysisSpec, raw, "spec.analysis")
