"""Length-aware batch forming (``--batch-by length``) and the adaptive wait
(``--wait-policy adaptive``): what they choose, what they learn, and the guarantees they keep."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from modelroll_sidecar.batching import Batcher
from modelroll_sidecar.cost_model import (
    MIN_BATCHES,
    RATE_TIME_CONSTANT_S,
    Arrivals,
    CostSurface,
    worth_waiting,
)
from modelroll_sidecar.forming import by_length
from modelroll_sidecar.metrics import SidecarMetrics
from modelroll_sidecar.protocol import BatchResult
from tests.support.sidecar import StartModel, StartSidecar


@dataclass(frozen=True)
class Req:
    length: int
    name: str = ""
    rows: int = 1


def lengths(requests: list[Req]) -> list[int]:
    return [r.length for r in requests]


# -- which requests form the batch ----------------------------------------------------------


def test_the_oldest_request_goes_with_the_nearest_lengths() -> None:
    queue = [Req(10), Req(100), Req(11), Req(90), Req(12), Req(9), Req(95)]
    choice = by_length(queue, max_size=4, budget=0)
    assert lengths(choice.members) == [10, 11, 12, 9]  # arrival order, the 90s left out
    assert choice.longest == 12
    assert not choice.budget_hit


def test_the_oldest_request_goes_even_when_it_is_the_longest() -> None:
    queue = [Req(200), *(Req(n) for n in range(1, 40)), Req(180), Req(150)]
    choice = by_length(queue, max_size=3, budget=0)
    assert lengths(choice.members) == [200, 180, 150]


def test_the_token_budget_bounds_the_batch_and_says_so() -> None:
    queue = [Req(10), Req(10), Req(12), Req(30), Req(9)]
    choice = by_length(queue, max_size=8, budget=48)  # 4 x 12 = 48 fits; 5 x 12 does not
    assert sorted(lengths(choice.members)) == [9, 10, 10, 12]
    assert choice.budget_hit
    alone = by_length([Req(500), Req(1)], max_size=8, budget=48)
    assert lengths(alone.members) == [500]  # over the budget on its own: it runs alone
    assert alone.budget_hit


def test_rows_count_against_the_size_limit_and_the_token_budget() -> None:
    queue = [Req(10, "a", rows=3), Req(11, "b", rows=2), Req(12, "c", rows=1)]
    choice = by_length(queue, max_size=4, budget=0)
    assert [r.name for r in choice.members] == ["a"]  # a and b are 5 rows; a, c 4 padded to 12
    rest = by_length(queue[1:], max_size=4, budget=0)
    assert [r.name for r in rest.members] == ["b", "c"]
    capped = by_length([Req(10, rows=2), Req(10, rows=2), Req(30)], max_size=8, budget=40)
    assert len(capped.members) == 2  # 4 rows x 10
    assert capped.budget_hit  # a fifth row would not fit
    whole = by_length([Req(5, rows=9), Req(5)], max_size=4, budget=0)
    assert whole.members == [Req(5, rows=9)]  # more rows than a batch: alone, never split


def test_until_the_cost_is_known_the_queue_goes_in_as_few_batches_as_it_can() -> None:
    """Two batches of 4 carry these five; of the splits into two, short three and long two pads
    least, and the oldest (200) goes with the long one."""
    queue = [Req(200), Req(5), Req(6), Req(190), Req(7)]
    unknown = by_length(queue, max_size=4, budget=0)
    assert lengths(unknown.members) == [200, 190]
    assert not unknown.budget_hit
    rest = by_length([Req(5), Req(6), Req(7)], max_size=4, budget=0)
    assert lengths(rest.members) == [5, 6, 7]


def test_when_the_whole_queue_fits_one_call_or_two_whichever_costs_less() -> None:
    """Everything queued fits in one batch, so a request left out needs a call of its own."""
    queue = [Req(200), Req(5), Req(6), Req(190)]
    # 5 ms fixed, 0.05 ms a token: one call pads to 4 x 200 (45 ms); two cost 5 + 20 + 5 + 0.6.
    split = by_length(queue, max_size=4, budget=0, call=0.005, row=per_token(0.00005))
    assert lengths(split.members) == [200, 190]
    # 10 ms fixed, 0.02 ms a token (make bench's model): one call 26 ms, two 28 ms.
    together = by_length(queue, max_size=4, budget=0, call=0.010, row=per_token(0.00002))
    assert lengths(together.members) == [200, 5, 6, 190]
    assert (together.longest, together.budget_hit) == (200, False)
    # Not when the whole queue would break the token budget.
    capped = by_length(queue, max_size=4, budget=600, call=0.010, row=per_token(0.00002))
    assert lengths(capped.members) == [200, 190]


def test_a_large_fixed_cost_fills_the_batch_anyway() -> None:
    """When a call's fixed cost dwarfs its padding, one batch for all is cheapest."""
    queue = [Req(200), Req(5), Req(6), Req(190)]
    choice = by_length(queue, max_size=4, budget=0, call=1.0, row=per_token(0.00005))
    assert lengths(choice.members) == [200, 5, 6, 190]


def per_token(seconds: float) -> Callable[[int], float]:
    """A row's cost on a model that charges ``seconds`` a padded token."""
    return lambda longest: seconds * longest


@dataclass(frozen=True)
class Surface:
    """A cost surface: ``call + size x (row + token x longest + squared x longest^2)``."""

    call: float
    row: float
    token: float
    squared: float

    def per_row(self, longest: int) -> float:
        return self.row + self.token * longest + self.squared * longest * longest

    def batch(self, members: list[int]) -> float:
        return self.call + len(members) * self.per_row(max(members))


SURFACES = (
    Surface(0.001, 0.0, 0.0001, 0.0),  # a line: call and padded tokens
    Surface(0.01, 0.0, 0.0001, 0.0),
    Surface(0.0001, 0.0, 0.0001, 0.0),
    Surface(0.0, 0.002, 0.0001, 0.000002),  # a CPU encoder: no call cost, attention
    Surface(0.05, 0.0001, 0.00001, 0.0000001),  # a GPU: the call dominates
)


def cheapest_split(lengths_left: list[int], max_size: int, surface: Surface) -> float:
    """By brute force over every way to split ``lengths_left`` into batches (not only runs of
    neighbouring lengths): the least total cost by ``surface``."""
    if not lengths_left:
        return 0.0
    first, rest = lengths_left[0], lengths_left[1:]
    best = float("inf")
    for mask in range(1 << len(rest)):
        batch = [first] + [x for k, x in enumerate(rest) if mask >> k & 1]
        if len(batch) > max_size:
            continue
        others = [x for k, x in enumerate(rest) if not mask >> k & 1]
        cost = surface.batch(batch) + cheapest_split(others, max_size, surface)
        best = min(best, cost)
    return best


def test_the_batch_that_goes_belongs_to_a_cheapest_way_of_sending_the_whole_queue() -> None:
    """Against brute force on random queues: sending the chosen batch and then the rest as
    cheaply as possible costs no more than the cheapest way to send everything."""
    rng = random.Random(3)
    for _ in range(150):
        queue = [Req(rng.choice([1, 2, 3, 8, 9, 20, 21, 60])) for _ in range(rng.randrange(1, 8))]
        max_size = rng.randrange(1, 5)
        surface = rng.choice(SURFACES)
        choice = by_length(queue, max_size, budget=0, call=surface.call, row=surface.per_row)
        assert queue[0] in choice.members
        assert len(choice.members) <= max_size
        left = list(queue)
        for member in choice.members:
            left.remove(member)
        chosen = surface.batch(lengths(choice.members))
        then = cheapest_split(lengths(left), max_size, surface)
        best = cheapest_split(lengths(queue), max_size, surface)
        assert chosen + then == pytest.approx(best)


def test_no_batch_costs_more_than_sending_its_requests_one_by_one() -> None:
    """A property, on random queues of up to four batches' worth and every kind of surface:
    the chosen batch's predicted cost is at most that of one call per member."""
    rng = random.Random(5)
    for _ in range(400):
        max_size = rng.randrange(1, 17)
        queue = [
            Req(max(1, round(rng.lognormvariate(3, 0.9))))
            for _ in range(rng.randrange(1, 4 * max_size + 1))
        ]
        surface = rng.choice(SURFACES)
        budget = rng.choice([0, 0, 64, 512])
        choice = by_length(queue, max_size, budget, call=surface.call, row=surface.per_row)
        alone = sum(surface.batch([r.length]) for r in choice.members)
        assert surface.batch(lengths(choice.members)) <= alone * (1 + 1e-12)


def test_length_aware_batches_pad_far_less_than_fifo_on_lognormal_lengths() -> None:
    rng = random.Random(7)
    queue = [Req(max(1, round(rng.lognormvariate(3, 0.7)))) for _ in range(128)]
    fifo = queue[:32]
    chosen = by_length(queue, max_size=32, budget=0).members
    assert queue[0] in chosen

    def efficiency(batch: list[Req]) -> float:
        return sum(lengths(batch)) / (len(batch) * max(lengths(batch)))

    assert len(chosen) == 32
    assert efficiency(chosen) > 1.5 * efficiency(fifo)


# -- what the adaptive wait learns ----------------------------------------------------------


def test_the_arrival_rate_follows_steady_traffic_and_decays_when_it_stops() -> None:
    rate = Arrivals()
    now = 0.0
    for _ in range(2000):
        now += 0.01  # 100 per second
        rate.arrived(now)
    assert rate.per_second(now) == pytest.approx(100, rel=0.05)
    later = now + 3 * RATE_TIME_CONSTANT_S
    assert rate.per_second(later) < 100 * 0.06


def test_worth_waiting_when_the_fixed_cost_is_large_and_arrivals_are_dense() -> None:
    cost = CostSurface()
    for size in range(1, 2 * MIN_BATCHES):
        tokens = size * 10
        cost.observe(size, 10, 0.005 + 0.00005 * tokens)  # the demo model: 5 ms + 0.05 ms/token
    # 2000/s: a gap of 0.5 ms; two requests wait 1.5 ms to save the next one a 5 ms call.
    assert worth_waiting(cost, 2000.0, size=2, longest=20)
    # 24/s (10% of the demo model's FIFO limit): a 42 ms gap is never worth it.
    assert not worth_waiting(cost, 24.0, size=1, longest=20)
    assert not worth_waiting(cost, 0.0, size=1, longest=20)
    assert worth_waiting(CostSurface(), 24.0, size=1, longest=20)  # unknown: wait as fixed


# -- the batcher in these modes ----------------------------------------------------------


@dataclass
class RecordingModel:
    """A model that costs ``fixed_s + per_token_s x padded tokens`` and records its batches."""

    fixed_s: float
    per_token_s: float = 0.0
    batches: list[list[str]] = field(default_factory=list)
    started: list[float] = field(default_factory=list)

    async def infer(self, inputs: list[Any]) -> BatchResult:
        self.started.append(time.monotonic())
        self.batches.append(list(inputs))
        longest = max(len(str(p).split()) for p in inputs)
        await asyncio.sleep(self.fixed_s + self.per_token_s * len(inputs) * longest)
        return BatchResult(list(inputs), [None] * len(inputs))


def batcher(model: RecordingModel, **settings: Any) -> Batcher:
    options: dict[str, Any] = {
        "max_batch_size": 4,
        "max_wait_s": 0.005,
        "max_queue_size": 10_000,
        "max_batch_tokens": 0,
        "timeout_s": 60.0,
        "max_concurrent_batches": 1,
        "batch_by": "arrival",
        "wait_policy": "fixed",
        **settings,
    }
    metrics = SidecarMetrics("m", "v", CollectorRegistry())
    return Batcher(model, metrics, **options)


def payload(index: int, length: int) -> str:
    return " ".join([f"r{index}"] + ["x"] * (length - 1))


async def test_every_length_aware_batch_holds_the_oldest_queued_request_so_none_starves() -> None:
    """The starvation bound of docs/design.md: every batch takes the oldest queued request,
    so a request goes at the latest in the batch after those that take the requests queued
    before it: at most one batch per older request (counted, so a slow machine cannot fail it)."""
    model = RecordingModel(fixed_s=0.004, per_token_s=0.00002)
    b = batcher(model, batch_by="length")
    b.start()
    rng = random.Random(11)
    submitted: list[tuple[float, int]] = []  # (when, requests queued ahead of it)
    pendings = []
    for i in range(400):
        length = rng.randrange(50, 60) if rng.random() < 0.1 else rng.randrange(1, 6)
        submitted.append((time.monotonic(), b.depth))
        pendings.append(b.submit(payload(i, length)))
        await asyncio.sleep(rng.expovariate(1 / 0.0012))
    outcomes = await asyncio.gather(*(p.future for p in pendings))
    await b.drain(5)

    assert [o.status for o in outcomes] == [200] * 400
    batch_of: dict[int, int] = {}
    for k, batch in enumerate(model.batches):
        ids = sorted(int(str(p).split()[0][1:]) for p in batch)
        sent_before = {i for i, j in batch_of.items() if j < k}
        # Everything older than this batch's oldest member went in an earlier batch.
        assert set(range(ids[0])) <= sent_before, f"batch {k} skipped an older request"
        batch_of.update(dict.fromkeys(ids, k))
    for i, (when, ahead) in enumerate(submitted):
        # Batches that reached the model after this request arrived, up to and including its
        # own: one per older request, its own, and one already dispatched when it arrived.
        waited = sum(1 for k in range(batch_of[i] + 1) if model.started[k] >= when)
        assert waited <= ahead + 2, (i, waited, ahead)


async def test_length_aware_batches_group_similar_lengths(
    start_model: StartModel, start_sidecar: StartSidecar
) -> None:
    """Requests of 1 and 50 tokens queued while the model is busy: by arrival they pair up as
    1+50 twice (200 padded tokens), by length as 1+1 and 50+50 (102)."""
    padded = {}
    for mode in ("arrival", "length"):
        model = await start_model(fixed_ms=150, per_token_ms=0)
        sidecar = await start_sidecar(model.url, max_batch_size=2, max_wait_ms=1, batch_by=mode)
        first = asyncio.ensure_future(sidecar.infer("busy"))
        await asyncio.sleep(0.05)  # the model runs the first batch
        queued = [[0], list(range(50)), [1], list(range(50))]
        results = await asyncio.gather(*(sidecar.infer(p) for p in queued))
        assert (await first)[0] == 200
        assert [status for status, _ in results] == [200] * 4
        assert [body["output"]["length"] for _, body in results] == [1, 50, 1, 50]
        padded[mode] = sidecar.sample("modelroll_batch_tokens_total", kind="padded") - 1
    assert padded == {"arrival": 200, "length": 102}


@pytest.mark.parametrize("batch_by", ["arrival", "length"])
async def test_the_adaptive_wait_sends_a_lone_request_at_once(
    start_model: StartModel, start_sidecar: StartSidecar, batch_by: str
) -> None:
    """An idle model and nobody else coming: the adaptive wait does not wait max-wait
    (2 s here) for company; the fixed wait does."""
    timings = {}
    for policy in ("adaptive", "fixed"):
        model = await start_model(fixed_ms=5, per_token_ms=0)
        sidecar = await start_sidecar(
            model.url, max_batch_size=32, max_wait_ms=2000, batch_by=batch_by, wait_policy=policy
        )
        started = time.monotonic()
        status, _ = await sidecar.infer("alone")
        timings[policy] = time.monotonic() - started
        assert status == 200
        reason = "idle" if policy == "adaptive" else "timeout"
        assert sidecar.sample("modelroll_batches_total", reason=reason) == 1
    assert timings["adaptive"] < 0.5
    assert timings["fixed"] >= 2.0


async def test_the_adaptive_wait_fills_batches_when_arrivals_are_dense_and_calls_are_dear() -> None:
    """A 100 ms fixed cost and a request every 2 ms (traffic the batcher has seen for a
    while): the first request on an idle model waits a few ms for company, which saves the next
    ones a 100 ms call each; with a request every 150 ms, each goes at once."""
    for gap_s, expect_full in ((0.002, True), (0.15, False)):
        model = RecordingModel(fixed_s=0.1)
        b = batcher(model, max_batch_size=8, max_wait_s=1.0, wait_policy="adaptive")
        for size in range(1, MIN_BATCHES + 1):
            b.cost.observe(size, 1, 0.1)
        now = asyncio.get_running_loop().time()
        for k in range(1000):  # the last two seconds' traffic, at this gap
            b.arrivals.arrived(now - (1000 - k) * gap_s)
        b.start()
        pendings = []
        for i in range(24 if expect_full else 4):
            pendings.append(b.submit(payload(i, 1)))
            await asyncio.sleep(gap_s)
        await asyncio.gather(*(p.future for p in pendings))
        await b.drain(5)
        sizes = [len(batch) for batch in model.batches]
        if expect_full:
            assert sizes == [8, 8, 8], sizes
        else:
            assert sizes == [1, 1, 1, 1]
