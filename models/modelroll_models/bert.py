"""all-MiniLM-L6-v2's BERT encoder in numpy, from its fp32 safetensors weights: embeddings (word,
position, token type), LayerNorm, then self-attention and GELU feed-forward layers, each followed by
a residual LayerNorm. The attention mask keeps padded positions out of every real token's attention.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

import numpy as np
import numpy.typing as npt

from .model_files import SentenceModelFolder
from .safetensors_format import read_tensors

F32 = npt.NDArray[np.float32]
I64 = npt.NDArray[np.int64]
L = TypeVar("L")
N = TypeVar("N")

MASKED = np.float32(np.finfo(np.float32).min)
"""Added to the attention score of a padded key: its softmax weight becomes exactly 0."""

# Abramowitz and Stegun 7.1.26: erf to within 1.5e-7, below float32's resolution near 1.
_ERF_P = 0.3275911
_ERF_A = (0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429)


def erf(x: F32) -> F32:
    """The error function, elementwise (numpy has none; BERT's GELU is the exact, erf one)."""
    sign = np.sign(x)
    a = np.abs(x)
    t = 1.0 / (1.0 + _ERF_P * a)
    a1, a2, a3, a4, a5 = _ERF_A
    poly = t * (a1 + t * (a2 + t * (a3 + t * (a4 + t * a5))))
    result: F32 = (sign * (1.0 - poly * np.exp(-a * a))).astype(np.float32)
    return result


def gelu(x: F32) -> F32:
    result: F32 = 0.5 * x * (1.0 + erf(x * np.float32(1 / math.sqrt(2))))
    return result


def layer_norm(x: F32, weight: F32, bias: F32, eps: float) -> F32:
    mean = x.mean(axis=-1, keepdims=True)
    centred = x - mean
    var = (centred * centred).mean(axis=-1, keepdims=True)
    result: F32 = centred / np.sqrt(var + np.float32(eps)) * weight + bias
    return result


@dataclass(frozen=True, slots=True)
class Linear:
    """``x @ weight.T + bias``, with the weight stored transposed once, at load."""

    weight_t: F32
    bias: F32

    def __call__(self, x: F32) -> F32:
        result: F32 = x @ self.weight_t + self.bias
        return result


@dataclass(frozen=True, slots=True)
class Layer(Generic[L, N]):
    """One encoder layer's weights: its linear maps ``L`` and LayerNorms ``N`` (weight, bias),
    as this module and bert_torch.py each hold them."""

    query: L
    key: L
    value: L
    attention_out: L
    attention_norm: N
    intermediate: L
    output: L
    output_norm: N


def read_layer(prefix: str, linear: Callable[[str], L], norm: Callable[[str], N]) -> Layer[L, N]:
    """The layer whose tensors' names start with ``prefix`` (``encoder.layer.<i>.``)."""
    return Layer(
        query=linear(prefix + "attention.self.query"),
        key=linear(prefix + "attention.self.key"),
        value=linear(prefix + "attention.self.value"),
        attention_out=linear(prefix + "attention.output.dense"),
        attention_norm=norm(prefix + "attention.output.LayerNorm"),
        intermediate=linear(prefix + "intermediate.dense"),
        output=linear(prefix + "output.dense"),
        output_norm=norm(prefix + "output.LayerNorm"),
    )


class BertEncoder:
    """Token ids, attention mask and token types ``[batch, sequence]`` in, the last hidden state
    ``[batch, sequence, hidden]`` out, as the ONNX export of the same model computes it."""

    def __init__(self, weights: bytes, folder: SentenceModelFolder) -> None:
        tensors = read_tensors(weights)

        def f32(name: str) -> F32:
            return np.ascontiguousarray(tensors[name], dtype=np.float32)

        def linear(prefix: str) -> Linear:
            return Linear(np.ascontiguousarray(f32(prefix + ".weight").T), f32(prefix + ".bias"))

        def norm(prefix: str) -> tuple[F32, F32]:
            return f32(prefix + ".weight"), f32(prefix + ".bias")

        self.eps = folder.layer_norm_eps
        self.heads = folder.num_heads
        self.word = f32("embeddings.word_embeddings.weight")
        self.position = f32("embeddings.position_embeddings.weight")
        self.token_type = f32("embeddings.token_type_embeddings.weight")
        self.embeddings_norm = norm("embeddings.LayerNorm")
        self.layers = [
            read_layer(f"encoder.layer.{i}.", linear, norm) for i in range(folder.num_layers)
        ]
        if self.word.shape[1] != folder.hidden_size or folder.hidden_size % self.heads:
            raise ValueError("the weights do not match config.json's hidden size and heads")

    def __call__(self, input_ids: I64, attention_mask: I64, token_type_ids: I64) -> F32:
        batch, seq = input_ids.shape
        if seq > self.position.shape[0]:
            raise ValueError(f"{seq} tokens exceed the {self.position.shape[0]} positions")
        x = self.word[input_ids] + self.position[:seq] + self.token_type[token_type_ids]
        x = layer_norm(x, *self.embeddings_norm, self.eps)
        # [batch, 1, 1, keys]: broadcast over heads and queries.
        key_bias = np.where(attention_mask[:, None, None, :] > 0, np.float32(0), MASKED)
        for layer in self.layers:
            x = self._layer(layer, x, key_bias, batch, seq)
        return x

    def _layer(
        self, layer: Layer[Linear, tuple[F32, F32]], x: F32, key_bias: F32, batch: int, seq: int
    ) -> F32:
        hidden = x.shape[-1]
        head = hidden // self.heads

        def split(t: F32) -> F32:  # [batch, seq, hidden] -> [batch, heads, seq, head]
            return t.reshape(batch, seq, self.heads, head).transpose(0, 2, 1, 3)

        q, k, v = split(layer.query(x)), split(layer.key(x)), split(layer.value(x))
        scores = q @ k.transpose(0, 1, 3, 2) * np.float32(1 / math.sqrt(head)) + key_bias
        scores -= scores.max(axis=-1, keepdims=True)
        weights = np.exp(scores)
        weights /= weights.sum(axis=-1, keepdims=True)
        context = (weights @ v).transpose(0, 2, 1, 3).reshape(batch, seq, hidden)
        x = layer_norm(x + layer.attention_out(context), *layer.attention_norm, self.eps)
        ffn = layer.output(gelu(layer.intermediate(x)))
        return layer_norm(x + ffn, *layer.output_norm, self.eps)
