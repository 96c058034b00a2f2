"""Prometheus metrics of one sidecar, labelled by model and version (names fixed in docs/design.md).

Each app gets its own CollectorRegistry, so tests and several apps in one process never collide.
Every label set a dashboard or alert selects on is created up front, so its series exist at 0.
"""

from __future__ import annotations

import functools

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from modelroll_common import metric_names as names
from modelroll_common.calls import SharedHistogram
from modelroll_common.server import PHASES
from modelroll_common.sse import GenerationWatch

from .cost_model import TERMS, CostSurface

BATCH_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
COST_RATIO_BUCKETS = (0.25, 0.5, 0.67, 0.8, 0.9, 1.0, 1.11, 1.25, 1.5, 2.0, 4.0)
EFFICIENCY_BUCKETS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1.0)

CODES = ("200", "400", "404", "408", "413", "415", "422", "429", "502", "503", "504")
CLOSE_REASONS = ("full", "timeout", "tokens", "idle", "drain")
TOKEN_KINDS = ("useful", "padded")
REJECT_REASONS = ("queue_full", "deadline", "split_deadline", "disconnect", "shutting_down")
LENGTH_UNITS = ("words", "tokens")


def _term(cost: CostSurface, index: int) -> float:
    return cost.terms[index]


class SidecarMetrics:
    """The sidecar's series, with the model/version children resolved once."""

    def __init__(self, model: str, version: str, registry: CollectorRegistry) -> None:
        self.registry = registry
        labels = ("model", "version")
        requests = Counter(
            names.REQUESTS,
            "Inference requests answered, by HTTP status code.",
            [*labels, "code"],
            registry=registry,
        )
        self._requests = {code: requests.labels(model, version, code) for code in CODES}
        self._requests_family = requests
        self._model, self._version = model, version

        def histogram(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            family = Histogram(name, doc, labels, buckets=buckets, registry=registry)
            return family.labels(model, version)

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, labels, registry=registry).labels(model, version)

        self.request_duration = histogram(
            names.REQUEST_DURATION,
            "Time from receiving an inference request to answering it.",
            names.DURATION_BUCKETS,
        )
        calls = Counter(
            names.MODEL_CALLS,
            "The model calls behind the requests of modelroll_requests_total (same labels): "
            "each answer adds 1/n, n the requests of the model call that decided it (its "
            "X-Modelroll-Batch-Size header). What a canary analysis of a model routed by an "
            "HTTPRoute judges: a batch's requests fail together.",
            [*labels, "code"],
            registry=registry,
        )
        self._calls = {code: calls.labels(model, version, code) for code in CODES}
        self._calls_family = calls
        self.call_duration = SharedHistogram(
            names.MODEL_CALL_DURATION,
            "modelroll_request_duration_seconds counted per model call: each request adds 1/n "
            "of a call, as in modelroll_model_calls_total.",
            labels,
            names.DURATION_BUCKETS,
            registry,
        ).labels(model, version)
        self.queue_wait = histogram(
            names.QUEUE_WAIT,
            "Time a request waited in the queue before its batch was sent to the model.",
            names.DURATION_BUCKETS,
        )
        self.batch_size = histogram(
            names.BATCH_SIZE, "Requests per batch sent to the model.", BATCH_SIZE_BUCKETS
        )
        self.batch_duration = histogram(
            names.BATCH_DURATION,
            "Time the model took to answer one batch.",
            names.DURATION_BUCKETS,
        )
        batches = Counter(
            names.BATCHES,
            "Batches sent to the model, by what closed them: full, timeout, tokens, idle "
            "(--wait-policy auto or adaptive sent it early, a model slot being free and waiting "
            "not worth it) or drain.",
            [*labels, "reason"],
            registry=registry,
        )
        self.batches = {r: batches.labels(model, version, r) for r in CLOSE_REASONS}
        self.padding_efficiency = histogram(
            names.BATCH_PADDING_EFFICIENCY,
            "Per batch: useful tokens (the requests' lengths summed) over padded tokens (batch "
            "size times its longest length); buckets 0.1, 0.2, ..., 1.0.",
            EFFICIENCY_BUCKETS,
        )
        tokens = Counter(
            names.BATCH_TOKENS,
            "Tokens sent to the model in batches: useful (the requests' own lengths) and padded "
            "(batch size times longest length, what a padding model computes); useful over "
            "padded is the padding efficiency over any interval.",
            [*labels, "kind"],
            registry=registry,
        )
        self._useful_tokens = tokens.labels(model, version, "useful")
        self._padded_tokens = tokens.labels(model, version, "padded")
        self.queue_depth = gauge(names.QUEUE_DEPTH, "Requests waiting for a batch.")
        self.in_flight = gauge(
            names.REQUESTS_IN_FLIGHT,
            "Inference requests accepted and not yet answered: waiting for their length, in "
            "the queue, or in a batch at the model.",
        )
        rejected = Counter(
            names.REJECTED,
            "Requests refused or dropped before the model answered them, by reason: queue_full "
            "(429), deadline (504 before the batch was sent), split_deadline (504 while a batch "
            "the model refused was split), disconnect (the client went away), shutting_down "
            "(503).",
            [*labels, "reason"],
            registry=registry,
        )
        self.rejected = {r: rejected.labels(model, version, r) for r in REJECT_REASONS}
        client_timeouts = Counter(
            names.CLIENT_TIMEOUTS,
            "Clients cut off for not sending their whole request within --read-timeout-ms, by "
            "how far they got: silent (nothing), head, or body.",
            [*labels, "phase"],
            registry=registry,
        )
        self.client_timeouts = {p: client_timeouts.labels(model, version, p) for p in PHASES}
        self.failed_batches = Counter(
            names.FAILED_BATCHES,
            "Batches that failed whole (the model's 5xx, 408 or 429, a broken answer, no answer "
            "in time, or shutdown): every request still waiting on one got its error. The "
            "gateway counts each such batch as one failed model call.",
            labels,
            registry=registry,
        ).labels(model, version)
        self.failed_batch_requests = Counter(
            names.FAILED_BATCH_REQUESTS,
            "Requests answered with the error of a batch that failed whole.",
            labels,
            registry=registry,
        ).labels(model, version)
        self.tokenizer_fallbacks = Counter(
            names.TOKENIZER_FALLBACKS,
            "Counting tokens: requests whose length is their words because the model's "
            "tokenizer failed on them (raised, or panicked in its Rust code); they were answered "
            "all the same. A steady rate means the model's tokenizer.json is broken for its "
            "traffic.",
            labels,
            registry=registry,
        ).labels(model, version)
        self.batch_hold = histogram(
            names.BATCH_HOLD,
            "Per batch: how long it was held, a model slot free, for company (0 for a batch "
            "sent the moment it could go): the wait the policy chose.",
            names.DURATION_BUCKETS,
        )
        self.cost_observed_over_predicted = histogram(
            names.BATCH_COST_OBSERVED_OVER_PREDICTED,
            "Per batch, once the cost surface is fitted: its observed duration over the "
            "duration the surface predicted for it.",
            COST_RATIO_BUCKETS,
        )
        self._cost_terms = Gauge(
            names.BATCH_COST_TERM,
            "The cost surface fitted to the model's batches, by term: a batch of n requests "
            "padded to length L takes call + n x (row + token x L + token_squared x L^2) "
            "seconds.",
            [*labels, "term"],
            registry=registry,
        )
        self._cost_error = gauge(
            names.BATCH_COST_ERROR,
            "The recent mean of abs(observed - predicted) / observed batch duration; over 0.35 "
            "the cost surface is not trusted.",
        )
        self._cost_trusted = gauge(
            names.BATCH_COST_TRUSTED,
            "1 while the cost surface predicts well enough to decide waits (--wait-policy "
            "auto), 0 while batches go at once.",
        )
        length_unit = Gauge(
            names.LENGTH_UNIT,
            "1 for the unit request lengths are counted in: words (whitespace words) or tokens "
            "(the model's tokenizer's); 0 for the other. Both 0 until the sidecar knows "
            "(--length-from auto: until the model has served its tokenizer or answered that it "
            "serves none).",
            [*labels, "unit"],
            registry=registry,
        )
        self.length_unit = {u: length_unit.labels(model, version, u) for u in LENGTH_UNITS}

    def watch_cost(self, cost: CostSurface) -> None:
        """Export ``cost``'s fitted terms, error and trust, read at each scrape."""
        for index, term in enumerate(TERMS):
            child = self._cost_terms.labels(self._model, self._version, term)
            child.set_function(functools.partial(_term, cost, index))
        self._cost_error.set_function(lambda: cost.error)
        self._cost_trusted.set_function(lambda: float(cost.trusted))

    def count_lengths_in(self, unit: str) -> None:
        """Lengths are counted in ``unit`` (one of LENGTH_UNITS) from now on."""
        for each, gauge in self.length_unit.items():
            gauge.set(1 if each == unit else 0)

    def count_batch(self, requests: list[tuple[int, int]], reason: str) -> None:
        """One batch sent, its requests' (length, rows): its size, what closed it, and its
        padding (each row padded to the batch's longest length)."""
        useful = sum(length * rows for length, rows in requests)
        padded = sum(rows for _, rows in requests) * max(length for length, _ in requests)
        self.batch_size.observe(len(requests))
        self.batches[reason].inc()
        self.padding_efficiency.observe(useful / padded)
        self._useful_tokens.inc(useful)
        self._padded_tokens.inc(padded)

    def count_failed_batch(self, requests: int) -> None:
        self.failed_batches.inc()
        self.failed_batch_requests.inc(requests)

    def count_client_timeout(self, phase: str) -> None:
        self.client_timeouts[phase].inc()

    def count_request(self, code: int, seconds: float, share: float = 1.0) -> None:
        """One answer, which stands for ``share`` of a model call (calls.call_share)."""
        key = str(code)
        for children, family, amount in (
            (self._requests, self._requests_family, 1.0),
            (self._calls, self._calls_family, share),
        ):
            child = children.get(key)
            if child is None:
                child = children[key] = family.labels(self._model, self._version, key)
            child.inc(amount)
        self.request_duration.observe(seconds)
        self.call_duration.observe(seconds, share)


STREAM_OUTCOMES = (
    "completed",  # ended with data: [DONE]
    "error",  # the engine sent an error event itself
    "upstream_error",  # the engine broke the stream off (the client got an error event), or
    # answered what cannot be passed on (502): a stream that is not one, a whole answer too large
    "client_disconnect",  # the client went away; the engine's connection was closed
    "client_stalled",  # the client took nothing for the upstream timeout: cut off, engine too
    "cut",  # still open when the drain ran out: the client got an error event saying so
    "whole",  # a non-streamed answer, passed on whole
    "unreachable",  # no connection to the engine (503)
    "timeout",  # the engine sent nothing for the upstream timeout (504)
)


class LLMMetrics:
    """The series of ``--protocol openai`` mode, per model and version: what a chat user feels
    (time to first token, time per output token after it) and what the engine did (tokens in and
    out, requests in flight, how each stream ended)."""

    def __init__(self, sidecar: SidecarMetrics, model: str, version: str) -> None:
        registry, labels = sidecar.registry, ("model", "version")

        def histogram(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            family = Histogram(name, doc, labels, buckets=buckets, registry=registry)
            return family.labels(model, version)

        def counter(name: str, doc: str) -> Counter:
            return Counter(name, doc, labels, registry=registry).labels(model, version)

        self.ttft = histogram(
            names.LLM_TTFT,
            "--protocol openai: time from receiving a generation request to the first "
            "generated token streamed back.",
            names.TTFT_BUCKETS,
        )
        self.tpot = histogram(
            names.LLM_TPOT,
            "--protocol openai: per stream, time from its first token to its last over the "
            "tokens after the first.",
            names.TPOT_BUCKETS,
        )
        self.output_tokens = counter(
            names.LLM_OUTPUT_TOKENS,
            "--protocol openai: tokens generated (the stream's usage.completion_tokens, else "
            "its chunks with text); its rate is tokens per second.",
        )
        self.prompt_tokens = counter(
            names.LLM_PROMPT_TOKENS, "--protocol openai: prompt tokens (usage.prompt_tokens)."
        )
        self.in_flight = Gauge(
            names.LLM_IN_FLIGHT,
            "--protocol openai: generation requests the engine is working on or streaming.",
            labels,
            registry=registry,
        ).labels(model, version)
        streams = Counter(
            names.LLM_REQUESTS,
            "--protocol openai: generation requests passed to the engine, by how they ended: "
            "completed, error (the engine sent an error event), upstream_error (the engine broke "
            "the stream off and the client got an SSE error event, or its answer could not be "
            "passed on: 502), client_disconnect (the client went away, counted with what it had "
            "been sent), client_stalled (the client took nothing for --upstream-timeout-ms and "
            "was cut off), cut (still open when the drain on SIGTERM ran out), whole (not "
            "streamed), unreachable (503), timeout (504).",
            [*labels, "outcome"],
            registry=registry,
        )
        self._outcomes = {o: streams.labels(model, version, o) for o in STREAM_OUTCOMES}
        self.rejected_full = sidecar.rejected["queue_full"]
        self._sidecar = sidecar

    def count(self, outcome: str) -> None:
        self._outcomes[outcome].inc()

    def count_abandoned(self, status: int, seconds: float) -> None:
        """An answer already begun when its client went away: cancelled, the handler that
        counts every other answer in ``modelroll_requests_total`` never returns."""
        self._sidecar.count_request(status, seconds)

    def observe(self, watch: GenerationWatch, started: float) -> None:
        """A stream's figures, once it has ended (however it ended)."""
        if watch.first_token_at is not None:
            self.ttft.observe(watch.first_token_at - started)
        if (tpot := watch.time_per_output_token) is not None:
            self.tpot.observe(tpot)
        self.output_tokens.inc(watch.output_tokens)
        if watch.prompt_tokens is not None:
            self.prompt_tokens.inc(watch.prompt_tokens)
