"""The cost fit behind ``batch_cost --fit``: its sentences are as many tokens as words, and its
line goes through points that lie on one."""

from __future__ import annotations

import pytest

from modelroll_models.batch_cost import FIT_WORDS, least_squares, sentence_of
from modelroll_models.encoder import Encoder


@pytest.mark.parametrize("words", FIT_WORDS)
def test_a_fit_sentence_is_one_wordpiece_token_per_word(int8: Encoder, words: int) -> None:
    text = sentence_of(words)
    assert len(text.split()) == words
    # The words, the final full stop, [CLS] and [SEP].
    assert int8.tokenize([text]).useful == words + 3


def test_the_least_squares_line_of_points_on_a_line_is_that_line() -> None:
    xs = [1.0, 4.0, 9.0, 30.0]
    fixed, per, r2 = least_squares(xs, [5.0 + 0.25 * x for x in xs])
    assert (fixed, per, r2) == pytest.approx((5.0, 0.25, 1.0))
    _, _, noisy = least_squares(xs, [6.0, 6.0, 7.0, 12.0])
    assert noisy < 1.0
