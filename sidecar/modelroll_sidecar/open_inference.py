"""The sidecar in ``--protocol openinference`` mode: in front of a model server that speaks the
Open Inference Protocol (KServe's "v2": MLServer, KServe's Python runtimes, Triton, OpenVINO
Model Server), under its name for the model, ``--served-model-name``.

A batch of infer requests (:class:`~modelroll_sidecar.tensors.InferRequest`, all of one key) is
one ``POST /v2/models/{served}/infer``, each input tensor concatenated along its first dimension;
the answer's outputs are split back along it, each request getting its own rows, in the
protocol's response shape with its own ``id``. Readiness is the server's ``GET /v2/health/ready``
and the model's ``GET /v2/models/{served}/ready``; once both answer 200, the model's metadata
(``GET /v2/models/{served}``) is read and checked, once: the server serves the model under that
name, and each input it declares has a batch dimension (-1) first.
"""

from __future__ import annotations

import logging
from typing import Any

import aiohttp

from modelroll_common.sse import AnswerTooLarge, read_whole

from .protocol import BatchResult, ModelClient, ModelFailed, decode, encode
from .tensors import InferRequest, Tensor, concatenated, model_outputs

log = logging.getLogger(__name__)

HEALTH_READY = "/v2/health/ready"
MAX_METADATA_BYTES = 1 << 20


def model_path(served: str) -> str:
    return f"/v2/models/{served}"


class OpenInferenceModel:
    """The batcher's model for ``--protocol openinference``, and the probe of its readiness."""

    def __init__(self, client: ModelClient, served: str, model: str, version: str) -> None:
        self._client = client
        self.served = served
        self._model = model
        self._version = version
        self.metadata: dict[str, Any] | None = None
        """The model's metadata once read and found fit to batch."""
        self.problem = "not probed yet"
        """Why the model is not ready, for the sidecar's /readyz."""

    async def infer(self, inputs: list[Any]) -> BatchResult:
        requests: list[InferRequest] = inputs
        first = requests[0]
        if any(request.key != first.key for request in requests):
            raise ModelFailed("a batch mixed infer requests that cannot share a model call")
        body: dict[str, Any] = {
            "inputs": [
                concatenated([request.inputs[i] for request in requests])
                for i in range(len(first.inputs))
            ]
        }
        if first.parameters:
            body["parameters"] = first.parameters
        if first.outputs is not None:
            body["outputs"] = list(first.outputs)
        rows = sum(request.rows for request in requests)
        raw = await self._client.post(model_path(self.served) + "/infer", encode(body))
        try:
            outputs = model_outputs(decode(raw), rows)
        except ValueError as exc:  # BadTensor, or JSON that is not
            raise ModelFailed(f"the model's answer cannot be split: {exc}") from exc
        if first.outputs is not None:
            _check_requested(outputs, first.outputs)
        answers: list[Any] = []
        start = 0
        for request in requests:
            answers.append(self._answer(request, outputs, start))
            start += request.rows
        return BatchResult(answers, [None] * len(requests))

    def _answer(self, request: InferRequest, outputs: list[Tensor], start: int) -> dict[str, Any]:
        """``request``'s response: its own rows of each output, from row ``start``."""
        answer: dict[str, Any] = {"model_name": self._model, "model_version": self._version}
        if request.id is not None:
            answer["id"] = request.id
        answer["outputs"] = [tensor.rows_of(start, request.rows) for tensor in outputs]
        return answer

    async def ready(self, timeout_s: float) -> bool:
        """Whether the server and the model answer ready now and the model's metadata has been
        read and found fit; otherwise ``problem`` says why not."""
        timeout = aiohttp.ClientTimeout(total=timeout_s)
        for path in (HEALTH_READY, model_path(self.served) + "/ready"):
            status, _ = await self._get(path, timeout)
            if status != 200:
                self.problem = f"GET {path} answered {_status(status)}"
                return False
        if self.metadata is None:
            status, raw = await self._get(model_path(self.served), timeout)
            if status != 200:
                self.problem = f"GET {model_path(self.served)} answered {_status(status)}"
                return False
            try:
                self.metadata = self._checked(decode(raw))
            except ValueError as exc:
                self.problem = str(exc)
                return False
        self.problem = ""
        return True

    async def _get(self, path: str, limit: aiohttp.ClientTimeout) -> tuple[int | None, bytes]:
        """The status and body of a GET of ``path``; None for no answer."""
        try:
            async with self._client.session.get(
                self._client.base_url + path, timeout=limit
            ) as resp:
                return resp.status, await read_whole(resp, MAX_METADATA_BYTES)
        except (aiohttp.ClientError, TimeoutError, AnswerTooLarge):
            return None, b""

    def _checked(self, metadata: Any) -> dict[str, Any]:
        """The model's metadata, if it names the served model and every input it declares has
        a batch dimension first; else ValueError saying what does not fit."""
        where = f"the model's metadata (GET {model_path(self.served)})"
        if not isinstance(metadata, dict):
            raise ValueError(f"{where} is not a JSON object")
        if metadata.get("name") != self.served:
            raise ValueError(
                f"{where} names the model {str(metadata.get('name'))[:64]!r}, not "
                f"{self.served!r} (--served-model-name)"
            )
        inputs = metadata.get("inputs") or []
        if not isinstance(inputs, list):
            raise ValueError(f'{where} has "inputs" that is not a list')
        for tensor in inputs:
            shape = tensor.get("shape") if isinstance(tensor, dict) else None
            if not isinstance(shape, list) or not shape or shape[0] != -1:
                name = tensor.get("name") if isinstance(tensor, dict) else None
                raise ValueError(
                    f"{where} gives input {str(name)[:64]!r} the shape {str(shape)[:64]}, whose "
                    "first dimension is not -1 (a batch dimension): the model cannot take "
                    "batches; serve it with a batch dimension (Triton: max_batch_size above 0)"
                )
        return metadata

    def client_metadata(self) -> dict[str, Any] | None:
        """The model's metadata as the sidecar's clients see it: under the modelroll model's
        name and version; None until read."""
        if self.metadata is None:
            return None
        return {**self.metadata, "name": self._model, "versions": [self._version]}


def _check_requested(outputs: list[Tensor], requested: tuple[dict[str, Any], ...]) -> None:
    """Every output asked for is in the answer."""
    given = {tensor.name for tensor in outputs}
    for output in requested:
        if output["name"] not in given:
            raise ModelFailed(
                f"the model's answer has no output {output['name']!r}, which was asked for"
            )


def _status(status: int | None) -> str:
    return "nothing (no connection or no answer in time)" if status is None else f"HTTP {status}"
