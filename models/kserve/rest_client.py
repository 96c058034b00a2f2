"""KServe's own REST client (``kserve.InferenceRESTClient``, the Open Inference Protocol) sending
rows of the digits model's 64 pixels, read as a JSON list of rows from stdin, to a server's
``/v2/models/{model}/infer``, as a KServe user's application does. Prints what it read as JSON:
``model_name``, ``id`` and ``predict`` (the digits) of the response (KServe's client does not
read its ``model_version``), and ``version``, the X-Modelroll-Version header a modelroll gateway
answers with (None from another server).

Run with KServe's virtualenv (`make kserve`):

    echo '[[0, 0, 5, ...]]' | .venv-kserve/bin/python models/kserve/rest_client.py URL MODEL
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys

import numpy as np
from kserve import InferenceRESTClient, InferInput, InferRequest, RESTConfig


async def infer(url: str, model: str, pixels: np.ndarray) -> dict[str, object]:
    tensor = InferInput(name="pixels", shape=list(pixels.shape), datatype="FP32")
    tensor.set_data_from_numpy(pixels, binary_data=False)
    request = InferRequest(model_name=model, infer_inputs=[tensor], request_id="kserve-client")
    client = InferenceRESTClient(RESTConfig(protocol="v2", retries=0))
    headers: dict[str, str] = {}
    try:
        response = await client.infer(url, request, model_name=model, response_headers=headers)
    finally:
        await client.close()
    return {
        "model_name": response.model_name,
        "id": response.id,
        "predict": response.get_output_by_name("predict").as_numpy().ravel().tolist(),
        "version": headers.get("x-modelroll-version"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("url", help="the server, e.g. http://127.0.0.1:8080")
    parser.add_argument("model", help="the model's name in the request path")
    args = parser.parse_args()
    pixels = np.asarray(json.load(sys.stdin), dtype=np.float32)
    print(json.dumps(asyncio.run(infer(args.url, args.model, pixels))))


if __name__ == "__main__":
    main()
