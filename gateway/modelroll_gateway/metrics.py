"""Gateway metrics (prometheus-client), one registry per app, labelled by model and version."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from modelroll_common import metric_names as names
from modelroll_common.calls import SharedHistogram
from modelroll_common.server import PHASES

AGREEMENT_BUCKETS = (0.0, 0.5, 0.8, 0.9, 0.95, 0.98, 0.99, 0.995, 0.999, 1.0)
"""Agreement of shadow answers: 1 for equal outputs (or identical vectors), 0 for different
ones, a cosine similarity in between (at most 0 for opposite vectors)."""

PRECREATED_CODES = ("200", "502")
"""Codes whose series exist at 0 for every routed version, so error ratios are never absent."""

WEIGHT = names.ROUTED_BY_WEIGHT
PIN = names.ROUTED_BY_PIN
COHORT = names.ROUTED_BY_COHORT
COHORT_OVER_BUDGET = names.ROUTED_BY_COHORT_OVER_BUDGET
ROUTINGS = (WEIGHT, PIN, COHORT, COHORT_OVER_BUDGET)
"""The ``routing`` label of requests a version answered: how the gateway chose the version, by
the routes' weights, pinned by the version header, or by the request's cohort key (within the
key's budget, or past it). A canary analysis judges only names.JUDGED_ROUTINGS: any client may
pin, and a client may pick its key. A request no version answered has ``""``."""

UPSTREAM_ERROR_REASONS = ("connect", "timeout", "protocol", "closed")
"""The ``reason`` label of modelroll_gateway_upstream_errors_total (UpstreamError.reason)."""

UNROUTED = ""
"""The model/version label of a request no route matched (an unknown name is never a label)."""


class GatewayMetrics:
    """The gateway's collectors, registered in `registry`."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.requests = Counter(
            names.GATEWAY_REQUESTS,
            "Requests the gateway answered, by model, version, routing (weight: picked by the "
            "routes' weights; pin: pinned by the X-Modelroll-Version header; cohort: by the "
            "request's cohort key, within the key's --cohort-key-budget; cohort_over_budget: by "
            "its key, past that budget; empty for a request no version answered) and HTTP "
            "status code. 200 and 502 exist at 0 for every routed version and routing, the "
            "cohort ones for a model with a cohort header. A canary analysis judges only weight "
            "and cohort.",
            ["model", "version", "routing", "code"],
            registry=registry,
        )
        self.duration = Histogram(
            names.GATEWAY_REQUEST_DURATION,
            "Time from a request's arrival at the gateway to its response, by model, version and "
            "routing.",
            ["model", "version", "routing"],
            buckets=names.DURATION_BUCKETS,
            registry=registry,
        )
        self.calls = Counter(
            names.GATEWAY_MODEL_CALLS,
            "The model calls behind the requests of modelroll_gateway_requests_total (same "
            "labels): each answer adds 1/n, n the requests the version's model call answered "
            "together (the sidecar's X-Modelroll-Batch-Size header), or 1 without the header. "
            "What a canary analysis counts: a batch's requests fail together and share its "
            "duration.",
            ["model", "version", "routing", "code"],
            registry=registry,
        )
        self.call_duration = SharedHistogram(
            names.GATEWAY_MODEL_CALL_DURATION,
            "modelroll_gateway_request_duration_seconds counted per model call: each request adds "
            "1/n of a call, as in modelroll_gateway_model_calls_total.",
            ["model", "version", "routing"],
            names.DURATION_BUCKETS,
            registry,
        )
        self.weight = Gauge(
            names.GATEWAY_WEIGHT,
            "Routing weight in force for each version, as the gateway sees the routes.",
            ["model", "version"],
            registry=registry,
        )
        self.upstream_errors = Counter(
            names.GATEWAY_UPSTREAM_ERRORS,
            "Requests a version did not answer, by model, version and reason: connect (no "
            "connection could be opened), timeout, protocol (an invalid or ambiguous answer), "
            "closed (the connection ended after the request was sent; never sent again).",
            ["model", "version", "reason"],
            registry=registry,
        )
        self.upstream_connections = Gauge(
            names.GATEWAY_UPSTREAM_CONNECTIONS,
            "Connections from the gateway to a version, open or being opened "
            "(at most --upstream-max-connections).",
            ["model", "version"],
            registry=registry,
        )
        self.upstream_waiting = Gauge(
            names.GATEWAY_UPSTREAM_WAITING,
            "Requests waiting for a free connection to a version (all were busy).",
            ["model", "version"],
            registry=registry,
        )
        self.upstream_queued = Counter(
            names.GATEWAY_UPSTREAM_QUEUED,
            "Requests that had to wait for a free connection to a version.",
            ["model", "version"],
            registry=registry,
        )
        self.routes_invalid = Counter(
            names.GATEWAY_ROUTES_INVALID,
            "Routes documents rejected as invalid, a ConfigMap deleted after it was read "
            "included (the last good routes stayed in force).",
            registry=registry,
        )
        self.routes_updates = Counter(
            names.GATEWAY_ROUTES_UPDATES,
            "Routes updates applied (a model's route added, changed or removed).",
            registry=registry,
        )
        self.watch_restarts = Counter(
            names.GATEWAY_WATCH_RESTARTS,
            "Times the routes ConfigMap watch was re-established, by reason.",
            ["reason"],
            registry=registry,
        )
        for reason in ("expired", "error", "closed"):
            self.watch_restarts.labels(reason)
        self.client_timeouts = Counter(
            names.GATEWAY_CLIENT_TIMEOUTS,
            "Clients cut off for not sending their whole request within --read-timeout, by how "
            "far they got: silent (nothing), head, or body (no model or version: not known "
            "yet).",
            ["phase"],
            registry=registry,
        )
        for phase in PHASES:
            self.client_timeouts.labels(phase)
        self.pins_ignored = Counter(
            names.GATEWAY_PINS_IGNORED,
            "Requests whose version header was ignored (routed by weight instead): the client "
            "was outside --trusted-networks (and --pins-from-any-client is off).",
            registry=registry,
        )
        self.llm_ttft = Histogram(
            names.GATEWAY_LLM_TTFT,
            "OpenAI generation streams: time from a request's arrival at the gateway to the first "
            "generated token it passed back, by model, version and routing; "
            "spec.analysis.checks.timeToFirstToken judges those routed by weight.",
            ["model", "version", "routing"],
            buckets=names.TTFT_BUCKETS,
            registry=registry,
        )
        self.llm_tpot = Histogram(
            names.GATEWAY_LLM_TPOT,
            "OpenAI generation streams: time from the first generated token passed back to the "
            "last, over the tokens after the first, by model, version and routing; "
            "spec.analysis.checks.timePerOutputToken judges those routed by weight.",
            ["model", "version", "routing"],
            buckets=names.TPOT_BUCKETS,
            registry=registry,
        )
        self.llm_requests = Counter(
            names.GATEWAY_LLM_REQUESTS,
            "OpenAI requests forwarded (generations and embeddings), by model, version and how "
            "they ended: completed, error (the version sent an error event, the sidecar's own "
            "included, passed on as it is), upstream_error (the stream broke off: the client got "
            "an SSE error event; or a 502 for an answer that cannot be passed on), "
            "client_disconnect (counted as the client's handler is cancelled, with its first "
            "token), client_stalled (the client took nothing for --upstream-timeout: cut off, "
            "and the version's connection closed), cut (still open at the end of the shutdown "
            "drain; the client got an SSE error event), whole (not streamed), unreachable, "
            "timeout.",
            ["model", "version", "outcome"],
            registry=registry,
        )

        self.shadow_requests = Counter(
            names.GATEWAY_SHADOW_REQUESTS,
            "Shadow copies of requests, by model, shadow version and how they ended: compared "
            "(with the answer the client got), incomparable (a 200 in a shape that cannot be "
            "compared), too_large (a 200, but its answer or the client's over "
            "--shadow-max-compare-bytes), failed (another status, no answer, too slow), dropped "
            "(--shadow-max-in-flight copies being open).",
            ["model", "version", "outcome"],
            registry=registry,
        )
        self.shadow_agreement = Histogram(
            names.GATEWAY_SHADOW_AGREEMENT,
            "Per compared shadow copy, how far its answer agreed with the one the client got "
            "from the primary version: 1 or 0 for equal or different outputs, the cosine "
            "similarity for vectors, the mean over output tensors for the Open Inference "
            "Protocol's answers; by model, shadow version and primary version. Mean "
            "agreement: _sum / _count.",
            ["model", "version", "primary"],
            buckets=AGREEMENT_BUCKETS,
            registry=registry,
        )
        self.shadow_duration = Histogram(
            names.GATEWAY_SHADOW_DURATION,
            "Shadow copies: time from sending a copy to its whole answer, by model and shadow "
            "version.",
            ["model", "version"],
            buckets=names.DURATION_BUCKETS,
            registry=registry,
        )

    def forget(self, model: str, version: str) -> None:
        """Stop exporting every series of ``version`` of ``model`` (``UNROUTED``: the model's
        requests no version answered), its answers' shadow agreement as a primary included."""
        labels = {"model": model, "version": version}
        for collector in (
            self.requests,
            self.duration,
            self.calls,
            self.weight,
            self.upstream_errors,
            self.upstream_connections,
            self.upstream_waiting,
            self.upstream_queued,
            self.llm_ttft,
            self.llm_tpot,
            self.llm_requests,
            self.shadow_requests,
            self.shadow_agreement,
            self.shadow_duration,
        ):
            collector.remove_by_labels(labels)
        self.call_duration.remove_by_labels(labels)
        self.shadow_agreement.remove_by_labels({"model": model, "primary": version})

    def count_client_timeout(self, phase: str) -> None:
        self.client_timeouts.labels(phase).inc()
