"""Every answer says how many requests the model call that decided it held, so that the gateway
and the sidecar's own metrics count model calls (a batch's requests succeed or fail together),
and which version gave it."""

from __future__ import annotations

import asyncio

import pytest

from modelroll_common.calls import CALL_SIZE_HEADER, call_share
from modelroll_common.routes import VERSION_HEADER
from tests.support.sidecar import RunningSidecar, StartModel, StartSidecar


async def answers(sidecar: RunningSidecar, count: int) -> list[tuple[int, str | None]]:
    async def one(i: int) -> tuple[int, str | None]:
        response = await sidecar.client.post("/v1/infer", json={"payload": f"text {i}"})
        await response.read()
        # Every answer, failed ones too, names its version (no gateway need be in the path).
        assert response.headers[VERSION_HEADER] == sidecar.sidecar.config.version
        return response.status, response.headers.get(CALL_SIZE_HEADER)

    return list(await asyncio.gather(*(one(i) for i in range(count))))


@pytest.mark.parametrize("batch_error_rate", [0.0, 1.0])
async def test_the_shares_of_the_answers_add_up_to_the_model_s_calls(
    start_model: StartModel, start_sidecar: StartSidecar, batch_error_rate: float
) -> None:
    model = await start_model(fixed_ms=30, per_token_ms=0, batch_error_rate=batch_error_rate)
    sidecar = await start_sidecar(model.url, max_batch_size=4, max_wait_ms=500)

    got = await answers(sidecar, 8)

    assert {status for status, _ in got} == ({502} if batch_error_rate else {200})
    assert [size for _, size in got] == ["4"] * 8
    assert sum(call_share(size) for _, size in got) == model.model.batches == 2
    code = "502" if batch_error_rate else "200"
    # The sidecar counts the calls itself too: what an analysis without the gateway judges.
    assert sidecar.sample("modelroll_model_calls_total", code=code) == 2
    assert sidecar.sample("modelroll_requests_total", code=code) == 8
    assert sidecar.sample("modelroll_model_call_duration_seconds_count") == 2
    failed = 2 if batch_error_rate else 0
    assert sidecar.sample("modelroll_failed_batches_total") == failed
    assert sidecar.sample("modelroll_failed_batch_requests_total") == 4 * failed


async def test_a_request_no_model_call_decided_is_a_call_of_its_own(
    start_model: StartModel, start_sidecar: StartSidecar
) -> None:
    model = await start_model(fixed_ms=200, per_token_ms=0)
    sidecar = await start_sidecar(model.url, max_batch_size=1, max_wait_ms=1, timeout_ms=100)

    got = await answers(sidecar, 3)  # one runs; the others wait past their deadline

    assert sorted(got) == [(200, "1"), (504, "1"), (504, "1")]
