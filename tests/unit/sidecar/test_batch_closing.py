"""What closes a batch: size, the oldest request's max-wait, the token budget; and concurrency."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from tests.support.sidecar import MODES, RunningSidecar, StartModel, StartSidecar


async def burst(sidecar: RunningSidecar, payloads: list[Any]) -> list[tuple[int, dict[str, Any]]]:
    return await asyncio.gather(*(sidecar.infer(p) for p in payloads))


async def test_size_wins_when_requests_arrive_faster_than_max_wait(
    start_model: StartModel, start_sidecar: StartSidecar
) -> None:
    model = await start_model(fixed_ms=1, per_token_ms=0)
    sidecar = await start_sidecar(model.url, max_batch_size=4, max_wait_ms=20_000)

    started = time.monotonic()
    results = await burst(sidecar, [f"request {i}" for i in range(8)])

    assert [status for status, _ in results] == [200] * 8
    assert list(model.model.batch_sizes) == [4, 4]
    assert sidecar.sample("modelroll_batches_total", reason="full") == 2
    assert sidecar.sample("modelroll_batches_total", reason="timeout") == 0
    # Nobody waited for the 20 s timer: full batches left at once.
    assert time.monotonic() - started < 10


async def test_max_wait_wins_when_traffic_is_sparse(
    start_model: StartModel, start_sidecar: StartSidecar
) -> None:
    model = await start_model(fixed_ms=1, per_token_ms=0)
    sidecar = await start_sidecar(model.url, max_batch_size=100, max_wait_ms=50)

    results = await burst(sidecar, ["a", "b", "c"])

    assert [status for status, _ in results] == [200, 200, 200]
    assert list(model.model.batch_sizes) == [3]
    assert sidecar.sample("modelroll_batches_total", reason="timeout") == 1
    assert sidecar.sample("modelroll_batches_total", reason="full") == 0


async def test_max_wait_zero_sends_at_once_and_batches_what_arrives_meanwhile(
    start_model: StartModel, start_sidecar: StartSidecar
) -> None:
    """max-wait 0 (Triton's default): a lone request goes at once, and requests that arrive
    while the model runs a batch go together in the next, not one by one."""
    model = await start_model(fixed_ms=200, per_token_ms=0)
    sidecar = await start_sidecar(model.url, max_batch_size=100, max_wait_ms=0)

    started = time.monotonic()
    status, _ = await sidecar.infer("alone")
    assert status == 200
    assert time.monotonic() - started < 0.4  # the model's 200 ms, no waiting for company

    first = asyncio.ensure_future(sidecar.infer("first"))
    await asyncio.sleep(0.05)  # the first batch is running now
    rest = await burst(sidecar, [f"meanwhile {i}" for i in range(5)])
    assert (await first)[0] == 200
    assert [s for s, _ in rest] == [200] * 5
    assert list(model.model.batch_sizes) == [1, 1, 5]


async def test_max_wait_counts_from_the_oldest_request_not_the_newest(
    start_model: StartModel, start_sidecar: StartSidecar
) -> None:
    model = await start_model(fixed_ms=1, per_token_ms=0)
    sidecar = await start_sidecar(model.url, max_batch_size=100, max_wait_ms=600)

    async def timed(payload: str) -> float:
        started = time.monotonic()
        status, _ = await sidecar.infer(payload)
        assert status == 200
        return time.monotonic() - started

    first = asyncio.ensure_future(timed("first"))
    await asyncio.sleep(0.3)
    second_latency = await timed("second")
    first_latency = await first

    assert list(model.model.batch_sizes) == [2]
    # The batch closed 600 ms after the FIRST arrival; a timer restarted by the second request
    # would have held the first for ~900 ms and the second for ~600 ms.
    assert 0.55 <= first_latency < 0.85
    assert second_latency < 0.55


async def test_token_budget_closes_a_batch_before_padding_exceeds_it(
    start_model: StartModel, start_sidecar: StartSidecar
) -> None:
    model = await start_model(fixed_ms=1, per_token_ms=0)
    sidecar = await start_sidecar(
        model.url, max_batch_size=32, max_wait_ms=200, max_batch_tokens=20
    )

    # Nine requests of five tokens: 4 x 5 = 20 fits, a fifth would make 25.
    results = await burst(sidecar, [[0] * 5 for _ in range(9)])

    assert [status for status, _ in results] == [200] * 9
    assert list(model.model.batch_sizes) == [4, 4, 1]
    assert sidecar.sample("modelroll_batches_total", reason="tokens") == 2
    assert sidecar.sample("modelroll_batches_total", reason="timeout") == 1


async def test_padding_to_the_longest_request_counts_against_the_budget(
    start_model: StartModel, start_sidecar: StartSidecar
) -> None:
    model = await start_model(fixed_ms=1, per_token_ms=0)
    sidecar = await start_sidecar(
        model.url, max_batch_size=32, max_wait_ms=200, max_batch_tokens=20
    )

    # Three short strings fit (3 x 2 = 6); a 10-token one would pad all four to 40.
    payloads: list[Any] = ["a b", "c d", "e f", " ".join(["w"] * 10)]
    results = await burst(sidecar, payloads)

    assert [status for status, _ in results] == [200] * 4
    assert list(model.model.batch_sizes) == [3, 1]


@pytest.mark.parametrize("batching_mode", list(MODES.values()), ids=list(MODES))
async def test_a_request_longer_than_the_budget_runs_alone_instead_of_failing(
    start_model: StartModel, start_sidecar: StartSidecar, batching_mode: dict[str, str]
) -> None:
    model = await start_model(fixed_ms=1, per_token_ms=0)
    sidecar = await start_sidecar(
        model.url, max_batch_size=32, max_wait_ms=100, max_batch_tokens=10
    )

    long_status, long_body = await sidecar.infer(list(range(50)))
    short = await burst(sidecar, ["x", "y", "z"])

    assert long_status == 200
    assert long_body["output"]["length"] == 50
    assert [status for status, _ in short] == [200] * 3
    sizes = list(model.model.batch_sizes)
    assert sizes[0] == 1  # the long one, alone
    assert sum(sizes[1:]) == 3  # a wait that is not fixed may send the first short one at once
    if batching_mode.get("wait_policy") == "fixed":
        assert sizes == [1, 3]


@pytest.mark.parametrize("batching_mode", list(MODES.values()), ids=list(MODES))
async def test_concurrent_batches_are_capped_by_max_concurrent_batches(
    start_model: StartModel, start_sidecar: StartSidecar
) -> None:
    model = await start_model(fixed_ms=100, per_token_ms=0, parallel=8)
    sidecar = await start_sidecar(
        model.url, max_batch_size=2, max_wait_ms=1, max_concurrent_batches=3
    )

    results = await burst(sidecar, [str(i) for i in range(24)])

    assert [status for status, _ in results] == [200] * 24
    assert model.model.max_busy == 3
    assert sum(model.model.batch_sizes) == 24


@pytest.mark.parametrize("batching_mode", list(MODES.values()), ids=list(MODES))
async def test_the_next_batch_fills_while_the_model_is_busy(
    start_model: StartModel, start_sidecar: StartSidecar
) -> None:
    model = await start_model(fixed_ms=300, per_token_ms=0)
    sidecar = await start_sidecar(model.url, max_batch_size=16, max_wait_ms=5)

    first = asyncio.ensure_future(sidecar.infer("alone"))
    await asyncio.sleep(0.1)  # the model is now busy with the first batch
    rest = await burst(sidecar, [str(i) for i in range(10)])
    await first

    assert [status for status, _ in rest] == [200] * 10
    # The ten waited together for the model, and went as one batch once it was free.
    assert list(model.model.batch_sizes) == [1, 10]
