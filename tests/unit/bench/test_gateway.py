"""The gateway suite's summary, tables and targets, from measurements made up here (nothing here
is timed)."""

from __future__ import annotations

import pytest

from modelroll_bench.figures import LoadSummary, Rate
from modelroll_bench.gateway import (
    LatencyRound,
    Measured,
    RateRound,
    Setup,
    checks,
    render,
    summarize,
)
from modelroll_bench.results import from_json, to_json
from modelroll_bench.stats import Spread

SETUP = Setup(rounds=3, event_loops=("uvloop",))
PLAIN, STICKY, SHADOWED = "gateway/uvloop", "gateway/uvloop sticky", "gateway/uvloop shadow"


def load(p50: float, p99: float, errors: int = 0) -> LoadSummary:
    failed = {"502": errors} if errors else {}
    return LoadSummary("x", 200.0, 200.0, 800, 800 - errors, failed, p50, p50 + 1, p99)


def latency_round(direct: float, plain: float, sticky: float, errors: int = 0) -> LatencyRound:
    return LatencyRound(
        {
            "direct": load(direct, direct + 2),
            PLAIN: load(plain, plain + 2),
            STICKY: load(sticky, sticky + 3),
            SHADOWED: load(plain, plain + 2, errors),
        }
    )


def rate_round(echo: float, gateway: float) -> RateRound:
    return RateRound({"echo/uvloop": Rate(echo, 60.0), PLAIN: Rate(gateway, 110.0)})


def measured(shadow_errors: int = 0) -> Measured:
    return Measured(
        latency=[
            latency_round(1.0, 1.5, 1.6),
            latency_round(2.0, 2.2, 2.4, shadow_errors),
            latency_round(1.0, 2.0, 2.0),
        ],
        rate=[rate_round(20_000, 12_000), rate_round(30_000, 15_000), rate_round(25_000, 10_000)],
    )


def test_what_each_arm_adds_is_taken_round_by_round() -> None:
    summary = summarize(SETUP, measured())
    assert [o.arm for o in summary.added] == [PLAIN, STICKY, SHADOWED]
    assert summary.added[0].p50_ms == Spread(median=0.5, low=0.2, high=1.0, rounds=3)
    assert summary.sticky.p50_ms == Spread(median=0.1, low=0.0, high=0.2, rounds=3)
    assert summary.sticky.p99_ms == Spread(median=1.1, low=1.0, high=1.2, rounds=3)
    [rate] = summary.rates
    assert rate.of_ceiling.by_round == [0.6, 0.5, 0.4]
    assert rate.rps == Spread(median=12_000, low=10_000, high=15_000, rounds=3)


def test_the_targets_are_judged_on_the_medians_of_paired_rounds() -> None:
    met = {t: ok for t, ok, _ in checks(SETUP, summarize(SETUP, measured()))}
    assert met == {
        "added p50 <= 1 ms at 200 req/s (uvloop)": True,
        "one gateway process (uvloop) >= 50% of a bare aiohttp echo server's rate (same loop)": (
            True
        ),
        "sticky cohorts add <= 0.25 ms p50 over the weighted round robin (same rounds)": True,
        "10% shadow traffic to a 10 ms model failing half its items adds <= 0.25 ms p50 and no "
        "client error (same rounds)": True,
    }
    shadowed = checks(SETUP, summarize(SETUP, measured(shadow_errors=2)))[3]
    assert not shadowed[1]
    assert shadowed[2].endswith("client errors 2")


def test_the_tables_show_every_arm() -> None:
    text = render(SETUP, summarize(SETUP, measured()))
    assert "| uvloop | +0.50 ms (+0.20..+1.00) |" in text
    assert "| sticky cohorts | +0.10 ms (+0.00..+0.20) | +1.10 ms (+1.00..+1.20) | 0 |" in text
    assert (
        "| gateway/uvloop against echo/uvloop | 12000 | 25000 | 50.0% (rounds 40.0%..60.0%) |"
        in (text)
    )


def test_the_measurements_read_back_from_their_json() -> None:
    found = measured()
    assert from_json(Measured, to_json(found)) == found


@pytest.mark.parametrize("rounds", [[], [latency_round(1.0, 1.5, 1.6)]])
def test_an_added_figure_needs_a_round(rounds: list[LatencyRound]) -> None:
    summary = summarize(SETUP, Measured(rounds, [rate_round(1.0, 1.0)]))
    assert (summary.added[0].p50_ms is None) is (not rounds)
