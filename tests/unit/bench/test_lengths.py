"""Length distributions, the payloads that carry them, and the demo model's limit under them."""

from __future__ import annotations

import math
import statistics

import pytest

from modelroll_bench.lengths import CostModel, Lengths, parse, payload
from modelroll_sidecar.protocol import payload_length


@pytest.mark.parametrize(
    ("spec", "kind", "params"),
    [
        ("fixed:16", "fixed", (16.0,)),
        ("uniform:1,64", "uniform", (1.0, 64.0)),
        ("lognormal:3,0.7", "lognormal", (3.0, 0.7)),
        ("lognormal:3,0.7,256", "lognormal", (3.0, 0.7, 256.0)),
        ("bimodal:8,128,0.1", "bimodal", (8.0, 128.0, 0.1)),
    ],
)
def test_specs_parse_and_round_trip(spec: str, kind: str, params: tuple[float, ...]) -> None:
    lengths = parse(spec)
    assert (lengths.kind, lengths.params) == (kind, params)
    assert parse(lengths.spec) == lengths


@pytest.mark.parametrize(
    ("spec", "reason"),
    [
        ("normal:3,1", "unknown length distribution"),
        ("fixed", "takes 1 parameters"),
        ("uniform:1", "takes 2 parameters"),
        ("lognormal:1,2,3,4", "takes 2 or 3 parameters"),
        ("fixed:abc", "must be numbers"),
        ("fixed:0", "at least 1"),
        ("fixed:2.5", "whole numbers"),
        ("uniform:9,3", "LO must not exceed HI"),
        ("lognormal:3,-1", "SIGMA must not be negative"),
        ("bimodal:8,128,1.5", "P must be between 0 and 1"),
    ],
)
def test_bad_specs_say_why(spec: str, reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        parse(spec)


def test_the_same_seed_gives_the_same_lengths() -> None:
    lengths = parse("lognormal:3,0.7")
    assert lengths.sample(500, seed=7) == lengths.sample(500, seed=7)
    assert lengths.sample(500, seed=7) != lengths.sample(500, seed=8)


def test_fixed_and_uniform_stay_in_their_range() -> None:
    assert set(parse("fixed:16").sample(100)) == {16}
    drawn = parse("uniform:3,9").sample(5000)
    assert min(drawn) == 3
    assert max(drawn) == 9


def test_lognormal_has_its_median_and_respects_its_cap() -> None:
    drawn = parse("lognormal:3,0.7").sample(20_000)
    assert statistics.median(drawn) == pytest.approx(math.exp(3), rel=0.05)
    assert min(drawn) >= 1
    capped = parse("lognormal:3,0.7,40").sample(20_000)
    assert max(capped) == 40


def test_bimodal_draws_long_with_its_probability() -> None:
    drawn = parse("bimodal:8,128,0.2").sample(20_000)
    assert set(drawn) == {8, 128}
    assert drawn.count(128) / len(drawn) == pytest.approx(0.2, abs=0.015)


@pytest.mark.parametrize("n", [1, 2, 17, 300])
def test_a_payload_is_as_long_as_the_sidecar_counts_it(n: int) -> None:
    assert payload_length(payload(n)) == n


def test_batch_cost_pads_to_the_longest() -> None:
    cost = CostModel(fixed_ms=10, per_token_ms=0.5)
    assert cost.batch_ms([1, 1, 8]) == 10 + 0.5 * 3 * 8


def test_limit_with_fixed_lengths_is_the_closed_form() -> None:
    cost = CostModel(fixed_ms=20, per_token_ms=0.05, parallel=2)
    full_batch_s = (20 + 0.05 * 32 * 16) / 1000
    assert cost.limit_rps(parse("fixed:16"), 32, trials=10) == pytest.approx(2 * 32 / full_batch_s)


def test_limit_with_random_lengths_charges_the_longest_of_each_batch() -> None:
    """Padding makes a batch of random lengths cost more than one of the mean length."""
    cost = CostModel(fixed_ms=10, per_token_ms=0.02)
    lengths = parse("lognormal:3,0.7")
    mean_length = statistics.mean(lengths.sample(20_000))
    at_mean = cost.limit_rps(parse(f"fixed:{round(mean_length)}"), 32, trials=10)
    limit = cost.limit_rps(lengths, 32, trials=4000, seed=3)
    assert limit < 0.7 * at_mean
    assert limit == cost.limit_rps(lengths, 32, trials=4000, seed=3)


def test_padding_makes_the_limit_peak_at_a_batch_size() -> None:
    """With these costs a bigger batch stops paying for itself."""
    cost = CostModel(fixed_ms=10, per_token_ms=0.02)
    lengths = parse("lognormal:3,0.7")
    limits = {b: cost.limit_rps(lengths, b, trials=3000) for b in (1, 16, 64)}
    assert limits[16] > limits[64] > limits[1]


def test_lengths_is_a_plain_value() -> None:
    assert Lengths("fixed", (4.0,)) == parse("fixed:4")


def test_limit_of_a_finite_sample_draws_from_it() -> None:
    """The bodies a benchmark sends are a finite sample: its limit is computed from them."""
    cost = CostModel(fixed_ms=10, per_token_ms=0.02)
    assert cost.limit_rps([16] * 50, 32, trials=10) == cost.limit_rps(
        parse("fixed:16"), 32, trials=10
    )
    lengths = parse("lognormal:3,0.7")
    short_tail = [n for n in lengths.sample(2000) if n <= 60]
    assert cost.limit_rps(short_tail, 32, trials=2000) > cost.limit_rps(lengths, 32, trials=2000)
