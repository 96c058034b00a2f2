"""bert.py's encoder in PyTorch, for a GPU: the same layers under the same names, the weights in
fp16 on one CUDA device. Only the ``fp16-gpu`` variant imports this module (and so PyTorch).

Where bert.py spells an operation out, this calls PyTorch's own: ``linear``, ``layer_norm``, the
exact (erf) ``gelu``, and ``scaled_dot_product_attention`` with the same additive key mask, which
on a GPU runs as one fused kernel. A call synchronizes once, copying the last hidden state back
as float32 for the pooling the other variants share.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import torch
from torch.nn import functional

from .bert import Layer, read_layer
from .model_files import SentenceModelFolder
from .safetensors_format import read_tensors

F32 = npt.NDArray[np.float32]
I64 = npt.NDArray[np.int64]
Tensor = Any
"""A torch.Tensor (this project type-checks without PyTorch installed)."""

DTYPE = torch.float16
MASKED = torch.finfo(DTYPE).min
"""Added to the attention score of a padded key: its softmax weight becomes 0."""


def gelu(x: Tensor) -> Tensor:
    return functional.gelu(x)


def layer_norm(x: Tensor, weight: Tensor, bias: Tensor, eps: float) -> Tensor:
    return functional.layer_norm(x, (x.shape[-1],), weight, bias, eps)


@dataclass(frozen=True, slots=True)
class Linear:
    """``x @ weight.T + bias``, the weight as stored (``[out, in]``)."""

    weight: Tensor
    bias: Tensor

    def __call__(self, x: Tensor) -> Tensor:
        return functional.linear(x, self.weight, self.bias)


TorchLayer = Layer[Linear, tuple[Tensor, Tensor]]


class BertEncoder:
    """bert.BertEncoder on ``device``: token ids, attention mask and token types
    ``[batch, sequence]`` in, the last hidden state ``[batch, sequence, hidden]`` out (float32
    numpy arrays on both sides)."""

    def __init__(self, weights: bytes, folder: SentenceModelFolder, device: str = "cuda") -> None:
        tensors = read_tensors(weights)
        self.device = torch.device(device)

        def half(name: str) -> Tensor:
            array = np.ascontiguousarray(tensors[name], dtype=np.float16)
            return torch.from_numpy(array).to(self.device)

        def linear(prefix: str) -> Linear:
            return Linear(half(prefix + ".weight"), half(prefix + ".bias"))

        def norm(prefix: str) -> tuple[Tensor, Tensor]:
            return half(prefix + ".weight"), half(prefix + ".bias")

        self.eps = folder.layer_norm_eps
        self.heads = folder.num_heads
        self.word = half("embeddings.word_embeddings.weight")
        self.position = half("embeddings.position_embeddings.weight")
        self.token_type = half("embeddings.token_type_embeddings.weight")
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
        with torch.inference_mode():
            ids, mask, types = (
                torch.from_numpy(a).to(self.device, non_blocking=True)
                for a in (input_ids, attention_mask, token_type_ids)
            )
            x = self.word[ids] + self.position[:seq] + self.token_type[types]
            x = layer_norm(x, *self.embeddings_norm, self.eps)
            # [batch, 1, 1, keys]: broadcast over heads and queries.
            key_bias = torch.zeros(mask.shape, dtype=DTYPE, device=self.device)
            key_bias = key_bias.masked_fill(mask == 0, MASKED)[:, None, None, :]
            for layer in self.layers:
                x = self._layer(layer, x, key_bias, batch, seq)
            result: F32 = x.float().cpu().numpy()
        return result

    def _layer(
        self, layer: TorchLayer, x: Tensor, key_bias: Tensor, batch: int, seq: int
    ) -> Tensor:
        hidden = x.shape[-1]
        head = hidden // self.heads

        def split(t: Tensor) -> Tensor:  # [batch, seq, hidden] -> [batch, heads, seq, head]
            return t.reshape(batch, seq, self.heads, head).transpose(1, 2)

        q, k, v = split(layer.query(x)), split(layer.key(x)), split(layer.value(x))
        attended = functional.scaled_dot_product_attention(q, k, v, attn_mask=key_bias)
        context = attended.transpose(1, 2).reshape(batch, seq, hidden)
        x = layer_norm(x + layer.attention_out(context), *layer.attention_norm, self.eps)
        ffn = layer.output(gelu(layer.intermediate(x)))
        return layer_norm(x + ffn, *layer.output_norm, self.eps)

    def warm_up(self) -> None:
        """A small and a large batch, so that no request pays for starting the GPU's libraries
        (the first call of a kind loads its kernels)."""
        for batch, seq in ((1, 16), (64, 64)):
            ones = np.ones((batch, seq), dtype=np.int64)
            self(ones, ones, np.zeros_like(ones))
