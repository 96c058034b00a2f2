"""The demo LLM engine's two schedulers, on virtual time (conftest.py): when each
token comes, who waits for whom, and what static batching wastes on sequences that finished
early."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from modelroll_standins.engine import Engine, EngineCost, Failed, Finished, Sequence, Token

# 10 ms an iteration, whatever is in it: token times are multiples of 10 ms.
FLAT = EngineCost(step_ms=10.0, step_ms_per_seq=0.0, prefill_ms_per_token=0.0)


@pytest.fixture
async def engines() -> AsyncIterator[list[Engine]]:
    started: list[Engine] = []
    yield started
    for engine in started:
        await engine.stop()


def start(engines: list[Engine], scheduler: str, cost: EngineCost = FLAT) -> Engine:
    engine = Engine(cost, scheduler)
    engine.start()
    engines.append(engine)
    return engine


async def timeline(sequence: Sequence) -> tuple[list[float], str]:
    """When each of the sequence's tokens came (loop time), and how it ended."""
    loop = asyncio.get_running_loop()
    times: list[float] = []
    while True:
        event = await sequence.events.get()
        if isinstance(event, Token):
            times.append(loop.time())
        elif isinstance(event, Finished):
            return times, "finished"
        elif isinstance(event, Failed):
            return times, "failed"


async def test_a_token_per_iteration_at_the_iterations_cost(engines: list[Engine]) -> None:
    engine = start(engines, "continuous")
    t0 = asyncio.get_running_loop().time()
    times, end = await timeline(engine.submit(Sequence(prompt_tokens=5, output_tokens=3)))
    assert end == "finished"
    assert [round(t - t0, 6) for t in times] == [0.01, 0.02, 0.03]


async def test_prefill_and_batch_size_add_to_an_iterations_cost(engines: list[Engine]) -> None:
    cost = EngineCost(step_ms=10.0, step_ms_per_seq=1.0, prefill_ms_per_token=0.5)
    engine = start(engines, "continuous", cost)
    t0 = asyncio.get_running_loop().time()
    first = engine.submit(Sequence(prompt_tokens=20, output_tokens=2))
    second = engine.submit(Sequence(prompt_tokens=20, output_tokens=2))
    (a, _), (b, _) = await asyncio.gather(timeline(first), timeline(second))
    # Iteration 1: 10 + 2 x 1 + 40 x 0.5 = 32 ms; iteration 2: 12 ms.
    assert [round(t - t0, 6) for t in a] == [0.032, 0.044]
    assert a == b


async def test_continuous_batching_lets_a_newcomer_in_at_the_next_iteration(
    engines: list[Engine],
) -> None:
    engine = start(engines, "continuous")
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    long = engine.submit(Sequence(prompt_tokens=1, output_tokens=10))
    await asyncio.sleep(0.025)
    short = engine.submit(Sequence(prompt_tokens=1, output_tokens=2))
    (long_times, _), (short_times, _) = await asyncio.gather(timeline(long), timeline(short))
    assert round(short_times[0] - t0, 6) == 0.04  # joined the iteration after it arrived
    assert short_times[-1] < long_times[-1]  # and left before the long one ended
    assert engine.stats.slot_steps == 12  # nobody was charged after finishing


async def test_static_batching_makes_a_newcomer_wait_for_the_whole_batch(
    engines: list[Engine],
) -> None:
    engine = start(engines, "static")
    long = engine.submit(Sequence(prompt_tokens=1, output_tokens=10))
    await asyncio.sleep(0.025)
    short = engine.submit(Sequence(prompt_tokens=1, output_tokens=2))
    (long_times, _), (short_times, _) = await asyncio.gather(timeline(long), timeline(short))
    assert short_times[0] > long_times[-1]


async def test_static_batching_pays_for_sequences_that_finished_early(
    engines: list[Engine],
) -> None:
    for scheduler, charged in (("static", 20), ("continuous", 11)):
        engine = start(engines, scheduler)
        together = [engine.submit(Sequence(1, n)) for n in (1, 10)]
        await asyncio.gather(*(timeline(s) for s in together))
        assert engine.stats.tokens == 11, scheduler
        assert engine.stats.slot_steps == charged, scheduler


async def test_the_kv_budget_holds_back_what_does_not_fit(engines: list[Engine]) -> None:
    engine = start(engines, "continuous", EngineCost(10.0, 0.0, 0.0, kv_tokens=100))
    first = engine.submit(Sequence(prompt_tokens=50, output_tokens=5))
    second = engine.submit(Sequence(prompt_tokens=50, output_tokens=5))  # 110 > 100: waits
    (a, _), (b, _) = await asyncio.gather(timeline(first), timeline(second))
    assert b[0] > a[-1]
    with pytest.raises(ValueError, match="exceed the engine's KV budget"):
        engine.submit(Sequence(prompt_tokens=90, output_tokens=20))


async def test_a_cancelled_sequence_stops_generating(engines: list[Engine]) -> None:
    engine = start(engines, "continuous")
    sequence = engine.submit(Sequence(prompt_tokens=1, output_tokens=1000))
    await asyncio.sleep(0.055)
    engine.cancel(sequence)
    await asyncio.sleep(0.1)
    assert engine.running == 0
    assert engine.stats.cancelled == 1
    assert 5 <= engine.stats.tokens <= 6


async def test_a_cancelled_waiting_sequence_leaves_the_queue_at_once(
    engines: list[Engine],
) -> None:
    engine = start(engines, "continuous", EngineCost(10.0, 0.0, 0.0, max_seqs=1))
    running = engine.submit(Sequence(prompt_tokens=1, output_tokens=10))
    waiting = engine.submit(Sequence(prompt_tokens=1, output_tokens=10))
    await asyncio.sleep(0.025)
    assert (engine.running, engine.waiting) == (1, 1)
    engine.cancel(waiting)
    assert (engine.waiting, engine.stats.cancelled) == (0, 1)
    times, end = await timeline(running)
    assert (len(times), end) == (10, "finished")
    assert engine.stats.tokens == 10  # nothing for the cancelled one


async def test_an_injected_failure_ends_the_sequence_after_its_tokens(
    engines: list[Engine],
) -> None:
    engine = start(engines, "continuous")
    times, end = await timeline(engine.submit(Sequence(1, 10, fail_after=3)))
    assert (len(times), end) == (3, "failed")
    assert engine.stats.failed == 1
