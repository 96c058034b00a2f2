"""The encoder's aiohttp app: one variant of all-MiniLM-L6-v2 on the model protocol's core
(``batch_server``), which answers strings with their vectors and counts their tokens."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

from .batch_server import (
    DEFAULT_MAX_BATCH_SIZE,
    DEFAULT_MAX_BODY_BYTES,
    BatchModel,
    create_app,
)
from .encoder import Encoder, EncoderFiles, load_encoder

JSON_TYPES = {
    dict: "an object",
    list: "an array",
    bool: "a boolean",
    int: "a number",
    float: "a number",
}


@dataclass(frozen=True, slots=True)
class EncoderConfig:
    """Everything the server needs; built by ``cli.parse_args`` or directly in tests."""

    host: str = "127.0.0.1"
    port: int = 8080
    variant: str = "int8"
    intra_op_threads: int = 1
    """Threads one batch's operators run on (int8: onnxruntime's; fp32: OpenBLAS's). One: on 2
    cores a second thread gains at most a tenth of a batch's time when the other core is idle, and
    loses more whenever the sidecar (or anything else) is using it (README.md, Cost)."""
    max_batch_size: int = DEFAULT_MAX_BATCH_SIZE
    """Inputs per batch; a larger batch is refused (400) and the sidecar splits it."""
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    """Request bodies over this get 413 unread."""
    zip_path: Path = field(default_factory=Path)
    """The sentence-transformers ``model.zip``: tokenizer, config (both variants), fp32 weights."""
    onnx_path: Path = field(default_factory=Path)
    """The int8 ONNX file (int8 only)."""

    @property
    def files(self) -> EncoderFiles:
        return EncoderFiles(self.zip_path, self.onnx_path)


def item_error(payload: object) -> str | None:
    """Why an input cannot be encoded, or None for a string."""
    if isinstance(payload, str):
        return None
    kind = "null" if payload is None else JSON_TYPES.get(type(payload), type(payload).__name__)
    return f"input must be a string, got {kind}"


class EncoderModel(BatchModel):
    """Strings to vectors, counting real and padded tokens (per batch: size x longest input)."""

    encoder: Encoder
    """Set by ``load``, which the core runs before any batch."""

    def __init__(self, variant: str, load: Callable[[], Encoder]) -> None:
        self.name = f"the {variant} encoder"
        self.variant = variant
        self._load = load
        self.useful_tokens = 0
        self.padded_tokens = 0
        self.encode_seconds = 0.0

    def load(self) -> None:
        self.encoder = self._load()

    def item_error(self, payload: Any) -> str | None:
        return item_error(payload)

    def predict(self, inputs: list[Any]) -> list[Any]:
        started = time.perf_counter()
        tokens = self.encoder.tokenize(inputs)
        vectors = self.encoder.encode_tokens(tokens)
        self.useful_tokens += tokens.useful
        self.padded_tokens += tokens.padded
        self.encode_seconds += time.perf_counter() - started
        return list(vectors)

    def tokenizer(self) -> str:
        return self.encoder.tokenizer_json()

    def info(self) -> dict[str, Any]:
        return {"variant": self.variant}

    def stats(self) -> dict[str, Any]:
        """Useful tokens are WordPiece tokens with [CLS] and [SEP]; padded ones include padding."""
        return {
            "useful_tokens": self.useful_tokens,
            "padded_tokens": self.padded_tokens,
            "encode_seconds": round(self.encode_seconds, 6),
        }


def create_encoder_app(
    config: EncoderConfig, load: Callable[[], Encoder] | None = None
) -> web.Application:
    """The app; ``load`` builds the encoder (by default from ``config``'s variant and files)."""

    def load_from_config() -> Encoder:
        return load_encoder(config.variant, config.files, config.intra_op_threads)

    model = EncoderModel(config.variant, load or load_from_config)
    return create_app(model, config.max_batch_size, config.max_body_bytes)
