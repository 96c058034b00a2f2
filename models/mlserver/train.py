"""Train the scikit-learn models MLServer serves in the tests and `make bench-oip`, with a fixed
seed, into a model repository: one folder per model with its model.joblib, its
model-settings.json (MLServer's, adaptive batching off) and samples.json (inputs and the model's
own predictions, for a test to compare with what MLServer answers).

Run with MLServer's virtualenv (`make mlserver`), which has scikit-learn; needs no network:

    .venv-mlserver/bin/python models/mlserver/train.py OUT_DIR

- ``digits``: a random forest of 50 trees on scikit-learn's 8x8 digits; input ``pixels`` FP32
  [-1, 64] (values 0 to 16), output ``predict`` INT64 [-1, 1], the digit. Its cost is per call
  more than per row (each tree is walked once per call), as a GPU model's is.
- ``sentiment``: a TF-IDF and logistic regression pipeline on a small built-in corpus; input
  ``text`` BYTES [-1, 1] (MLServer decodes it to strings: content_type "str"), output
  ``predict`` BYTES [-1, 1], "positive" or "negative".
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import joblib
import numpy as np
from sklearn.datasets import load_digits
from sklearn.ensemble import RandomForestClassifier
from sklearn.feature_extraction.text import TfidfVectorizer
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import Pipeline

SEED = 0
SAMPLES = 16
"""Rows of each model's samples.json."""

POSITIVE = [
    "a wonderful film with a warm heart",
    "great acting and a clever story",
    "I loved every minute of it",
    "the best meal I have had in years",
    "friendly staff and excellent service",
    "beautiful music and a happy ending",
    "a delightful surprise, highly recommended",
    "fast delivery and the product works perfectly",
    "brilliant, funny and moving",
    "the hotel was clean, quiet and lovely",
    "an excellent book that I will read again",
    "superb quality for a fair price",
]
NEGATIVE = [
    "a dull film with a weak plot",
    "terrible acting and a boring story",
    "I hated every minute of it",
    "the worst meal I have had in years",
    "rude staff and awful service",
    "noisy music and a sad, pointless ending",
    "a disappointing mess, not recommended",
    "late delivery and the product broke at once",
    "tedious, slow and badly written",
    "the hotel was dirty, loud and cold",
    "a poor book that I could not finish",
    "cheap quality for a high price",
]
SENTIMENT_SAMPLES = [
    "a clever and moving story",
    "awful service and a dirty room",
    "I loved the music",
    "boring, slow and badly acted",
]


def model_settings(
    name: str, inputs: list[dict[str, Any]], outputs: list[dict[str, Any]]
) -> dict[str, Any]:
    """MLServer's model-settings.json for a joblib file beside it, adaptive batching off."""
    return {
        "name": name,
        "implementation": "mlserver_sklearn.SKLearnModel",
        "parameters": {"uri": "./model.joblib", "version": "v1"},
        "inputs": inputs,
        "outputs": outputs,
        "max_batch_size": 0,
        "max_batch_time": 0.0,
    }


def save(folder: Path, model: Any, settings: dict[str, Any], samples: Any) -> None:
    """Write the model, its settings and its predictions for ``samples`` (the rows of one
    input tensor) into ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    joblib.dump(model, folder / "model.joblib")
    (folder / "model-settings.json").write_text(json.dumps(settings, indent=2) + "\n")
    inputs = samples.tolist() if isinstance(samples, np.ndarray) else samples
    record = {"inputs": inputs, "predict": model.predict(samples).tolist()}
    (folder / "samples.json").write_text(json.dumps(record) + "\n")


def train_digits(out: Path) -> None:
    pixels, digits = load_digits(return_X_y=True)
    pixels = pixels.astype(np.float32)
    forest = RandomForestClassifier(n_estimators=50, random_state=SEED).fit(pixels, digits)
    settings = model_settings(
        "digits",
        [{"name": "pixels", "datatype": "FP32", "shape": [-1, 64]}],
        [{"name": "predict", "datatype": "INT64", "shape": [-1, 1]}],
    )
    rows = np.random.default_rng(SEED).choice(len(pixels), SAMPLES, replace=False)
    save(out / "digits", forest, settings, pixels[rows])


def train_sentiment(out: Path) -> None:
    texts = POSITIVE + NEGATIVE
    labels = ["positive"] * len(POSITIVE) + ["negative"] * len(NEGATIVE)
    pipeline = Pipeline(
        [("tfidf", TfidfVectorizer()), ("classify", LogisticRegression(random_state=SEED))]
    ).fit(texts, labels)
    text_tensor = {"datatype": "BYTES", "shape": [-1, 1], "parameters": {"content_type": "str"}}
    settings = model_settings(
        "sentiment",
        [{"name": "text", **text_tensor}],
        [{"name": "predict", **text_tensor}],
    )
    save(out / "sentiment", pipeline, settings, SENTIMENT_SAMPLES)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="the model repository to write")
    out = parser.parse_args().out
    train_digits(out)
    train_sentiment(out)


if __name__ == "__main__":
    main()
