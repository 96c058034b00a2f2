"""A reader of the safetensors format into numpy arrays: an 8-byte little-endian header length,
a JSON header naming each tensor's dtype, shape and byte range, then the raw little-endian data.
"""

from __future__ import annotations

import json
import struct
from typing import Any

import numpy as np
import numpy.typing as npt

DTYPES = {
    "F64": "<f8",
    "F32": "<f4",
    "F16": "<f2",
    "I64": "<i8",
    "I32": "<i4",
    "I16": "<i2",
    "I8": "i1",
    "U8": "u1",
    "BOOL": "?",
}
"""The safetensors dtypes numpy holds natively (bfloat16 and float8 have no numpy dtype)."""

MAX_HEADER_BYTES = 100 << 20


def read_tensors(data: bytes) -> dict[str, npt.NDArray[np.generic]]:
    """Every tensor in ``data`` by name, as read-only arrays viewing ``data`` (no copy)."""
    if len(data) < 8:
        raise ValueError("not a safetensors file: shorter than its header length")
    (header_len,) = struct.unpack("<Q", data[:8])
    if header_len > min(MAX_HEADER_BYTES, len(data) - 8):
        raise ValueError(f"safetensors header length {header_len} is out of range")
    header = json.loads(data[8 : 8 + header_len])
    if not isinstance(header, dict):
        raise ValueError("safetensors header is not a JSON object")
    body = memoryview(data)[8 + header_len :]
    tensors: dict[str, npt.NDArray[np.generic]] = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        dtype = DTYPES.get(entry["dtype"])
        if dtype is None:
            raise ValueError(f"tensor {name}: dtype {entry['dtype']} has no numpy equivalent")
        start, end = entry["data_offsets"]
        shape = tuple(int(n) for n in entry["shape"])
        if not 0 <= start <= end <= len(body) or end - start != np.dtype(dtype).itemsize * int(
            np.prod(shape)
        ):
            raise ValueError(f"tensor {name}: its byte range does not match its shape")
        tensors[name] = np.frombuffer(body[start:end], dtype=dtype).reshape(shape)
    return tensors


def write_tensors(tensors: dict[str, npt.NDArray[np.generic]]) -> bytes:
    """``tensors`` as a safetensors file that :func:`read_tensors` reads back, in name order, each
    tensor's data aligned to 8 bytes as the format's own writer aligns the header."""
    names = {np.dtype(v): k for k, v in DTYPES.items()}
    entries: dict[str, Any] = {}
    chunks: list[bytes] = []
    offset = 0
    for name in sorted(tensors):
        array = np.ascontiguousarray(tensors[name])
        little = array.astype(array.dtype.newbyteorder("<"), copy=False)
        dtype = names.get(little.dtype)
        if dtype is None:
            raise ValueError(f"tensor {name}: dtype {array.dtype} has no safetensors equivalent")
        data = little.tobytes()
        entries[name] = {
            "dtype": dtype,
            "shape": list(array.shape),
            "data_offsets": [offset, offset + len(data)],
        }
        chunks.append(data)
        offset += len(data)
    header = json.dumps(entries, separators=(",", ":")).encode()
    header += b" " * (-len(header) % 8)
    return struct.pack("<Q", len(header)) + header + b"".join(chunks)
