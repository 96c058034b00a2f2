"""The digits model of models/mlserver/train.py served by KServe's own Python model server, as a
team serving its own scikit-learn model writes it: a ``kserve.Model`` subclass that loads the
model, answers the Open Inference Protocol's infer calls and declares its tensors, started by
``kserve.ModelServer`` with KServe's own command line.

Run with KServe's virtualenv (`make kserve`):

    .venv-kserve/bin/python models/kserve/digits.py --model_dir DIR --model_name digits \
        --http_port 8080 --enable_grpc false

``DIR`` holds the model.joblib train.py saved. Input ``pixels`` FP32 [-1, 64], output
``predict`` INT64 [-1, 1], the digit, as MLServer serves the same model.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import joblib
import kserve
import numpy as np
from kserve import InferOutput, InferRequest, InferResponse
from kserve.utils.utils import generate_uuid


class Digits(kserve.Model):
    """A random forest's digits for rows of 64 pixels."""

    def __init__(self, name: str, model_dir: Path) -> None:
        super().__init__(name)
        self.model_dir = model_dir
        self.forest: Any = None
        self.load()

    def load(self) -> bool:
        self.forest = joblib.load(self.model_dir / "model.joblib")
        self.ready = True
        return self.ready

    def get_input_types(self) -> list[dict[str, Any]]:
        return [{"name": "pixels", "datatype": "FP32", "shape": [-1, 64]}]

    def get_output_types(self) -> list[dict[str, Any]]:
        return [{"name": "predict", "datatype": "INT64", "shape": [-1, 1]}]

    def predict(
        self, payload: InferRequest, headers: dict[str, str] | None = None
    ) -> InferResponse:
        pixels = payload.get_input_by_name("pixels").as_numpy()
        digits = self.forest.predict(pixels).astype(np.int64).reshape(-1, 1)
        output = InferOutput(name="predict", shape=list(digits.shape), datatype="INT64")
        output.set_data_from_numpy(digits, binary_data=False)
        response_id = payload.id or generate_uuid()  # KServe's response needs an id
        return InferResponse(response_id=response_id, model_name=self.name, infer_outputs=[output])


def main() -> None:
    parser = argparse.ArgumentParser(parents=[kserve.model_server.parser])
    parser.add_argument("--model_dir", type=Path, required=True, help="holds model.joblib")
    args, _ = parser.parse_known_args()
    kserve.ModelServer().start([Digits(args.model_name, args.model_dir)])


if __name__ == "__main__":
    main()
