"""Smooth weighted round-robin: exact shares in every cycle, interleaved, zero weights skipped."""

from __future__ import annotations

from collections import Counter

import pytest

from modelroll_gateway.wrr import SmoothWeightedPicker


def test_nine_to_one_gives_exactly_nine_of_every_ten() -> None:
    picker = SmoothWeightedPicker([("stable", 9), ("canary", 1)])
    picks = [picker.pick() for _ in range(1000)]
    for start in range(0, 1000, 10):
        assert Counter(picks[start : start + 10]) == {"stable": 9, "canary": 1}


def test_picks_are_interleaved_not_bunched() -> None:
    picker = SmoothWeightedPicker([("a", 5), ("b", 5)])
    assert [picker.pick() for _ in range(6)] == ["a", "b", "a", "b", "a", "b"]
    picker = SmoothWeightedPicker([("a", 2), ("b", 1)])
    assert [picker.pick() for _ in range(6)] == ["a", "b", "a", "a", "b", "a"]


@pytest.mark.parametrize("weights", [(1, 2, 3), (7, 0, 3), (1000, 1), (1, 1, 1, 1)])
def test_every_cycle_matches_the_weights(weights: tuple[int, ...]) -> None:
    items = [(f"v{i}", w) for i, w in enumerate(weights)]
    picker = SmoothWeightedPicker(items)
    total = sum(weights)
    counts = Counter(picker.pick() for _ in range(total * 3))
    assert counts == {name: 3 * w for name, w in items if w > 0}


def test_nothing_routable_is_falsy_and_raises() -> None:
    for picker in (SmoothWeightedPicker([("a", 0)]), SmoothWeightedPicker[str]([])):
        assert not picker
        with pytest.raises(LookupError):
            picker.pick()
    assert SmoothWeightedPicker([("a", 0), ("b", 1)])
