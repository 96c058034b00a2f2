"""A sentence encoder: texts in, L2-normalized mean-pooled vectors out, as sentence-transformers
computes all-MiniLM-L6-v2's. The variants share the tokenizer and the pooling and differ in the
network: ``int8`` runs the int8 ONNX export on onnxruntime, ``fp32`` the fp32 weights in numpy,
``fp16-gpu`` the weights as fp16 in PyTorch on a CUDA GPU.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt
from threadpoolctl import ThreadpoolController
from tokenizers import Tokenizer

from .bert import BertEncoder
from .model_files import SentenceModelFolder, read_folder, read_weights_file

F32 = npt.NDArray[np.float32]
I64 = npt.NDArray[np.int64]

VARIANTS = ("int8", "fp32", "fp16-gpu")

Network = Callable[[I64, I64, I64], F32]
"""ids, attention mask, token types ``[batch, sequence]`` -> last hidden state."""


@dataclass(frozen=True, slots=True)
class Tokens:
    """One batch, tokenized and padded to its longest input."""

    input_ids: I64
    attention_mask: I64
    token_type_ids: I64

    @property
    def useful(self) -> int:
        """Real tokens ([CLS] and [SEP] included), the padding excluded."""
        return int(self.attention_mask.sum())

    @property
    def padded(self) -> int:
        """Batch size x longest input: the positions the network computes."""
        return int(self.input_ids.size)


def make_tokenizer(folder: SentenceModelFolder) -> Tokenizer:
    """The model's WordPiece tokenizer, truncating at the model's ``max_seq_length`` and padding to
    the batch's longest input (its tokenizer.json says 128 tokens, padded to a fixed 128)."""
    tokenizer = Tokenizer.from_str(folder.tokenizer_json)
    tokenizer.enable_truncation(max_length=folder.max_seq_length)
    tokenizer.enable_padding()  # [PAD], id 0, to the longest input: this vocabulary's padding
    return tokenizer


def mean_pool(hidden: F32, attention_mask: I64) -> F32:
    """The mean of each input's real tokens' vectors, scaled to unit length."""
    mask = attention_mask[:, :, None].astype(np.float32)
    summed = (hidden * mask).sum(axis=1)
    pooled = summed / np.maximum(mask.sum(axis=1), np.float32(1e-9))
    norms = np.linalg.norm(pooled, axis=1, keepdims=True)
    result: F32 = (pooled / np.maximum(norms, np.float32(1e-12))).astype(np.float32)
    return result


class Encoder:
    """One variant of the model, loaded. Not thread-safe: call it from one thread at a time."""

    def __init__(self, variant: str, tokenizer: Tokenizer, network: Network) -> None:
        self.variant = variant
        self._tokenizer = tokenizer
        self._network = network
        self._tokenizer_json = tokenizer.to_str()

    def tokenizer_json(self) -> str:
        """The tokenizer as ``tokenize`` uses it, as a tokenizer.json (truncation included;
        padding is to the batch's longest input, which a length does not need)."""
        return self._tokenizer_json

    def tokenize(self, texts: Sequence[str]) -> Tokens:
        encodings = self._tokenizer.encode_batch(list(texts))
        return Tokens(
            np.array([e.ids for e in encodings], dtype=np.int64),
            np.array([e.attention_mask for e in encodings], dtype=np.int64),
            np.array([e.type_ids for e in encodings], dtype=np.int64),
        )

    def encode_tokens(self, tokens: Tokens) -> F32:
        hidden = self._network(tokens.input_ids, tokens.attention_mask, tokens.token_type_ids)
        return mean_pool(hidden, tokens.attention_mask)

    def encode(self, texts: Sequence[str]) -> F32:
        """``[len(texts), 384]`` unit vectors, float32."""
        return self.encode_tokens(self.tokenize(texts))


def onnx_network(path: Path, intra_op_threads: int) -> Network:
    """The ONNX export on onnxruntime's CPU provider, one operator at a time on
    ``intra_op_threads`` threads."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = intra_op_threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])

    def run(input_ids: I64, attention_mask: I64, token_type_ids: I64) -> F32:
        (hidden,) = session.run(
            ["last_hidden_state"],
            {
                "input_ids": input_ids,
                "attention_mask": attention_mask,
                "token_type_ids": token_type_ids,
            },
        )
        result: F32 = np.asarray(hidden, dtype=np.float32)
        return result

    return run


@dataclass(frozen=True, slots=True)
class EncoderFiles:
    """Where a variant's files are: the sentence-transformers zip (tokenizer, config, fp32
    weights) and the int8 ONNX file."""

    zip_path: Path
    onnx_path: Path


def load_encoder(variant: str, files: EncoderFiles, intra_op_threads: int) -> Encoder:
    """Read the tokenizer and the variant's weights: a second or two, mostly inflating the zip."""
    folder = read_folder(files.zip_path)
    network: Network
    if variant == "int8":
        network = onnx_network(files.onnx_path, intra_op_threads)
    elif variant == "fp32":
        # numpy's matmuls are the fp32 network's only parallelism: OpenBLAS's threads, which by
        # default are as many as the cores and slow a small batch down several times over.
        blas = ThreadpoolController()  # type: ignore[no-untyped-call]
        blas.limit(limits=intra_op_threads, user_api="blas")
        network = BertEncoder(read_weights_file(files.zip_path), folder)
    elif variant == "fp16-gpu":
        from . import bert_torch  # PyTorch: installed on the GPU machine only

        on_gpu = bert_torch.BertEncoder(read_weights_file(files.zip_path), folder, "cuda")
        on_gpu.warm_up()
        network = on_gpu
    else:
        raise ValueError(f"variant must be one of {', '.join(VARIANTS)}, got {variant!r}")
    return Encoder(variant, make_tokenizer(folder), network)


def timed_load(variant: str, files: EncoderFiles, intra_op_threads: int) -> tuple[Encoder, float]:
    """:func:`load_encoder` and the seconds it took."""
    started = time.perf_counter()
    encoder = load_encoder(variant, files, intra_op_threads)
    return encoder, time.perf_counter() - started
