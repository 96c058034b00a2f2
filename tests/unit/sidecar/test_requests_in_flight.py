"""modelroll_requests_in_flight: the requests a sidecar holds, what an autoscaler reads per
replica. It counts each accepted request until its answer, whatever the answer."""

from __future__ import annotations

import asyncio

from tests.support.scripted_engines import until
from tests.support.sidecar import RunningSidecar, StartModel, StartSidecar

IN_FLIGHT = "modelroll_requests_in_flight"


def in_flight(sidecar: RunningSidecar) -> float:
    return sidecar.sample(IN_FLIGHT)


async def test_requests_count_while_they_wait_and_not_once_answered(
    start_model: StartModel, start_sidecar: StartSidecar
) -> None:
    model = await start_model(fixed_ms=300, per_token_ms=0)
    sidecar = await start_sidecar(model.url, max_batch_size=1, max_wait_ms=1)
    assert in_flight(sidecar) == 0

    answers = [asyncio.ensure_future(sidecar.infer(f"request {i}")) for i in range(3)]
    await until(lambda: in_flight(sidecar) == 3, "three requests are in flight")
    assert model.model.busy == 1  # one at the model, two queued: all three count

    assert [status for status, _ in await asyncio.gather(*answers)] == [200, 200, 200]
    assert in_flight(sidecar) == 0


async def test_requests_refused_or_timed_out_leave_the_count(
    start_model: StartModel, start_sidecar: StartSidecar
) -> None:
    """A 429 is never counted; a request answered 504 after its deadline leaves the count."""
    model = await start_model(fixed_ms=600, per_token_ms=0)
    sidecar = await start_sidecar(
        model.url, max_batch_size=1, max_wait_ms=1, max_queue_size=1, timeout_ms=200
    )

    running = asyncio.ensure_future(sidecar.infer("runs"))
    await until(lambda: model.model.busy == 1, "the first request is at the model")
    queued = asyncio.ensure_future(sidecar.infer("queued"))
    await until(lambda: in_flight(sidecar) == 2, "a request runs and one waits")
    refused, _ = await sidecar.infer("one too many")

    assert refused == 429
    assert in_flight(sidecar) == 2
    assert [status for status, _ in await asyncio.gather(running, queued)] == [200, 504]
    assert in_flight(sidecar) == 0
