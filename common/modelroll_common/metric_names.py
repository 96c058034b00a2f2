"""The names of the metrics modelroll exports, as Prometheus stores them (a counter's with its
``_total``; a histogram's without its ``_bucket``, ``_sum`` and ``_count``).

They are a contract: the sidecar and the gateway export these series; the operator's canary
analysis, the chart's dashboard (hack/dashboard.py) and the benchmarks read them. Each
exporter declares its series' help and labels where it creates them; the buckets of the
histograms both export are here, so that the two hops' quantiles compare.
"""

from __future__ import annotations

# The sidecar's, labelled with the model and the version it serves.
REQUESTS = "modelroll_requests_total"
REQUEST_DURATION = "modelroll_request_duration_seconds"
MODEL_CALLS = "modelroll_model_calls_total"
MODEL_CALL_DURATION = "modelroll_model_call_duration_seconds"
QUEUE_WAIT = "modelroll_queue_wait_seconds"
BATCH_SIZE = "modelroll_batch_size"
BATCH_DURATION = "modelroll_batch_duration_seconds"
BATCHES = "modelroll_batches_total"
BATCH_PADDING_EFFICIENCY = "modelroll_batch_padding_efficiency"
BATCH_TOKENS = "modelroll_batch_tokens_total"
QUEUE_DEPTH = "modelroll_queue_depth"
REQUESTS_IN_FLIGHT = "modelroll_requests_in_flight"
REJECTED = "modelroll_rejected_total"
CLIENT_TIMEOUTS = "modelroll_client_timeouts_total"
FAILED_BATCHES = "modelroll_failed_batches_total"
FAILED_BATCH_REQUESTS = "modelroll_failed_batch_requests_total"
TOKENIZER_FALLBACKS = "modelroll_tokenizer_fallbacks_total"
LENGTH_UNIT = "modelroll_length_unit"
"""1 for the unit the sidecar counts request lengths in (label ``unit``: words or tokens)."""

# What the self-tuning batching policy learned and chose.
BATCH_COST_TERM = "modelroll_batch_cost_term_seconds"
"""The fitted cost surface, one series per ``term``: ``call`` (seconds a model call costs
whatever it holds), ``row`` (per request), ``token`` (per request and padded token) and
``token_squared`` (per request and padded token squared)."""
BATCH_COST_ERROR = "modelroll_batch_cost_error_ratio"
"""How far the fitted surface's predictions are from the batches' observed durations: a
recent mean of abs(observed - predicted) / observed."""
BATCH_COST_OBSERVED_OVER_PREDICTED = "modelroll_batch_cost_observed_over_predicted"
"""Each batch's observed duration over the duration the surface predicted for it."""
BATCH_COST_TRUSTED = "modelroll_batch_cost_trusted"
"""1 while the fitted surface is trusted to decide waits, 0 while batches go at once."""
BATCH_HOLD = "modelroll_batch_hold_seconds"
"""How long each batch was held, a model slot free, for company expected to pay for the
wait (0 for a batch sent the moment it could go)."""

# The sidecar's in front of an OpenAI-compatible engine.
LLM_TTFT = "modelroll_llm_time_to_first_token_seconds"
LLM_TPOT = "modelroll_llm_time_per_output_token_seconds"
LLM_OUTPUT_TOKENS = "modelroll_llm_output_tokens_total"
LLM_PROMPT_TOKENS = "modelroll_llm_prompt_tokens_total"
LLM_IN_FLIGHT = "modelroll_llm_requests_in_flight"
LLM_REQUESTS = "modelroll_llm_requests_total"

GATEWAY_ADMIN_PORT = 9090
"""Where the gateway serves its series (GET /metrics): its admin port (--admin-port), apart from
the port clients call, and where a canary analysis reads gateway pods by default
(spec.analysis.metrics.gateway.port). No other port of the chart's pods is 9090."""

# The gateway's.
GATEWAY_REQUESTS = "modelroll_gateway_requests_total"
GATEWAY_REQUEST_DURATION = "modelroll_gateway_request_duration_seconds"
GATEWAY_MODEL_CALLS = "modelroll_gateway_model_calls_total"
GATEWAY_MODEL_CALL_DURATION = "modelroll_gateway_model_call_duration_seconds"
GATEWAY_WEIGHT = "modelroll_gateway_weight"
GATEWAY_UPSTREAM_ERRORS = "modelroll_gateway_upstream_errors_total"
GATEWAY_UPSTREAM_CONNECTIONS = "modelroll_gateway_upstream_connections"
GATEWAY_UPSTREAM_WAITING = "modelroll_gateway_upstream_waiting"
GATEWAY_UPSTREAM_QUEUED = "modelroll_gateway_upstream_queued_total"
GATEWAY_ROUTES_INVALID = "modelroll_gateway_routes_invalid_total"
GATEWAY_ROUTES_UPDATES = "modelroll_gateway_routes_updates_total"
GATEWAY_WATCH_RESTARTS = "modelroll_gateway_watch_restarts_total"
GATEWAY_CLIENT_TIMEOUTS = "modelroll_gateway_client_timeouts_total"
GATEWAY_PINS_IGNORED = "modelroll_gateway_pins_ignored_total"
GATEWAY_LLM_TTFT = "modelroll_gateway_llm_time_to_first_token_seconds"
GATEWAY_LLM_TPOT = "modelroll_gateway_llm_time_per_output_token_seconds"
GATEWAY_LLM_REQUESTS = "modelroll_gateway_llm_requests_total"
GATEWAY_SHADOW_REQUESTS = "modelroll_gateway_shadow_requests_total"
GATEWAY_SHADOW_AGREEMENT = "modelroll_gateway_shadow_agreement"
GATEWAY_SHADOW_DURATION = "modelroll_gateway_shadow_duration_seconds"

# The values of the gateway's ``routing`` label: how it chose the version of a request.
ROUTED_BY_WEIGHT = "weight"
"""Picked by the routes' weights, in turn."""
ROUTED_BY_PIN = "pin"
"""Pinned by the version header (a trusted client's): sent there on purpose, so never judged."""
ROUTED_BY_COHORT = "cohort"
"""Picked by the request's cohort key, within that key's budget of judged requests."""
ROUTED_BY_COHORT_OVER_BUDGET = "cohort_over_budget"
"""Picked by the request's cohort key, past that key's budget: never judged."""
JUDGED_ROUTINGS = (ROUTED_BY_WEIGHT, ROUTED_BY_COHORT)
"""The requests a canary analysis judges. The gateway alone sees cohort keys, so it bounds
each key's judged requests; the analysis takes what it labels judged."""

DURATION_BUCKETS = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
)
"""The request and model call histograms' buckets, at the sidecar and the gateway alike:
sub-millisecond (either hop's own cost) to the 30 s default upstream timeout."""

# The buckets of the generation histograms, at the sidecar and the gateway alike.
TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
"""Time to first token: a prefill of milliseconds to a queue of tens of seconds."""
TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0)
"""Time per output token: a decode iteration, milliseconds to a fraction of a second."""
