"""The two variants' sentence vectors: unit length, in agreement, meaningful, and independent of
the batch a sentence is padded in."""

from __future__ import annotations

import numpy as np
import pytest

from modelroll_models.encoder import Encoder

SENTENCES = [
    "A man is eating food.",
    "The new release cut the median response time of the search page by a third.",
    "Kubernetes restarts a container whose liveness probe keeps failing.",
    "",
    "naïve café résumé, 東京 and emoji 🙂 survive the tokenizer",
]

PARAPHRASE = ("A man is eating food.", "A man is eating a piece of bread.")
UNRELATED = "The stock market fell sharply at the opening bell."


@pytest.fixture(params=["int8", "fp32"])
def encoder(request: pytest.FixtureRequest) -> Encoder:
    loaded: Encoder = request.getfixturevalue(request.param)
    return loaded


def test_variants_agree_and_give_unit_vectors(int8: Encoder, fp32: Encoder) -> None:
    a, b = int8.encode(SENTENCES), fp32.encode(SENTENCES)
    assert a.shape == b.shape == (len(SENTENCES), 384)
    assert a.dtype == b.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(a, axis=1), 1.0, atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(b, axis=1), 1.0, atol=1e-5)
    cosines = (a * b).sum(axis=1)
    assert cosines.min() > 0.99, cosines


def test_a_paraphrase_is_closer_than_an_unrelated_sentence(encoder: Encoder) -> None:
    first, paraphrase, unrelated = encoder.encode([*PARAPHRASE, UNRELATED])
    close, far = float(first @ paraphrase), float(first @ unrelated)
    assert close > 0.6
    assert far < 0.3
    assert close > far + 0.4


def test_padding_in_a_batch_leaves_a_vector_unchanged(encoder: Encoder) -> None:
    short = "Padding must not leak into the mean."
    batch = [short, " ".join(["a long neighbour forces padding"] * 12)]
    tokens = encoder.tokenize(batch)
    assert tokens.attention_mask[0].sum() < tokens.input_ids.shape[1] / 4  # padded threefold
    alone = encoder.encode([short])[0]
    padded = encoder.encode_tokens(tokens)[0]
    np.testing.assert_allclose(padded, alone, atol=1e-4)


def test_long_inputs_are_truncated_at_256_tokens(int8: Encoder) -> None:
    long, longer = "word " * 400, "word " * 800
    assert int8.tokenize([long]).input_ids.shape == (1, 256)
    a, b = int8.encode([long, longer])
    np.testing.assert_allclose(a, b, atol=1e-6)
