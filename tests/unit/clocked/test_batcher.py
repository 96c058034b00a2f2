"""The Batcher in-process, with a scripted model, on virtual time (conftest.py: loop time
jumps to the next timer whenever every task waits, so these tests assert exact times and take
milliseconds). Every close rule and every guarantee of docs/design.md ("Batching"), whatever the
model does; the HTTP tests (tests/unit/sidecar/) cover the HTTP layer.
"""

from __future__ import annotations

import asyncio
import functools
import math
import random
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from modelroll_sidecar.batching import Batcher, Outcome, Pending, QueueFull, ShuttingDown
from modelroll_sidecar.cost_model import MIN_BATCHES, CostSurface
from modelroll_sidecar.metrics import SidecarMetrics
from modelroll_sidecar.protocol import BatchResult, ModelFailed, ModelRejected

Answer = Callable[[list[Any]], BatchResult]


def echo(inputs: list[Any]) -> BatchResult:
    return BatchResult(list(inputs), [None] * len(inputs))


def refuse_poison(inputs: list[Any]) -> BatchResult:
    """A model that refuses, as bad input, any batch holding "poison"."""
    if "poison" in inputs:
        raise ModelRejected("model answered 400: cannot parse")
    return echo(inputs)


@dataclass
class ScriptedModel:
    """Takes ``seconds`` of loop time per call, then answers what ``answer`` makes of the
    inputs (or raises what it raises); records each call's inputs and start time."""

    seconds: float = 1.0
    answer: Answer = echo
    calls: list[list[Any]] = field(default_factory=list)
    started: list[float] = field(default_factory=list)
    running: int = 0
    most_running: int = 0

    async def infer(self, inputs: list[Any]) -> BatchResult:
        self.calls.append(list(inputs))
        self.started.append(asyncio.get_running_loop().time())
        self.running += 1
        self.most_running = max(self.most_running, self.running)
        try:
            await asyncio.sleep(self.seconds)
            return self.answer(inputs)
        finally:
            self.running -= 1


@dataclass
class Harness:
    batcher: Batcher
    registry: CollectorRegistry

    def closed(self, reason: str) -> float:
        value = self.registry.get_sample_value(
            "modelroll_batches_total", {"model": "m", "version": "v", "reason": reason}
        )
        return value or 0.0

    def rejected(self, reason: str) -> float:
        value = self.registry.get_sample_value(
            "modelroll_rejected_total", {"model": "m", "version": "v", "reason": reason}
        )
        return value or 0.0


@pytest.fixture
async def start() -> Any:
    """``start(model, **settings)``: a running Batcher (max batch 4, max-wait 0.5 s, deadline
    60 s unless given); each is drained at the end of the test."""
    started: list[Batcher] = []

    def make(model: ScriptedModel, **settings: Any) -> Harness:
        options: dict[str, Any] = {
            "max_batch_size": 4,
            "max_wait_s": 0.5,
            "max_queue_size": 100,
            "max_batch_tokens": 0,
            "timeout_s": 60.0,
            "max_concurrent_batches": 1,
            "batch_by": "arrival",
            "wait_policy": "fixed",
            **settings,
        }
        registry = CollectorRegistry()
        batcher = Batcher(model, SidecarMetrics("m", "v", registry), **options)
        batcher.start()
        started.append(batcher)
        return Harness(batcher, registry)

    yield make
    for batcher in started:
        await batcher.drain(5)


def now() -> float:
    return asyncio.get_running_loop().time()


async def answers(*pendings: Any) -> list[Outcome]:
    return list(await asyncio.gather(*(p.future for p in pendings)))


def statuses(outcomes: list[Outcome]) -> list[int]:
    return [o.status for o in outcomes]


def answered_at(pendings: list[Pending]) -> list[float]:
    """The loop time each request is answered at, filled in as they are."""
    times = [math.nan] * len(pendings)

    def record(i: int, _: object) -> None:
        times[i] = now()

    for i, pending in enumerate(pendings):
        pending.future.add_done_callback(functools.partial(record, i))
    return times


# -- what closes a batch --------------------------------------------------------------------


async def test_a_full_batch_goes_at_once(start: Any) -> None:
    model = ScriptedModel()
    h = start(model, max_wait_s=100.0, timeout_s=200.0)
    t0 = now()
    pendings = [h.batcher.submit(f"r{i}") for i in range(6)]
    outcomes = await answers(*pendings[:4])
    assert model.started == [pytest.approx(t0)]
    assert model.calls == [["r0", "r1", "r2", "r3"]]
    assert [o.output for o in outcomes] == ["r0", "r1", "r2", "r3"]
    assert h.closed("full") == 1
    # The two left over wait out their max-wait (counted from their arrival at t0).
    await answers(*pendings[4:])
    assert model.started[1] == pytest.approx(t0 + 100.0)
    assert h.closed("timeout") == 1


async def test_max_wait_counts_from_the_oldest_request(start: Any) -> None:
    model = ScriptedModel()
    h = start(model, max_wait_s=0.5)
    t0 = now()
    first = h.batcher.submit("a")
    await asyncio.sleep(0.3)
    second = h.batcher.submit("b")
    await answers(first, second)
    assert model.calls == [["a", "b"]]
    assert model.started == [pytest.approx(t0 + 0.5)]
    assert h.closed("timeout") == 1


async def test_max_wait_zero_sends_at_once_and_batches_what_arrives_meanwhile(start: Any) -> None:
    model = ScriptedModel(seconds=1.0)
    h = start(model, max_wait_s=0.0)
    t0 = now()
    first = h.batcher.submit("a")
    await asyncio.sleep(0.1)
    rest = [h.batcher.submit(x) for x in ("b", "c")]
    await answers(first, *rest)
    assert model.calls == [["a"], ["b", "c"]]
    assert model.started == [pytest.approx(t0), pytest.approx(t0 + 1.0)]


async def test_the_token_budget_closes_a_batch_before_padding_exceeds_it(start: Any) -> None:
    model = ScriptedModel()
    h = start(model, max_batch_tokens=9, max_wait_s=100.0, timeout_s=200.0)
    t0 = now()
    # Lengths 3, 3, 3, 1: three fit (3 x 3 = 9), a fourth would make 4 x 3 = 12.
    pendings = [h.batcher.submit(p) for p in ("x x x", "y y y", "z z z", "w")]
    await answers(*pendings[:3])
    assert model.calls[0] == ["x x x", "y y y", "z z z"]
    assert model.started[0] == pytest.approx(t0)
    assert h.closed("tokens") == 1


async def test_a_request_over_the_budget_on_its_own_runs_alone(start: Any) -> None:
    model = ScriptedModel()
    h = start(model, max_batch_tokens=4, max_wait_s=100.0, timeout_s=200.0)
    (outcome,) = await answers(h.batcher.submit("a b c d e f"))
    assert outcome.status == 200
    assert model.calls == [["a b c d e f"]]


async def test_no_more_batches_run_than_the_concurrency_cap(start: Any) -> None:
    model = ScriptedModel(seconds=1.0)
    h = start(model, max_batch_size=1, max_concurrent_batches=2, max_wait_s=0.0)
    t0 = now()
    outcomes = await answers(*(h.batcher.submit(i) for i in range(5)))
    assert statuses(outcomes) == [200] * 5
    assert model.most_running == 2
    starts = [s - t0 for s in model.started]
    assert starts == pytest.approx([0, 0, 1, 1, 2])


async def test_the_next_batch_fills_while_the_model_is_busy(start: Any) -> None:
    model = ScriptedModel(seconds=1.0)
    h = start(model, max_batch_size=8, max_wait_s=0.01)
    first = h.batcher.submit("busy")
    await asyncio.sleep(0.1)
    rest = [h.batcher.submit(i) for i in range(6)]
    await answers(first, *rest)
    assert model.calls == [["busy"], [0, 1, 2, 3, 4, 5]]


# -- the guarantees ---------------------------------------------------------------------------


async def test_a_request_past_its_deadline_gets_504_and_the_model_never_sees_it(
    start: Any,
) -> None:
    model = ScriptedModel(seconds=5.0)
    h = start(model, timeout_s=1.0, max_wait_s=0.0)
    t0 = now()
    busy = h.batcher.submit("busy")
    await asyncio.sleep(0.01)
    late = h.batcher.submit("late")
    (outcome,) = await answers(late)
    assert outcome.status == 504
    assert outcome.error is not None
    assert "deadline" in outcome.error
    assert now() - t0 == pytest.approx(1.01)
    assert (await answers(busy))[0].status == 200
    assert model.calls == [["busy"]]
    assert h.rejected("deadline") == 1


async def test_a_full_queue_refuses_with_queue_full(start: Any) -> None:
    model = ScriptedModel(seconds=1.0)
    h = start(model, max_queue_size=3, max_batch_size=1, max_wait_s=0.0)
    running = h.batcher.submit("running")  # leaves the queue for the model at once
    await asyncio.sleep(0.001)
    queued = [h.batcher.submit(i) for i in range(3)]
    with pytest.raises(QueueFull, match="3 requests waiting"):
        h.batcher.submit("one too many")
    assert statuses(await answers(running, *queued)) == [200] * 4
    assert h.rejected("queue_full") == 1


async def test_per_item_errors_fail_only_their_own_requests(start: Any) -> None:
    def second_is_bad(inputs: list[Any]) -> BatchResult:
        return BatchResult(list(inputs), [None, "bad input", None])

    h = start(ScriptedModel(answer=second_is_bad), max_batch_size=3)
    outcomes = await answers(*(h.batcher.submit(x) for x in "abc"))
    assert statuses(outcomes) == [200, 422, 200]
    assert outcomes[1].error == "bad input"


async def test_a_batch_the_model_refuses_is_split_until_the_culprit_is_alone(start: Any) -> None:
    model = ScriptedModel(answer=refuse_poison)
    h = start(model, max_batch_size=4)
    outcomes = await answers(*(h.batcher.submit(x) for x in ("a", "b", "poison", "d")))
    assert statuses(outcomes) == [200, 200, 422, 200]
    assert model.calls == [
        ["a", "b", "poison", "d"],
        ["a", "b"],
        ["poison", "d"],
        ["poison"],
        ["d"],
    ]


async def test_a_slow_refusal_is_split_only_while_each_requests_deadline_lasts(
    start: Any,
) -> None:
    """Each call takes 1 s and the deadline is 2.5 s: the half without the poison keeps its
    answers (given as soon as the model answers it), the rest get 504 once their deadline has
    passed and are not sent again. Unbounded, the split would take 7 calls."""
    model = ScriptedModel(seconds=1.0, answer=refuse_poison)
    h = start(model, max_batch_size=8, timeout_s=2.5)
    t0 = now()
    inputs = ["a", "b", "c", "d", "e", "poison", "g", "h"]
    pendings = [h.batcher.submit(x) for x in inputs]
    times = answered_at(pendings)
    outcomes = await answers(*pendings)

    assert statuses(outcomes) == [200] * 4 + [504] * 4
    assert [o.output for o in outcomes[:4]] == inputs[:4]
    assert outcomes[4].error == (
        "the model refused the batch this request was in, and its deadline of 2500ms passed "
        "while the sidecar isolated the request at fault"
    )
    assert model.calls == [inputs, inputs[:4], inputs[4:]]
    assert [t - t0 for t in times] == pytest.approx([2.0] * 4 + [3.0] * 4)
    assert max(times) <= t0 + 2.5 + model.seconds
    assert h.rejected("split_deadline") == 4
    assert h.rejected("deadline") == 0


async def test_answers_given_during_a_split_stand_when_a_later_call_fails(start: Any) -> None:
    """The model answers the half without the poison, then fails the other half (a 500)."""

    def fail_the_third_call(inputs: list[Any]) -> BatchResult:
        if len(model.calls) == 3:
            raise ModelFailed("model answered 500")
        return refuse_poison(inputs)

    model = ScriptedModel(answer=fail_the_third_call)
    h = start(model, max_batch_size=4)
    a, b, poison, d = await answers(*(h.batcher.submit(x) for x in ("a", "b", "poison", "d")))
    assert (a, b) == (Outcome(200, "a", call_size=2), Outcome(200, "b", call_size=2))
    assert poison == d == Outcome(502, error="model answered 500", call_size=2)


async def test_a_split_still_isolates_a_culprit_whose_deadline_lasts(start: Any) -> None:
    """Requests that arrived later have later deadlines: while the older ones get 504, the
    poison, the newest, is sent alone and gets 422."""
    model = ScriptedModel(seconds=1.0, answer=refuse_poison)
    h = start(model, max_batch_size=8, max_wait_s=2.0, timeout_s=2.5)
    t0 = now()
    older = [h.batcher.submit(x) for x in "abcd"]
    await asyncio.sleep(0.4)
    later = [h.batcher.submit(x) for x in "efg"]
    await asyncio.sleep(0.6)
    pendings = [*older, *later, h.batcher.submit("poison")]  # full: the batch goes at t0 + 1
    times = answered_at(pendings)
    outcomes = await answers(*pendings)

    assert statuses(outcomes) == [200] * 4 + [504] * 3 + [422]
    assert model.calls == [[*"abcdefg", "poison"], [*"abcd"], ["poison"]]
    assert [t - t0 for t in model.started] == pytest.approx([1.0, 2.0, 3.0])
    assert [t - t0 for t in times] == pytest.approx([3.0] * 7 + [4.0])
    deadlines = [t0 + 2.5] * 4 + [t0 + 2.9] * 3 + [t0 + 3.5]
    assert all(t <= d + model.seconds for t, d in zip(times, deadlines, strict=True))
    assert h.rejected("split_deadline") == 3


@pytest.mark.parametrize(
    ("answer", "message"),
    [
        (lambda inputs: BatchResult(list(inputs)[:-1], [None] * len(inputs)), "2 outputs"),
        (lambda inputs: BatchResult(list(inputs), [None]), "1 errors"),
        (lambda inputs: BatchResult([*inputs, "extra"], [None] * 4), "4 outputs"),
    ],
    ids=["fewer outputs", "fewer errors", "more outputs"],
)
async def test_a_wrong_number_of_outputs_answers_every_request_502(
    start: Any, answer: Answer, message: str
) -> None:
    h = start(ScriptedModel(answer=answer), max_batch_size=3)
    t0 = now()
    outcomes = await answers(*(h.batcher.submit(x) for x in "abc"))
    assert statuses(outcomes) == [502] * 3
    assert all(o.error is not None and message in o.error for o in outcomes)
    assert now() - t0 == pytest.approx(1.0)  # a full batch, the model's 1 s: no deadline wait
    assert h.batcher.depth == 0


async def test_a_model_that_fails_the_batch_answers_each_request_with_its_status(
    start: Any,
) -> None:
    def fail(inputs: list[Any]) -> BatchResult:
        raise ModelFailed("model answered 500")

    h = start(ScriptedModel(answer=fail), max_batch_size=2)
    outcomes = await answers(*(h.batcher.submit(x) for x in "ab"))
    assert outcomes == [Outcome(502, error="model answered 500", call_size=2)] * 2


async def test_an_unexpected_exception_in_the_model_call_answers_502(start: Any) -> None:
    def crash(inputs: list[Any]) -> BatchResult:
        raise RuntimeError("bug")

    h = start(ScriptedModel(answer=crash), max_batch_size=2)
    outcomes = await answers(*(h.batcher.submit(x) for x in "ab"))
    assert statuses(outcomes) == [502, 502]
    assert outcomes[0].error == "the batch failed inside the sidecar"
    # The batcher still works.
    assert h.batcher.alive


async def test_answers_stand_when_bookkeeping_after_the_model_fails(start: Any) -> None:
    model = ScriptedModel()
    h = start(model, max_batch_size=2)

    class BrokenCost(CostSurface):
        def observe(self, size: int, longest: int, seconds: float) -> float | None:
            raise ZeroDivisionError("a bug in the cost fit")

    h.batcher.cost = BrokenCost()
    outcomes = await answers(*(h.batcher.submit(x) for x in "ab"))
    assert outcomes == [Outcome(200, "a", call_size=2), Outcome(200, "b", call_size=2)]


async def test_a_batch_cancelled_mid_call_answers_503(start: Any) -> None:
    model = ScriptedModel(seconds=10.0)
    h = start(model, max_batch_size=2, max_wait_s=0.0)
    pendings = [h.batcher.submit(x) for x in "ab"]
    await asyncio.sleep(1.0)
    queued = h.batcher.submit("c")
    t0 = now()
    await h.batcher.drain(2.0)  # the model needs 9 s more: the drain runs out
    outcomes = await answers(*pendings, queued)
    assert statuses(outcomes) == [503, 503, 503]
    assert outcomes[0].error == "the sidecar shut down mid-batch"
    assert now() - t0 == pytest.approx(2.0)


async def test_drain_sends_what_is_queued_at_once_and_refuses_new_requests(start: Any) -> None:
    model = ScriptedModel(seconds=1.0)
    h = start(model, max_wait_s=100.0, timeout_s=200.0)
    t0 = now()
    pendings = [h.batcher.submit(x) for x in "ab"]
    draining = asyncio.ensure_future(h.batcher.drain(30.0))
    await asyncio.sleep(0)
    with pytest.raises(ShuttingDown):
        h.batcher.submit("late")
    await draining
    assert statuses(await answers(*pendings)) == [200, 200]
    assert model.started == [pytest.approx(t0)]  # not after max-wait's 100 s
    assert h.closed("drain") == 1


async def test_a_disconnected_client_leaves_the_queue(start: Any) -> None:
    model = ScriptedModel(seconds=1.0)
    h = start(model, max_wait_s=0.5)
    gone, stays = h.batcher.submit("gone"), h.batcher.submit("stays")
    gone.future.cancel()
    h.batcher.abandon(gone)
    assert statuses(await answers(stays)) == [200]
    assert model.calls == [["stays"]]
    assert h.rejected("disconnect") == 1


# -- token budget, length-aware forming, adaptive wait ---------------------------------------------


async def test_the_adaptive_wait_sends_a_lone_request_at_once_once_the_cost_is_known(
    start: Any,
) -> None:
    model = ScriptedModel(seconds=0.02)
    h = start(model, max_wait_s=0.5, wait_policy="adaptive")
    for size in range(1, MIN_BATCHES + 1):
        h.batcher.cost.observe(size, 1, 0.02 + 0.0001 * size)
    t0 = now()
    await answers(h.batcher.submit("alone"))
    assert model.started == [pytest.approx(t0)]
    assert h.closed("idle") == 1


async def test_the_adaptive_wait_waits_max_wait_until_the_cost_is_known(start: Any) -> None:
    model = ScriptedModel(seconds=0.02)
    h = start(model, max_wait_s=0.5, wait_policy="adaptive")
    t0 = now()
    await answers(h.batcher.submit("alone"))
    assert model.started == [pytest.approx(t0 + 0.5)]


async def test_by_length_the_oldest_goes_and_similar_lengths_join_it(start: Any) -> None:
    model = ScriptedModel(seconds=1.0)
    h = start(model, max_batch_size=2, max_wait_s=0.0, batch_by="length")
    busy = h.batcher.submit("busy")
    await asyncio.sleep(0.1)
    queued = [h.batcher.submit(p) for p in ("a", "l o n g", "b", "l o n g 2")]
    await answers(busy, *queued)
    assert model.calls[1:] == [["a", "b"], ["l o n g", "l o n g 2"]]


# -- requests of several rows (the Open Inference Protocol's first dimension) ---------------------


async def test_max_batch_size_counts_rows_not_requests(start: Any) -> None:
    model = ScriptedModel()
    h = start(model, max_batch_size=4, max_wait_s=100.0, timeout_s=200.0)
    t0 = now()
    two, three, one = (
        h.batcher.submit(name, rows=rows) for name, rows in [("a", 2), ("b", 2), ("c", 1)]
    )
    await answers(two, three)
    assert model.calls == [["a", "b"]]  # 4 rows: full, at once
    assert model.started == [pytest.approx(t0)]
    assert h.closed("full") == 1
    await answers(one)
    assert model.started[1] == pytest.approx(t0 + 100.0)  # alone: its max-wait


async def test_a_request_of_more_rows_than_a_batch_goes_alone_and_whole(start: Any) -> None:
    model = ScriptedModel(seconds=1.0)
    h = start(model, max_batch_size=4, max_wait_s=100.0, timeout_s=200.0)
    t0 = now()
    small = h.batcher.submit("small", rows=1)
    big = h.batcher.submit("big", rows=10)
    outcomes = await answers(small, big)
    assert statuses(outcomes) == [200, 200]
    assert model.calls == [["small"], ["big"]]  # never split, never refused
    assert model.started == [pytest.approx(t0), pytest.approx(t0 + 1.0)]  # full: no max-wait


async def test_the_token_budget_counts_rows_times_the_longest(start: Any) -> None:
    model = ScriptedModel()
    h = start(model, max_batch_size=16, max_wait_s=100.0, timeout_s=200.0, max_batch_tokens=20)
    t0 = now()
    pendings = [h.batcher.submit(n, length=5, rows=2) for n in ("a", "b", "c")]
    await answers(*pendings[:2])
    assert model.calls == [["a", "b"]]  # 2 x 2 rows x 5 = 20; with c, 30
    assert model.started == [pytest.approx(t0)]
    assert h.closed("tokens") == 1
    await answers(pendings[2])


async def test_by_length_a_batch_keeps_within_max_batch_size_in_rows(start: Any) -> None:
    model = ScriptedModel(seconds=1.0)
    h = start(model, max_batch_size=4, max_wait_s=0.0, batch_by="length")
    busy = h.batcher.submit("busy")
    await asyncio.sleep(0.1)
    queued = [
        h.batcher.submit(name, length=length, rows=rows)
        for name, length, rows in [("a", 10, 3), ("b", 10, 2), ("c", 11, 1), ("d", 12, 9)]
    ]
    outcomes = await answers(busy, *queued)
    assert statuses(outcomes) == [200] * 5
    assert model.calls[1:] == [["a"], ["b", "c"], ["d"]]


# -- the self-tuning defaults: batches by length on the learned surface, the auto wait --------


@dataclass
class SurfaceModel:
    """A model whose batch of inputs (each input its own length) takes ``call + size x (row +
    token x longest + squared x longest^2)`` seconds of loop time, times what ``scale`` draws
    for the call."""

    call: float
    row: float
    token: float = 0.0
    squared: float = 0.0
    scale: Callable[[], float] = lambda: 1.0
    sizes: list[int] = field(default_factory=list)

    async def infer(self, inputs: list[Any]) -> BatchResult:
        self.sizes.append(len(inputs))
        longest = max(inputs)
        per_row = self.row + self.token * longest + self.squared * longest**2
        await asyncio.sleep((self.call + len(inputs) * per_row) * self.scale())
        return echo(inputs)


SELF_TUNING = {"batch_by": "length", "wait_policy": "auto"}


async def poisson(
    h: Harness, rate: float, count: int, rng: random.Random, lengths: tuple[int, int] = (5, 40)
) -> list[tuple[float, Outcome]]:
    """Submit ``count`` requests at Poisson arrivals of ``rate`` a second, each its own length
    (as its payload); returns each one's latency and outcome."""
    latencies = [math.nan] * count

    def record(i: int, arrived: float, _: object) -> None:
        latencies[i] = now() - arrived

    pendings = []
    for i in range(count):
        await asyncio.sleep(rng.expovariate(rate))
        length = rng.randrange(*lengths)
        pending = h.batcher.submit(length, length=length)
        pending.future.add_done_callback(functools.partial(record, i, now()))
        pendings.append(pending)
    return list(zip(latencies, await answers(*pendings), strict=True))


def held(h: Harness) -> float:
    labels = {"model": "m", "version": "v"}
    return h.registry.get_sample_value("modelroll_batch_hold_seconds_sum", labels) or 0.0


async def test_on_a_cpu_encoder_the_defaults_never_hold_a_batch_and_add_no_latency_at_low_load(
    start: Any,
) -> None:
    """No cost per call to spread: at 10% load the defaults answer as no batching does (the
    same requests at the same times, p50 within a microsecond), and at 90% no batch is ever
    held for company."""
    p50 = {}
    for name, settings in (("defaults", SELF_TUNING), ("no batching", {"max_batch_size": 1})):
        model = SurfaceModel(call=0.0005, row=0.002, token=0.0004)
        h = start(model, **{"max_batch_size": 32, "max_wait_s": 0.01, **settings})
        light = await poisson(h, rate=8.0, count=200, rng=random.Random(1))
        p50[name] = statistics.median(latency for latency, _ in light)
        if name == "defaults":
            busy = await poisson(h, rate=80.0, count=400, rng=random.Random(1))
            assert statuses([o for _, o in busy]) == [200] * 400
            assert held(h) == 0.0
            assert h.batcher.cost.trusted
    assert p50["defaults"] == pytest.approx(p50["no batching"], abs=1e-6)


async def test_on_a_gpu_the_defaults_hold_for_company_and_fill_batches(start: Any) -> None:
    """A 30 ms call and an arrival every 20 ms: holding the model a little for company saves
    a whole call per request that joins, so batches are larger than when each batch goes the
    moment the model is free (max-wait 0)."""
    sizes = {}
    for name, settings in (("auto", SELF_TUNING), ("no wait", {"max_wait_s": 0.0})):
        model = SurfaceModel(call=0.030, row=0.0002)
        h = start(model, **{"max_batch_size": 16, "max_wait_s": 0.05, **settings})
        outcomes = await poisson(h, rate=50.0, count=600, rng=random.Random(2))
        assert statuses([o for _, o in outcomes]) == [200] * 600
        sizes[name] = statistics.mean(model.sizes)
        if name == "auto":
            assert held(h) > 0.0
    assert sizes["auto"] > 1.3 * sizes["no wait"]


@pytest.mark.parametrize(
    ("scale", "trusted"),
    [
        pytest.param(lambda rng: rng.lognormvariate(0, 0.9), False, id="noisy"),
        pytest.param(lambda rng: 1.0 if rng.random() < 0.6 else 5.0, False, id="bimodal"),
        pytest.param(lambda rng: 60.0 if rng.random() < 0.02 else 1.0, True, id="pauses"),
    ],
)
async def test_a_model_whose_duration_scatters_gets_no_long_holds_and_no_missed_deadlines(
    start: Any, scale: Callable[[random.Random], float], trusted: bool
) -> None:
    """On a GPU-like model (where holds pay) whose durations are noisy, bimodal or pause now
    and then: every request is answered within its deadline and no batch is held past
    max-wait. A fit that cannot predict (noise, two modes) is not trusted and holds nothing at
    all; rare pauses leave it trusted."""
    rng = random.Random(3)
    model = SurfaceModel(call=0.030, row=0.0002, scale=lambda: scale(rng))
    h = start(
        model,
        max_batch_size=16,
        max_wait_s=0.02,
        timeout_s=5.0,
        max_queue_size=10_000,
        **SELF_TUNING,
    )
    outcomes = await poisson(h, rate=100.0, count=1500, rng=rng)
    assert statuses([o for _, o in outcomes]) == [200] * 1500
    labels = {"model": "m", "version": "v"}
    batches = h.registry.get_sample_value("modelroll_batch_hold_seconds_count", labels) or 0.0
    over = h.registry.get_sample_value(
        "modelroll_batch_hold_seconds_bucket", {**labels, "le": "0.025"}
    )
    assert over == batches  # every hold within max-wait (20 ms)
    assert h.batcher.cost.trusted is trusted
    if not trusted:
        before = held(h)
        await poisson(h, rate=100.0, count=200, rng=rng)
        assert held(h) == before


async def test_a_model_that_turns_three_times_slower_is_followed(start: Any) -> None:
    """A second tenant arrives on the model's cores halfway: the surface follows, trusted
    again, and nothing waits forever meanwhile."""
    rng = random.Random(4)
    slow = [1.0]
    model = SurfaceModel(call=0.0005, row=0.002, token=0.0004, scale=lambda: slow[0])
    h = start(model, max_batch_size=32, max_wait_s=0.01, max_queue_size=10_000, **SELF_TUNING)
    await poisson(h, rate=60.0, count=300, rng=rng)
    before = h.batcher.cost.seconds(8, 20)
    slow[0] = 3.0
    outcomes = await poisson(h, rate=20.0, count=300, rng=rng)
    assert statuses([o for _, o in outcomes]) == [200] * 300
    assert h.batcher.cost.seconds(8, 20) == pytest.approx(3 * before, rel=0.15)
    assert h.batcher.cost.trusted


async def test_when_the_length_mix_changes_the_surface_follows_within_seconds(start: Any) -> None:
    """Short sentences for a while, then long ones: the surface, fitted where the traffic was,
    predicts the long batches within 10% after five seconds of them, trusted again."""
    rng = random.Random(5)
    model = SurfaceModel(call=0.0005, row=0.001, token=0.0001, squared=0.000001)
    h = start(model, max_batch_size=32, max_wait_s=0.01, max_queue_size=10_000, **SELF_TUNING)
    await poisson(h, rate=100.0, count=1000, rng=rng, lengths=(4, 12))
    outcomes = await poisson(h, rate=20.0, count=100, rng=rng, lengths=(60, 120))
    assert statuses([o for _, o in outcomes]) == [200] * 100
    for size, longest in ((1, 90), (4, 120)):
        expected = 0.0005 + size * (0.001 + 0.0001 * longest + 0.000001 * longest**2)
        assert h.batcher.cost.seconds(size, longest) == pytest.approx(expected, rel=0.1)
    assert h.batcher.cost.trusted


async def test_a_hold_whose_requests_left_the_queue_is_not_counted_in_the_next_batch(
    start: Any,
) -> None:
    """A request held for company whose client goes away: the next request, much later, is
    held its own max-wait, and that is what modelroll_batch_hold_seconds records."""
    model = ScriptedModel(seconds=0.1)
    h = start(model, max_wait_s=0.5)
    gone = h.batcher.submit("gone")
    await asyncio.sleep(0.2)
    gone.future.cancel()
    h.batcher.abandon(gone)
    await asyncio.sleep(10.0)
    await answers(h.batcher.submit("later"))
    labels = {"model": "m", "version": "v"}
    assert h.registry.get_sample_value("modelroll_batch_hold_seconds_sum", labels) == (
        pytest.approx(0.5)
    )
