"""make bench-llm's arithmetic: stream timing from SSE bytes, percentiles with cut streams as
lower bounds, ratios, rate selection, the engine's counters, the overhead target and the cost
beyond bare proxies; and short runs against a real demo engine, directly and through two bare
proxies."""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import aiohttp
import pytest

from modelroll_bench import results
from modelroll_bench.llm import (
    BARE,
    BARE2,
    CEILINGS,
    DIRECT,
    GATEWAY,
    PATHS,
    QUICK,
    SIDECAR,
    EngineSetup,
    Measured,
    Setup,
    add_arguments,
    added,
    bare_proxy,
    beyond_bare,
    difference,
    render,
    select_rates,
    setup_from,
    summarize_overhead,
    summarize_run,
)
from modelroll_bench.llm_counters import EngineWork, Snapshot, batch_started, read_stats
from modelroll_bench.llm_load import (
    CUT,
    FAILED,
    OK,
    Sample,
    StreamSummary,
    StreamTimer,
    chat_bodies,
    fixed,
    interleave,
    open_streams,
    percentile_bound,
    prompts,
    summarize,
)
from modelroll_bench.llm_report import (
    Overhead,
    OverheadRound,
    OverheadSummary,
    Ratio,
    bounded_ratio,
    checks,
    figure,
    informational,
    overhead_line,
    ratios,
)
from modelroll_bench.servers import serve_module
from modelroll_bench.stats import Spread
from modelroll_devcluster.processes import free_port


def event(data: dict[str, Any] | str) -> bytes:
    text = data if isinstance(data, str) else json.dumps(data)
    return f"data: {text}\n\n".encode()


def content(text: str, role: bool = False) -> bytes:
    delta: dict[str, Any] = {"content": text, **({"role": "assistant"} if role else {})}
    return event({"choices": [{"index": 0, "delta": delta, "finish_reason": None}]})


FINISH = event({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
USAGE = event({"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 3}})
DONE = event("[DONE]")


# -- timing a stream -------------------------------------------------------------------------


def test_ttft_is_the_first_chunk_with_text_and_e2e_is_done_whatever_the_byte_split() -> None:
    role_only = event({"choices": [{"index": 0, "delta": {"role": "assistant"}}]})
    first = content("w1 ", role=True)
    timer = StreamTimer(started_at=100.0, path="direct")
    timer.feed(role_only, 100.001)  # no text yet
    timer.feed(first[:20], 100.002)  # half an event
    timer.feed(first[20:] + content("w2 ").replace(b"\n", b"\r\n"), 100.010)
    timer.feed(content("w3 ") + FINISH + USAGE, 100.020)
    timer.feed(DONE, 100.030)
    timer.end(100.031)
    sample = timer.sample(cut_at=200.0)
    assert sample.outcome == OK
    assert sample.path == "direct"
    assert sample.ttft_s == pytest.approx(0.010)  # the event was whole only then
    assert sample.e2e_s == pytest.approx(0.030)
    assert sample.output_tokens == 3  # usage's completion_tokens
    assert sample.ended_at == pytest.approx(100.030)


def test_output_tokens_are_counted_chunks_when_no_usage_comes() -> None:
    timer = StreamTimer(0.0)
    timer.feed(content("a") + content("b") + FINISH + DONE, 1.0)
    timer.end(1.0)
    assert timer.sample(5.0).output_tokens == 2


@pytest.mark.parametrize(
    ("tail", "reason"),
    [
        (b"", "the stream ended without data: [DONE]"),
        (event({"error": {"message": "broke off after 1 tokens"}}), "error event: broke off"),
    ],
)
def test_a_stream_without_done_or_with_an_error_event_failed(tail: bytes, reason: str) -> None:
    timer = StreamTimer(0.0)
    timer.feed(content("a") + tail, 0.5)
    timer.end(0.6)
    sample = timer.sample(9.0)
    assert sample.outcome == FAILED
    assert sample.error is not None
    assert sample.error.startswith(reason)
    assert (sample.ttft_s, sample.e2e_s) == (0.5, None)
    assert sample.waited_s == pytest.approx(0.6)


def test_a_stream_still_going_at_the_cut_is_cut_with_what_it_had() -> None:
    timer = StreamTimer(10.0)
    timer.feed(content("a"), 11.0)
    sample = timer.sample(cut_at=14.0)
    assert sample.outcome == CUT
    assert (sample.ttft_s, sample.e2e_s, sample.waited_s) == (1.0, None, 4.0)
    assert StreamTimer(10.0).sample(cut_at=12.5).ttft_s is None


def test_only_tokens_arriving_inside_the_window_count_towards_it() -> None:
    timer = StreamTimer(0.0, window=(1.0, 2.0))
    timer.feed(content("early"), 0.5)
    timer.feed(content("a") + content("b"), 1.5)
    timer.feed(content("late") + FINISH + USAGE + DONE, 2.5)
    timer.end(2.5)
    sample = timer.sample(9.0)
    assert (sample.tokens_in_window, sample.output_tokens) == (2, 3)


def test_an_http_error_is_a_failure_before_any_token() -> None:
    timer = StreamTimer(0.0)
    timer.fail("HTTP 429", 0.01)
    timer.fail("later reasons do not replace the first", 0.02)
    sample = timer.sample(1.0)
    assert (sample.outcome, sample.error, sample.ttft_s) == (FAILED, "HTTP 429", None)


# -- percentiles, summaries and ratios --------------------------------------------------------


def test_percentile_bound_is_exact_while_no_lower_bound_sorts_at_or_below_it() -> None:
    exact = [(float(v), True) for v in range(1, 100)]
    assert percentile_bound([*exact, (500.0, False)], 0.50) == (50.0, True)
    assert percentile_bound([*exact, (500.0, False)], 0.99) == (99.0, True)
    # a cut stream that had waited 30: its true time may be anything above 30
    assert percentile_bound([*exact, (30.0, False)], 0.50) == (49.0, False)
    assert percentile_bound([*exact, (30.0, False)], 0.25) == (25.0, True)
    # a tie with a lower bound is a lower bound
    assert percentile_bound([(1.0, True), (2.0, True), (2.0, False)], 0.5) == (2.0, False)
    assert percentile_bound([], 0.5) is None


def sample(outcome: str, ttft: float | None, e2e: float | None, waited: float) -> Sample:
    return Sample("p", 0.0, outcome, ttft, e2e, waited, 10, None, 4)


def test_summary_keeps_cut_streams_as_bounds_and_leaves_failures_out() -> None:
    samples = [sample(OK, 0.01 * i, 0.1 * i, 0.1 * i) for i in range(1, 9)]
    samples.append(sample(CUT, None, None, 0.9))  # cut after 900 ms without a token
    samples.append(sample(FAILED, 0.001, None, 0.002))  # neither TTFT nor e2e
    row = summarize(samples, elapsed_s=2.0, window_s=4.0)
    assert (row.requests, row.ok, row.cut, row.failed) == (10, 8, 1, 1)
    assert row.output_tps == 10.0  # 10 requests x 4 tokens in the window / 4 s
    # 10..80 ms and one >= 900 ms: the median is exact, the tail only a bound
    assert (row.ttft_p50_ms, row.ttft_p99_ms) == (50.0, 900.0)
    assert (row.e2e_p50_ms, row.e2e_p99_ms) == (500.0, 900.0)
    assert row.at_least == ["ttft_p95_ms", "ttft_p99_ms", "e2e_p95_ms", "e2e_p99_ms"]
    assert row.tpot_p50_ms == pytest.approx(45.0)  # (0.1i - 0.01i) / 9 tokens, i = 1..8
    assert figure(row, "ttft_p99_ms") == ">=900"
    assert figure(row, "ttft_p50_ms") == "50"
    early_cut = summarize([*samples, sample(CUT, None, None, 0.015)], 2.0)
    assert "ttft_p50_ms" in early_cut.at_least  # a bound below the median: it moves
    assert summarize([], 1.0).ttft_p50_ms is None
    assert figure(summarize([], 1.0), "ttft_p50_ms") == "-"


def test_a_ratio_with_a_lower_bound_on_one_side_is_a_bound() -> None:
    assert bounded_ratio(10.0, True, 40.0, True) == (0.25, "=")
    assert bounded_ratio(10.0, True, 40.0, False) == (0.25, "<=")
    assert bounded_ratio(10.0, False, 40.0, True) == (0.25, ">=")
    assert bounded_ratio(10.0, False, 40.0, False) == (None, "")
    assert bounded_ratio(10.0, True, 0.0, True) == (None, "")
    assert bounded_ratio(None, True, 1.0, True) == (None, "")
    empty = summarize([], 1.0)
    a = replace(empty, output_tps=3000.0, ttft_p99_ms=50.0)
    b = replace(empty, output_tps=1000.0, ttft_p99_ms=5000.0, at_least=["ttft_p99_ms"])
    found = ratios(a, b)
    assert found["output_tps"] == Ratio(3.0, "=")
    assert found["ttft_p99_ms"] == Ratio(0.01, "<=")
    assert found["e2e_p50_ms"] == Ratio(None, "")  # neither has one
    assert [r.text() for r in found.values()][:2] == ["3.00x", "-"]
    assert found["ttft_p99_ms"].text() == "<=0.01x"


# -- rates, interleaving, counters ------------------------------------------------------------


def test_rates_are_shares_of_saturation_rounded_sorted_and_distinct() -> None:
    assert select_rates(35.24, (0.8, 0.2, 0.4)) == [7.0, 14.1, 28.2]
    assert select_rates(10.0, (0.5, 0.501, 0.001)) == [5.0]
    assert select_rates(0.0, (0.5,)) == []


def test_interleaving_sends_each_block_to_every_path_once_in_a_seeded_order() -> None:
    paths = [(p, f"http://{p}") for p in PATHS]
    route = interleave(paths, seed=3)
    n = len(PATHS)
    labels = [route(i)[0] for i in range(100 * n)]
    for block in range(100):
        assert sorted(labels[n * block : n * block + n]) == sorted(PATHS)
    assert [interleave(paths, 3)(i) for i in range(30)] == [route(i) for i in range(30)]
    assert labels != [interleave(paths, 4)(i)[0] for i in range(100 * n)]
    assert len({tuple(labels[i : i + n]) for i in range(0, 100 * n, n)}) > 1  # no fixed order
    assert fixed("static", "u")(7) == ("static", "u")


def snap(at: float, running: int = 0, **counters: float) -> Snapshot:
    return Snapshot(at, dict(counters), running)


def test_the_engine_work_between_two_reads_and_its_wasted_share() -> None:
    before = snap(10.0, iterations=100, slot_steps=6400, tokens=2000, sequences=5, busy_s=2.0)
    after = snap(12.0, iterations=200, slot_steps=12800, tokens=3600, sequences=25, busy_s=4.0)
    work = EngineWork.between(before, after)
    assert work.wasted_fraction == pytest.approx(0.75)  # 1600 tokens for 6400 slots
    summary = work.summary()
    assert summary.output_tps == 800.0
    assert summary.requests_per_s == 10.0
    assert summary.busy_fraction == 1.0
    assert summary.mean_batch == 64.0
    idle = EngineWork.between(before, before)
    assert idle.wasted_fraction is None
    assert idle.summary().output_tps is None


def test_a_static_batch_starts_where_the_running_count_jumps() -> None:
    assert batch_started(3, 64, 64)
    assert batch_started(0, 40, 64)
    assert not batch_started(60, 64, 64)  # continuous batching refilling a few slots
    assert not batch_started(40, 12, 64)  # sequences ending within a batch
    assert batch_started(0, 1, 1)


# -- the overhead target ----------------------------------------------------------------------


def median(found: Spread | None) -> float:
    assert found is not None
    return found.median


def overhead_row(
    direct: float,
    sidecar: float,
    both: float,
    bare: float = 0.0,
    bare2: float = 0.0,
    without: Sequence[str] = (),
) -> OverheadRound:
    """One round's TTFT p50 per path (p99: twice that); the bare proxies default to direct's;
    the paths ``without`` got no answer (no figure)."""
    empty = summarize([], 1.0)

    def figures(path: str, p50: float) -> StreamSummary:
        if path in without:
            return empty
        return replace(empty, ttft_p50_ms=p50, ttft_p99_ms=2 * p50)

    p50s = {
        DIRECT: direct,
        SIDECAR: sidecar,
        GATEWAY: both,
        BARE: bare or direct,
        BARE2: bare2 or direct,
    }
    return OverheadRound({p: figures(p, v) for p, v in p50s.items()}, 0.0)


def overhead_report(rows: list[OverheadRound], failed: int = 0) -> OverheadSummary:
    found = summarize_overhead(Overhead(16, 100, rows))
    return replace(found, failed=failed)


def test_the_paths_pair_each_modelroll_path_with_as_many_bare_hops() -> None:
    assert set(PATHS) == {DIRECT, SIDECAR, GATEWAY, BARE, BARE2}
    assert CEILINGS == {SIDECAR: BARE, GATEWAY: BARE2}
    assert Setup().overhead_rate == pytest.approx(60.0 * 5 / 3)  # 20 req/s per path, as before


def test_added_ttft_is_taken_round_by_round_and_judged_on_the_median() -> None:
    rows = [overhead_row(3.0, 3.4, 3.9), overhead_row(5.0, 5.2, 7.5), overhead_row(4.0, 4.1, 4.8)]
    found = added(rows, "ttft_p50_ms")
    assert set(found) == set(PATHS) - {DIRECT}
    assert found[GATEWAY] == Spread(median=0.9, low=0.8, high=2.5, rounds=3)
    assert found[SIDECAR] == Spread(median=0.2, low=0.1, high=0.4, rounds=3)
    [(target, met, measured)] = checks(overhead_report(rows))
    assert met
    assert "1 ms" in target
    assert measured.startswith("+0.90 ms")
    assert not checks(overhead_report(rows, failed=1))[0][1]  # a failed stream: not judged met
    rows[0] = overhead_row(3.0, 3.4, 4.2)
    rows[2] = overhead_row(4.0, 4.1, 5.1)
    assert not checks(overhead_report(rows))[0][1]
    assert checks(None) == []


def test_a_path_without_answers_has_no_added_figure_and_misses_the_target() -> None:
    # every stream of the second round failed on the gateway's path
    rows = [overhead_row(3.0, 3.4, 3.9), overhead_row(5.0, 5.2, 7.5, without=[GATEWAY])]
    assert added(rows, "ttft_p50_ms")[GATEWAY] == Spread(median=0.9, low=0.9, high=0.9, rounds=1)
    rows = [overhead_row(3.0, 3.4, 3.9, without=[GATEWAY])] * 2
    assert added(rows, "ttft_p50_ms")[GATEWAY] is None
    [(_, met, measured)] = checks(overhead_report(rows, failed=40))
    assert not met
    assert measured.startswith("- ms")
    [(_, info)] = informational(overhead_report(rows))
    assert info.startswith("p50 - ms")


def test_the_cost_beyond_bare_hops_is_taken_round_by_round_against_as_many_hops() -> None:
    # the same round's bare proxies: one hop +0.5 .. +1.5 ms, two hops +1.0 .. +3.0 ms
    rows = [
        overhead_row(3.0, 4.0, 4.5, bare=3.5, bare2=4.0),
        overhead_row(5.0, 7.0, 8.5, bare=6.5, bare2=8.0),
        overhead_row(4.0, 5.5, 6.0, bare=5.0, bare2=5.0),
    ]
    p50 = beyond_bare(rows, "ttft_p50_ms")
    assert set(p50) == {SIDECAR, GATEWAY}
    assert p50[SIDECAR] == Spread(median=0.5, low=0.5, high=0.5, rounds=3)
    assert p50[GATEWAY] == Spread(median=0.5, low=0.5, high=1.0, rounds=3)
    assert median(beyond_bare(rows, "ttft_p99_ms")[GATEWAY]) == pytest.approx(1.0)
    # not the difference of the medians over rounds: added 2.0 (gateway) - 1.0 (two bare hops)
    assert median(difference(rows, "ttft_p50_ms", GATEWAY, DIRECT)) == 2.0
    assert median(difference(rows, "ttft_p50_ms", BARE2, DIRECT)) == 1.0
    report = overhead_report(rows)
    # the target is judged over direct, whatever the bare hops cost; the floor is shown beside
    [(_, met, measured)] = checks(report)
    assert not met
    assert measured.startswith("+2.00 ms")
    assert "two bare aiohttp hops +1.00 ms" in measured
    [(what, info)] = informational(report)
    assert "two bare aiohttp hops" in what
    assert info.startswith("p50 +0.50 (+0.50..+1.00) ms, p99 +1.00")
    assert info.endswith("one hop (sidecar - bare proxy): +0.50 ms")
    assert informational(None) == []


def test_the_overhead_lines_and_table_show_every_path() -> None:
    row = overhead_row(3.0, 4.0, 4.5, bare=3.5, bare2=4.0)
    line = overhead_line(1, row, PATHS)
    assert "direct TTFT p50 3.0 ms" in line
    assert "bare proxy +0.50/+1.00, sidecar +1.00/+2.00" in line
    assert "bare proxy x2 +1.00/+2.00, gateway+sidecar +1.50/+3.00" in line
    found = overhead_report([row, row])
    setup = replace(Setup(), parts=("overhead",))
    measured = Measured(overhead=Overhead(16, 100, [row, row]))
    assert results.from_json(Measured, results.to_json(measured)) == measured  # --from
    summary = summarize_run(setup, measured)
    assert summary.overhead == found
    out = render(setup, summary)
    table = {
        cells[0]: cells[1:]
        for line in out.splitlines()
        if (cells := re.split(r"\s{2,}", line.strip()))[0] in PATHS
    }
    assert "beyond bare p50" in out
    assert table[DIRECT] == ["3.00", "-", "6.00"]  # p95 not given
    assert table[BARE][3:] == ["+0.50 (+0.50..+0.50)", "+1.00 (+1.00..+1.00)"]
    assert table[GATEWAY][3:] == [
        "+1.50 (+1.50..+1.50)",
        "+3.00 (+3.00..+3.00)",
        "+0.50 (+0.50..+0.50)",
        "+1.00 (+1.00..+1.00)",
    ]
    assert "For information (no target)" in out


def test_quick_and_flags_override_the_defaults_field_by_field() -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert setup_from(parser.parse_args([])) == Setup()
    quick = setup_from(parser.parse_args(["--quick", "--shares", "0.5", "--max-seqs", "8"]))
    assert quick.duration_s == QUICK.duration_s
    assert quick.shares == (0.5,)
    assert quick.engine == EngineSetup(max_seqs=8)
    assert quick.concurrency == 16
    assert setup_from(parser.parse_args(["--parts", "overhead"])).parts == ("overhead",)
    with pytest.raises(SystemExit):
        parser.parse_args(["--parts", "everything"])


# -- against a real engine --------------------------------------------------------------------


@pytest.mark.parametrize("scheduler", ["continuous", "static"])
async def test_a_short_run_counts_what_the_demo_engine_counts(scheduler: str) -> None:
    """Every stream answered; the clients' output tokens are the engine's; slots wasted on
    finished sequences: none with continuous batching, some with static batches (outputs of 1
    to 12 tokens, batches that outlast several arrivals)."""
    port = free_port()
    cost = EngineSetup(
        step_ms=5.0, step_ms_per_seq=0.0, prefill_ms_per_token=0.0, output_mu=1.5, max_seqs=8
    )
    body = chat_bodies(prompts(40, 8), "chat", max_tokens=12)
    async with (
        serve_module("modelroll_standins.llm", cost.args(scheduler, port), port) as engine,
        aiohttp.ClientSession() as http,
    ):
        before = await read_stats(http, engine.url)
        url = engine.url + "/v1/chat/completions"
        run = await open_streams(fixed(scheduler, url), body, 60.0, 0.5, seed=2, drain_s=5.0)
        after = await read_stats(http, engine.url)
    assert len(run.samples) > 10
    assert all(s.outcome == OK for s in run.samples)
    for s in run.samples:
        assert s.ttft_s is not None
        assert s.e2e_s is not None
        assert 0 < s.ttft_s <= s.e2e_s
        assert 1 <= s.output_tokens <= 12
    work = EngineWork.between(before, after)
    assert work.tokens == sum(s.output_tokens for s in run.samples)
    assert work.sequences == len(run.samples)
    if scheduler == "continuous":
        assert work.wasted_fraction == 0
    else:
        assert work.wasted_fraction is not None
        assert work.wasted_fraction > 0


async def test_two_bare_proxies_pass_the_engine_streams_through_unchanged() -> None:
    """Client -> bare proxy -> bare proxy -> engine: every stream answered, with the tokens the
    engine counted; an answer is the engine's own, event for event (ids and times aside)."""
    eport, inner_port, outer_port = free_port(), free_port(), free_port()
    cost = EngineSetup(step_ms=2.0, step_ms_per_seq=0.0, prefill_ms_per_token=0.0, output_mu=1.5)
    body = chat_bodies(prompts(20, 8), "chat", max_tokens=8)
    async with (
        serve_module("modelroll_standins.llm", cost.args("continuous", eport), eport) as e,
        bare_proxy(e.url, inner_port) as inner,
        bare_proxy(inner.url, outer_port) as outer,
        aiohttp.ClientSession() as http,
    ):
        before = await read_stats(http, e.url)
        url = outer.url + "/v1/chat/completions"
        run = await open_streams(fixed(BARE2, url), body, 40.0, 0.5, seed=3, drain_s=5.0)
        after = await read_stats(http, e.url)
        answers = []
        for target in (e.url, outer.url):
            async with http.post(target + "/v1/chat/completions", data=body(0)) as resp:
                assert resp.status == 200
                assert resp.content_type == "text/event-stream"
                answers.append(_without_ids(await resp.read()))
    assert len(run.samples) > 5
    assert all(s.outcome == OK for s in run.samples)
    assert EngineWork.between(before, after).tokens == sum(s.output_tokens for s in run.samples)
    assert answers[0] == answers[1]


def _without_ids(raw: bytes) -> list[Any]:
    """An answer's events, without what differs from one call to the next (id, created)."""
    events: list[Any] = []
    for line in raw.decode().splitlines():
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        data = json.loads(line.removeprefix("data: "))
        events.append({k: v for k, v in data.items() if k not in ("id", "created")})
    return events
