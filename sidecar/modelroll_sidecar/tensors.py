"""The tensors of the Open Inference Protocol (KServe's "v2" protocol), read and checked: an
infer request's ``inputs``, ``outputs``, ``parameters`` and ``id``, and a model's answer.

A tensor is ``{"name", "shape", "datatype", "data", "parameters"?}``: ``shape`` a list of
non-negative integers (at least one dimension), ``data`` its elements in row-major order, flat or
nested, as many as the shape's product, each of its datatype's kind (BOOL: true or false;
UINT8..UINT64 and INT8..INT64: an integer in the type's range; FP16, FP32, FP64: a number;
BYTES: a string). The first dimension is the tensor's rows: what a batch concatenates and splits.
Tensor data in binary (the binary tensor data extension: an input's ``binary_data_size``) is not
read; a request for binary outputs (``binary_data_output``, an output's ``binary_data``) is
answered in JSON, which the protocol's clients read as well. Every fault is a :class:`BadTensor`
whose message names the tensor, never its data.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import orjson


class BadTensor(ValueError):
    """A request or an answer that breaks the protocol; the message names the tensor."""


def _integers(bits: int, signed: bool) -> tuple[int, int]:
    return (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if signed else (0, (1 << bits) - 1)


INTEGER_RANGES = {
    **{f"UINT{bits}": _integers(bits, signed=False) for bits in (8, 16, 32, 64)},
    **{f"INT{bits}": _integers(bits, signed=True) for bits in (8, 16, 32, 64)},
}
FLOATS = ("FP16", "FP32", "FP64")
DATATYPES = ("BOOL", *INTEGER_RANGES, *FLOATS, "BYTES")
"""The protocol's tensor datatypes."""
BINARY_INPUT = ("binary_data_size", "binary_data")
"""An input's parameters that say its data is in binary after the JSON: not read."""
BINARY_OUTPUT = "binary_data"
"""A requested output's parameter asking for its data in binary: answered in JSON instead."""
BINARY_OUTPUTS = "binary_data_output"
"""A request's parameter asking for every output in binary: answered in JSON instead."""


@dataclass(frozen=True, slots=True)
class Tensor:
    name: str
    datatype: str
    shape: tuple[int, ...]
    data: list[Any]
    """Flat, row-major."""
    parameters: dict[str, Any]

    @property
    def rows(self) -> int:
        """The first (batch) dimension."""
        return self.shape[0]

    @property
    def width(self) -> int:
        """Elements per row."""
        return math.prod(self.shape[1:])

    def rows_of(self, start: int, count: int) -> dict[str, Any]:
        """The tensor of ``count`` of its rows from row ``start``, as JSON."""
        width = self.width
        tensor: dict[str, Any] = {
            "name": self.name,
            "datatype": self.datatype,
            "shape": [count, *self.shape[1:]],
            "data": self.data[start * width : (start + count) * width],
        }
        if self.parameters:
            tensor["parameters"] = self.parameters
        return tensor


def concatenated(tensors: Sequence[Tensor]) -> dict[str, Any]:
    """``tensors`` (one name, datatype, parameters and row shape) as one tensor of all their
    rows, as JSON."""
    first = tensors[0]
    tensor: dict[str, Any] = {
        "name": first.name,
        "datatype": first.datatype,
        "shape": [sum(t.rows for t in tensors), *first.shape[1:]],
        "data": [value for t in tensors for value in t.data],
    }
    if first.parameters:
        tensor["parameters"] = first.parameters
    return tensor


@dataclass(frozen=True, slots=True)
class InferRequest:
    """One client's infer request, checked. Requests with equal ``key`` agree on everything a
    model call is made with but their rows (tensor names, datatypes, row shapes, parameters,
    requested outputs), so they can share one."""

    id: str | None
    inputs: tuple[Tensor, ...]
    outputs: tuple[dict[str, Any], ...] | None
    parameters: dict[str, Any]
    key: Hashable

    @property
    def rows(self) -> int:
        return self.inputs[0].rows

    def longest_text(self) -> str | None:
        """The longest element (in characters) of its BYTES inputs: what its length is counted
        on, in words or tokens; None without BYTES inputs."""
        texts = [value for t in self.inputs if t.datatype == "BYTES" for value in t.data]
        return max(texts, key=len, default=None)


def infer_request(body: Any) -> InferRequest:
    """The infer request in ``body`` (decoded JSON), or BadTensor saying what is wrong."""
    if not isinstance(body, dict):
        raise BadTensor("the body must be a JSON object")
    request_id = body.get("id")
    if request_id is not None and not isinstance(request_id, str):
        raise BadTensor('"id" must be a string')
    parameters = _parameters(body.get("parameters"), "the request's")
    parameters.pop(BINARY_OUTPUTS, None)
    given = body.get("inputs")
    if not isinstance(given, list) or not given:
        raise BadTensor('"inputs" must be a non-empty list of tensors')
    inputs = tuple(_input(value, i) for i, value in enumerate(given))
    _unique([t.name for t in inputs], "input")
    first = inputs[0]
    for tensor in inputs[1:]:
        if tensor.rows != first.rows:
            raise BadTensor(
                f"inputs {first.name!r} and {tensor.name!r} differ in their first (batch) "
                f"dimension, {first.rows} and {tensor.rows}: every input of a request must have "
                "as many rows"
            )
    outputs = None if body.get("outputs") is None else _requested(body["outputs"])
    key = orjson.dumps(
        [
            [[t.name, t.datatype, t.shape[1:], t.parameters] for t in inputs],
            outputs,
            parameters,
        ],
        option=orjson.OPT_SORT_KEYS,
    )
    return InferRequest(request_id, inputs, outputs, parameters, key)


def _input(value: Any, index: int) -> Tensor:
    parameters = value.get("parameters") if isinstance(value, dict) else None
    for name in BINARY_INPUT:
        if isinstance(parameters, dict) and parameters.get(name) not in (None, False):
            raise BadTensor(
                f"input {str(value.get('name'))[:64]!r} has {name}: the binary tensor data "
                "extension is not supported; send its data as JSON"
            )
    tensor = read_tensor(value, f"input {index}", "input")
    if tensor.rows < 1:
        raise BadTensor(f"input {tensor.name!r} has no rows: its first dimension is 0")
    return tensor


def _requested(value: Any) -> tuple[dict[str, Any], ...]:
    if not isinstance(value, list):
        raise BadTensor('"outputs" must be a list of {"name": ...} objects')
    outputs = []
    for index, output in enumerate(value):
        if not isinstance(output, dict) or not _name(output.get("name")):
            raise BadTensor(f"requested output {index} must be an object with a non-empty name")
        unknown = sorted(set(output) - {"name", "parameters"})
        if unknown:
            raise BadTensor(f"requested output {output['name']!r} has unknown fields {unknown}")
        parameters = _parameters(output.get("parameters"), f"output {output['name']!r}'s")
        parameters.pop(BINARY_OUTPUT, None)
        outputs.append(
            {"name": output["name"], **({"parameters": parameters} if parameters else {})}
        )
    _unique([o["name"] for o in outputs], "requested output")
    return tuple(outputs)


def read_tensor(value: Any, where: str, kind: str) -> Tensor:
    """The tensor in ``value`` (``where`` names it until its name is known; ``kind`` is what it
    is: input, output), checked, its data flattened."""
    if not isinstance(value, dict):
        raise BadTensor(f"{where} must be a tensor object")
    name = value.get("name")
    if not isinstance(name, str) or not name:
        raise BadTensor(f"{where} must have a non-empty string name")
    it = f"{kind} {name!r}"
    datatype = value.get("datatype")
    if datatype not in DATATYPES:
        shown = datatype if isinstance(datatype, str) else type(datatype).__name__
        raise BadTensor(
            f"{it} has an unknown datatype {shown[:32]!r}: one of {', '.join(DATATYPES)}"
        )
    shape = value.get("shape")
    if (
        not isinstance(shape, list)
        or not shape
        or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)
    ):
        raise BadTensor(f"{it} must have a shape: a list of one or more non-negative integers")
    if "data" not in value:
        raise BadTensor(f"{it} has no data")
    data = _flat(value["data"])
    expected = math.prod(shape)
    if len(data) != expected:
        raise BadTensor(
            f"{it} has {len(data)} elements of data for its shape {shape}, which holds {expected}"
        )
    _check_values(data, datatype, it)
    parameters = _parameters(value.get("parameters"), f"{it}'s")
    return Tensor(name, datatype, tuple(shape), data, parameters)


def _check_values(data: list[Any], datatype: str, it: str) -> None:
    if datatype == "BOOL":
        fits = all(isinstance(v, bool) for v in data)
        kind = "true or false"
    elif datatype == "BYTES":
        fits = all(isinstance(v, str) for v in data)
        kind = "a string"
    elif datatype in FLOATS:
        fits = all(isinstance(v, int | float) and not isinstance(v, bool) for v in data)
        kind = "a number"
    else:
        low, high = INTEGER_RANGES[datatype]
        fits = all(
            isinstance(v, int) and not isinstance(v, bool) and low <= v <= high for v in data
        )
        kind = f"an integer from {low} to {high}"
    if not fits:
        raise BadTensor(f"{it} is {datatype}: each element of its data must be {kind}")


def _flat(data: Any) -> list[Any]:
    """``data``'s elements in row-major order, however its lists nest (a scalar: itself)."""
    if not isinstance(data, list):
        return [data]
    if not any(isinstance(v, list) for v in data):
        return data
    return list(_leaves(data))


def _leaves(data: list[Any]) -> Iterator[Any]:
    stack = [iter(data)]
    while stack:
        for value in stack[-1]:
            if isinstance(value, list):
                stack.append(iter(value))
                break
            yield value
        else:
            stack.pop()


def _parameters(value: Any, whose: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise BadTensor(f"{whose} parameters must be an object")
    return dict(value)


def _name(value: Any) -> bool:
    return isinstance(value, str) and bool(value)


def _unique(names: list[str], kind: str) -> None:
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise BadTensor(f"{kind} {name!r} is given twice")
        seen.add(name)


def model_outputs(body: Any, rows: int) -> list[Tensor]:
    """The output tensors of a model's answer to a call of ``rows`` rows, each of which can be
    split back along its first dimension; BadTensor says which cannot."""
    if (
        not isinstance(body, dict)
        or not isinstance(body.get("outputs"), list)
        or not body["outputs"]
    ):
        raise BadTensor('the answer has no "outputs" list of tensors')
    outputs = [
        read_tensor(value, f"output {i}", "output") for i, value in enumerate(body["outputs"])
    ]
    _unique([t.name for t in outputs], "output")
    for tensor in outputs:
        if tensor.rows != rows:
            raise BadTensor(
                f"output {tensor.name!r} has {tensor.rows} rows (its first dimension) for the "
                f"{rows} rows sent: it cannot be split back into the requests' answers"
            )
    return outputs
