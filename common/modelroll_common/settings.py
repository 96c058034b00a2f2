"""The sidecar settings a ModelVersion can tune: spec field, sidecar flag, default and bounds.

One table for the three places that know them: the operator parses spec.batching and spec.sidecar
with it and writes the flags it names, the sidecar takes its defaults from it and refuses values
outside its bounds, and ``make generate`` (hack/generate.py) writes these fields of the CRD
(crds/modelversion.yaml) from it: type, default, bounds, enum and description.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Setting:
    """One integer setting: its spec field, the sidecar flag it becomes, its default and its
    bounds (inclusive)."""

    key: str
    """The field's name under spec.batching or spec.sidecar."""
    attr: str
    """The field's name in the operator's spec classes and the sidecar's SidecarConfig."""
    flag: str
    default: int
    low: int
    high: int
    description: str
    """What ``kubectl explain`` says of the field, before its bounds and default."""
    shown_default: str = ""
    """How the CRD words a default that is not this table's own (empty: the table's)."""


BATCHING_SETTINGS = (
    Setting(
        "maxBatchSize",
        "max_batch_size",
        "--max-batch-size",
        32,
        1,
        4096,
        "A batch closes when it holds this many requests; with protocol OpenInference, this "
        "many rows, each request bringing its tensors' first dimension (a request of more rows "
        "goes alone, whole).",
    ),
    Setting(
        "maxWaitMs",
        "max_wait_ms",
        "--max-wait-ms",
        10,
        0,
        60000,
        "A batch closes when its oldest request has waited this many milliseconds. 0 sends what "
        "is queued as soon as a batch may go; requests that arrive while every batch slot is "
        "busy still go together.",
    ),
    Setting(
        "maxQueueSize",
        "max_queue_size",
        "--max-queue-size",
        1024,
        1,
        1000000,
        "Requests waiting beyond this many are refused with 429 and Retry-After.",
    ),
    Setting(
        "maxBatchTokens",
        "max_batch_tokens",
        "--max-batch-tokens",
        0,
        0,
        100000000,
        "Padded-token budget per batch (batch size, in rows, times longest request length); 0 "
        "turns the budget off. A request over the budget on its own runs alone.",
    ),
    Setting(
        "timeoutMs",
        "timeout_ms",
        "--timeout-ms",
        30000,
        1,
        3600000,
        "A request the model has not started within this many milliseconds gets 504, and so "
        "does one still waiting in a refused batch that is being split. At least maxWaitMs.",
    ),
    Setting(
        "maxConcurrentBatches",
        "max_concurrent_batches",
        "--max-concurrent-batches",
        1,
        1,
        64,
        "Batches sent to the model at the same time.",
    ),
)
"""spec.batching: how the sidecar forms batches (the CRD defaults every one of them)."""


@dataclass(frozen=True)
class Choice:
    """A sidecar setting that takes one of a few words: its spec field, the sidecar flag it
    becomes, its default and its values, spelt as the CRD's enum spells them (the sidecar takes
    them lowercased, as its flags document them)."""

    key: str
    attr: str
    flag: str
    default: str
    values: tuple[str, ...]
    description: str

    @property
    def words(self) -> tuple[str, ...]:
        """The values as the sidecar's flag spells them."""
        return tuple(value.lower() for value in self.values)

    def flag_for(self, value: str) -> str:
        return f"{self.flag}={value.lower()}"


BATCHING_CHOICES = (
    Choice(
        "batchBy",
        "batch_by",
        "--batch-by",
        "Length",
        ("Length", "Arrival"),
        "Which queued requests a batch takes (sidecar --batch-by). Length (the default): the "
        "oldest request and the queued requests that serve the queue for the least model time, "
        "by a cost surface the sidecar learns while serving (a batch's duration against its "
        "size and padded length, call cost included): requests of neighbouring lengths go "
        "together, as many as pay for themselves, so a model with a large cost per call (a "
        "GPU) gets large batches and a model whose cost follows padded tokens (a CPU encoder) "
        "gets batches of like lengths; no batch costs more, by the surface, than sending its "
        "requests one by one. The oldest request always goes in the next batch, so none is "
        "passed over indefinitely. Arrival: the oldest requests, first in, first out, as many "
        "as maxBatchSize and maxBatchTokens allow.",
    ),
    Choice(
        "waitPolicy",
        "wait_policy",
        "--wait-policy",
        "Auto",
        ("Auto", "Fixed", "Adaptive"),
        "When a batch that is not full is sent, a model slot being free (sidecar "
        "--wait-policy). Auto (the default): at once, unless the model time the next arrival "
        "would save by joining it (the call it would otherwise make, less the padding it adds) "
        "exceeds the time the model would stand idle waiting for it, judged from the arrival "
        "rate and the learned cost surface; then for that long at most. While the surface "
        "predicts batch durations poorly (a noisy or shared model) every batch goes at once. "
        "On a CPU model with little cost per call this comes out at no wait. Fixed: when its "
        "oldest request has waited maxWaitMs. Adaptive: as soon as a model slot is free and no "
        "request is expected soon enough to save the waiting requests time. Under every policy "
        "no batch waits longer than maxWaitMs, and a batch closes as soon as it is full.",
    ),
    Choice(
        "lengthFrom",
        "length_from",
        "--length-from",
        "Auto",
        ("Auto", "Words", "Tokenizer"),
        "What a request's length counts (sidecar --length-from): the unit of batchBy Length, "
        "maxBatchTokens, the padding metrics and the batch cost the sidecar learns. Auto (the "
        "default): the model's tokens when the model server serves its tokenizer at GET "
        "/v1/tokenizer (modelroll-encoder does), whitespace words when it answers 404, 405, 410 "
        "or 501 there, or serves something that is not a usable tokenizer; any other failure "
        "(no connection, another 5xx) is asked again while the sidecar stays unready. With "
        "protocol OpenAI: words. The sidecar's /readyz and its modelroll_length_unit metric say "
        "which unit it chose. Words: the whitespace words of a string payload. Tokenizer: the "
        "model's tokens, and a model that serves none leaves the version unready, the reason in "
        "the sidecar's /readyz; refused with protocol OpenAI, whose engines serve none. Either "
        "way a list payload (token ids, say) counts its items.",
    ),
)
"""spec.batching's enum fields. Unlike BATCHING_SETTINGS they become flags only when they differ
from their default, so adding one, or a value, rolls no Deployment that does not use it."""
PROTOCOL = Choice(
    "protocol",
    "protocol",
    "--protocol",
    "Batch",
    ("Batch", "OpenAI", "OpenInference"),
    "Managed mode: what the model server speaks. Batch (the default): POST /v1/batch, and the "
    "sidecar forms request-level batches of POST /v1/infer. OpenAI: an OpenAI-compatible engine "
    "(vLLM, TGI, SGLang, llama.cpp's server) that batches generation itself, iteration by "
    "iteration; the sidecar streams /v1/chat/completions and /v1/completions through, at most "
    "spec.sidecar.maxInFlight at once, batches only /v1/embeddings (by spec.batching), and takes "
    "the engine's GET /health as its readiness. Give the engine the model's name as its served "
    "model name (vLLM: --served-model-name), since clients name the model in each request. "
    "OpenInference: a server of the Open Inference Protocol (KServe's v2: MLServer, KServe's "
    "Python runtimes, Triton); the sidecar batches clients' POST /v2/models/{model}/infer by "
    "rows (by spec.batching), sends each batch as one infer call to the model as the server "
    "names it (spec.server.servedModelName), and takes GET /v2/health/ready as its readiness.",
)
"""spec.protocol: what the model server speaks (a flag only when not Batch, so adding it rolled
no existing Deployment)."""

SIDECAR_SETTINGS = (
    Setting(
        "upstreamTimeoutMs",
        "upstream_timeout_ms",
        "--upstream-timeout-ms",
        60000,
        1,
        3600000,
        "A model call slower than this many milliseconds fails its batch with 502. With protocol "
        "OpenAI: the longest an engine may be silent in a stream (504 before it began), and the "
        "longest a client may take none of its stream before it is cut off.",
    ),
    Setting(
        "maxBodyBytes",
        "max_body_bytes",
        "--max-body-bytes",
        1 << 20,
        1,
        64 << 20,
        "The largest request body the sidecar accepts, in bytes; larger ones get 413.",
    ),
    Setting(
        "readTimeoutMs",
        "read_timeout_ms",
        "--read-timeout-ms",
        30000,
        1,
        3600000,
        "A client must send its whole request within this many milliseconds of its first byte "
        "(a new connection's first request: of connecting), or it gets 408 and is disconnected.",
    ),
    Setting(
        "drainTimeoutS",
        "drain_timeout_s",
        "--drain-timeout-s",
        30,
        0,
        3600,
        "On SIGTERM, how many seconds queued and in-flight requests may take to finish. The "
        "pod's termination grace period is this plus 15 seconds.",
        shown_default="the operator's --drain-timeout-s",
    ),
    Setting(
        "maxInFlight",
        "max_in_flight",
        "--max-in-flight",
        256,
        1,
        100000,
        "protocol OpenAI: generation requests the sidecar passes to the engine at once; more "
        "get 429 with Retry-After.",
    ),
    Setting(
        "readinessTimeoutMs",
        "readiness_timeout_ms",
        "--readiness-timeout-ms",
        1000,
        1,
        600000,
        "How long the sidecar waits for the model's readiness path (/readyz; an OpenAI engine's "
        "/health) on each probe before counting it unready, in milliseconds.",
    ),
    Setting(
        "generationTimeoutMs",
        "generation_timeout_ms",
        "--generation-timeout-ms",
        600000,
        1,
        3600000,
        "protocol OpenAI: a generation that is not streamed must be answered whole within this "
        "many milliseconds, or the client gets 504 (the engine sends nothing until it has "
        "generated all of it, so upstreamTimeoutMs does not bound it). The default is 10 "
        "minutes, the official OpenAI clients' own timeout: past it their caller has given up.",
    ),
)
"""spec.sidecar: the rest of the sidecar's per-version settings. Only the fields a spec gives
become flags (the others keep the sidecar's defaults, and drainTimeoutS the operator's
--drain-timeout-s), so adding a field here changes no existing Deployment; for the same reason
the CRD declares no default for them."""

BY_ATTR = {s.attr: s for s in (*BATCHING_SETTINGS, *SIDECAR_SETTINGS)}
"""The integer settings, by their field name in the operator's spec and SidecarConfig."""
CHOICES_BY_ATTR = {c.attr: c for c in (*BATCHING_CHOICES, PROTOCOL)}
"""The word settings, likewise."""
