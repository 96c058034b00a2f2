"""/metrics shows every sidecar series, labelled by model and version."""

from __future__ import annotations

import asyncio

from prometheus_client.parser import text_string_to_metric_families

from tests.support.sidecar import StartModel, StartSidecar

SERIES = {
    "modelroll_requests_total": {"code"},
    "modelroll_request_duration_seconds": set(),
    "modelroll_queue_wait_seconds": set(),
    "modelroll_batch_size": set(),
    "modelroll_batch_duration_seconds": set(),
    "modelroll_batches_total": {"reason"},
    "modelroll_queue_depth": set(),
    "modelroll_requests_in_flight": set(),
    "modelroll_rejected_total": {"reason"},
    "modelroll_batch_padding_efficiency": set(),
    "modelroll_batch_tokens_total": {"kind"},
}


async def test_metrics_expose_every_series_with_model_and_version(
    start_model: StartModel, start_sidecar: StartSidecar
) -> None:
    model = await start_model(fixed_ms=1, error_rate=0.5, seed=3)
    sidecar = await start_sidecar(model.url, max_batch_size=4, max_wait_ms=5)
    await asyncio.gather(*(sidecar.infer(i) for i in range(12)))

    resp = await sidecar.client.get("/metrics")
    text = await resp.text()

    assert resp.status == 200
    families = {f.name: f for f in text_string_to_metric_families(text)}
    for name, extra in SERIES.items():
        base = name.removesuffix("_total")
        family = families[base]
        assert family.samples, name
        for sample in family.samples:
            assert sample.labels["model"] == "sentiment"
            assert sample.labels["version"] == "v1"
            assert extra <= set(sample.labels)
    reasons = {s.labels["reason"] for s in families["modelroll_batches"].samples}
    assert reasons == {"full", "timeout", "tokens", "idle", "drain"}
    codes = {
        s.labels["code"]: s.value
        for s in families["modelroll_requests"].samples
        if s.name == "modelroll_requests_total"
    }
    assert codes["200"] + codes["422"] == 12
    assert codes["422"] > 0
    batch_count = next(
        s.value
        for s in families["modelroll_batch_size"].samples
        if s.name == "modelroll_batch_size_count"
    )
    assert batch_count == len(model.model.batch_sizes)


async def test_padding_is_counted_per_batch_in_useful_and_padded_tokens(
    start_model: StartModel, start_sidecar: StartSidecar
) -> None:
    """Two requests of 1 and 4 tokens in one batch: 5 useful tokens, 2 x 4 = 8 padded ones,
    an efficiency of 0.625 for that batch."""
    model = await start_model(fixed_ms=1)
    sidecar = await start_sidecar(model.url, max_batch_size=2, max_wait_ms=5_000)
    results = await asyncio.gather(sidecar.infer("short"), sidecar.infer("a longer one here"))

    assert [status for status, _ in results] == [200, 200]
    assert list(model.model.batch_sizes) == [2]
    assert sidecar.sample("modelroll_batch_tokens_total", kind="useful") == 5
    assert sidecar.sample("modelroll_batch_tokens_total", kind="padded") == 8
    assert sidecar.sample("modelroll_batch_padding_efficiency_sum") == 0.625
    assert sidecar.sample("modelroll_batch_padding_efficiency_bucket", le="0.6") == 0
    assert sidecar.sample("modelroll_batch_padding_efficiency_bucket", le="0.7") == 1
