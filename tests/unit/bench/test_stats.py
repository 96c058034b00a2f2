"""The one percentile and the one spread every suite reports with (nothing here is timed)."""

from __future__ import annotations

import math

import pytest

from modelroll_bench.stats import Spread, paired_ratios, percentile, rank_index, spread


def test_nearest_rank_percentiles() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 0.50) == 50
    assert percentile(values, 0.95) == 95
    assert percentile(values, 0.99) == 99
    assert percentile(values, 1.0) == 100


def test_a_percentile_is_a_measured_value_whatever_the_order() -> None:
    assert percentile([4.0, 1.0, 3.0, 2.0], 0.5) == 2.0  # not 2.5: no interpolation
    assert percentile([0.07 * k for k in range(100, 0, -1)], 0.07) == pytest.approx(0.49)


def test_percentiles_of_few_samples_take_the_largest_for_the_tail() -> None:
    assert percentile([3.0], 0.99) == 3.0
    assert percentile([1.0, 2.0], 0.5) == 1.0
    assert percentile([float(v) for v in range(20)], 0.99) == 19.0


@pytest.mark.parametrize("q", [0.0, 0.001])
def test_the_lowest_percentiles_are_the_minimum(q: float) -> None:
    assert percentile([5.0, 6.0, 7.0], q) == 5.0


def test_a_value_never_reached_sorts_last() -> None:
    assert percentile([1.0, math.inf, 2.0], 0.99) == math.inf
    assert percentile([1.0, math.inf, 2.0], 0.5) == 2.0


def test_no_values_have_no_percentile_and_no_spread() -> None:
    assert percentile([], 0.5) is None
    assert spread([]) is None
    assert spread([None, None]) is None
    with pytest.raises(ValueError, match="0 values"):
        rank_index(0, 0.5)


def test_a_spread_is_the_median_and_range_of_the_rounds_that_have_a_value() -> None:
    assert spread([10.0, None, 12.0, 11.0]) == Spread(median=11.0, low=10.0, high=12.0, rounds=3)
    assert spread([1.0, 2.0]) == Spread(median=1.5, low=1.0, high=2.0, rounds=2)
    assert spread([1 / 3, 2 / 3], digits=2) == Spread(median=0.5, low=0.33, high=0.67, rounds=2)


def test_ratios_pair_rounds_and_skip_missing_ones() -> None:
    assert paired_ratios([2.0, None, 9.0, 4.0], [1.0, 1.0, 3.0, 0.0]) == [2.0, 3.0]
