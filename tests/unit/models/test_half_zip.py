"""The fp16 copy of the model zip that travels to a GPU machine: half the weights' bytes, and the
same vectors as the fp32 zip."""

from __future__ import annotations

from pathlib import Path

from modelroll_models.encoder import Encoder, EncoderFiles, load_encoder
from modelroll_models.model_files import read_weights_file, write_half_zip

SENTENCES = [
    "A man is eating food.",
    "Kubernetes restarts a container whose liveness probe keeps failing.",
    "",
]


def test_the_half_zip_holds_half_the_bytes_and_encodes_the_same_vectors(
    files: EncoderFiles, fp32: Encoder, tmp_path: Path
) -> None:
    half = tmp_path / "half.zip"
    write_half_zip(files.zip_path, half)
    weights = len(read_weights_file(half)) / len(read_weights_file(files.zip_path))
    assert 0.49 < weights < 0.51
    from_half = load_encoder("fp32", EncoderFiles(half, files.onnx_path), intra_op_threads=1)
    assert from_half.tokenizer_json() == fp32.tokenizer_json()
    cosines = (from_half.encode(SENTENCES) * fp32.encode(SENTENCES)).sum(axis=1)
    assert cosines.min() > 0.9999, cosines
