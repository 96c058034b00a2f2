"""The sidecar settings a ModelVersion can tune: spec field, sidecar flag, default and bounds.

One table for the three places that know them: the operator parses spec.batching and spec.sidecar
with it and writes the flags it names, the sidecar takes its defaults from it and refuses values
outside its bounds, and the CRD (crds/modelversion.yaml) declares the same defaults and bounds
(tests/unit/operator/test_crd_schema.py holds the CRD to this table).
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


BATCHING_SETTINGS = (
    Setting("maxBatchSize", "max_batch_size", "--max-batch-size", 32, 1, 4096),
    Setting("maxWaitMs", "max_wait_ms", "--max-wait-ms", 10, 0, 60000),
    Setting("maxQueueSize", "max_queue_size", "--max-queue-size", 1024, 1, 1000000),
    Setting("maxBatchTokens", "max_batch_tokens", "--max-batch-tokens", 0, 0, 100000000),
    Setting("timeoutMs", "timeout_ms", "--timeout-ms", 30000, 1, 3600000),
    Setting("maxConcurrentBatches", "max_concurrent_batches", "--max-concurrent-batches", 1, 1, 64),
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

    @property
    def words(self) -> tuple[str, ...]:
        """The values as the sidecar's flag spells them."""
        return tuple(value.lower() for value in self.values)

    def flag_for(self, value: str) -> str:
        return f"{self.flag}={value.lower()}"


BATCHING_CHOICES = (
    Choice("batchBy", "batch_by", "--batch-by", "Arrival", ("Arrival", "Length")),
    Choice("waitPolicy", "wait_policy", "--wait-policy", "Fixed", ("Fixed", "Adaptive")),
    Choice("lengthFrom", "length_from", "--length-from", "Words", ("Words", "Tokenizer")),
)
"""spec.batching's enum fields. Unlike BATCHING_SETTINGS they become flags only when they differ
from their default, so adding them changed (rolled) no existing Deployment."""
PROTOCOL = Choice("protocol", "protocol", "--protocol", "Batch", ("Batch", "OpenAI"))
"""spec.protocol: what the model server speaks (a flag only when not Batch, so adding it rolled
no existing Deployment)."""

SIDECAR_SETTINGS = (
    Setting("upstreamTimeoutMs", "upstream_timeout_ms", "--upstream-timeout-ms", 60000, 1, 3600000),
    Setting("maxBodyBytes", "max_body_bytes", "--max-body-bytes", 1 << 20, 1, 64 << 20),
    Setting("readTimeoutMs", "read_timeout_ms", "--read-timeout-ms", 30000, 1, 3600000),
    Setting("drainTimeoutS", "drain_timeout_s", "--drain-timeout-s", 30, 0, 3600),
    Setting("maxInFlight", "max_in_flight", "--max-in-flight", 256, 1, 100000),
    Setting(
        "readinessTimeoutMs", "readiness_timeout_ms", "--readiness-timeout-ms", 1000, 1, 600000
    ),
    # 10 minutes, the official OpenAI clients' own timeout: past it their caller has given up.
    Setting(
        "generationTimeoutMs",
        "generation_timeout_ms",
        "--generation-timeout-ms",
        600000,
        1,
        3600000,
    ),
)
"""spec.sidecar: the rest of the sidecar's per-version settings. Only the fields a spec gives
become flags (the others keep the sidecar's defaults, and drainTimeoutS the operator's
--drain-timeout-s), so adding a field here changes no existing Deployment."""
