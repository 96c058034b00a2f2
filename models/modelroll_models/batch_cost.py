"""``python -m modelroll_models.batch_cost``: each variant's time per batch, encoding included
and HTTP excluded, for batches of typical sentences (about 15 words, 20 tokens with [CLS] and
[SEP]). Prints one row per variant, thread count and batch size: the medians over the repeats
of the wall-clock time and of the process's CPU time (all its threads).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Sequence

from .encoder import VARIANTS, EncoderFiles, load_encoder
from .model_files import default_onnx_path, default_zip_path

SENTENCES = (
    "The new release cut the median response time of the search page by a third.",
    "A man is riding a horse along the beach while the sun sets behind him.",
    "Please remind me to call the plumber about the leaking kitchen tap tomorrow morning.",
    "The committee postponed its decision on the budget until the next quarterly meeting.",
    "Heavy rain flooded several streets in the old town and closed two bridges.",
    "She finally finished the novel she had been writing for almost ten years.",
    "Our team moved the nightly batch jobs to a cheaper cluster without any downtime.",
    "The recipe calls for two cups of flour, a pinch of salt and fresh butter.",
)


def batch(size: int) -> list[str]:
    return [SENTENCES[i % len(SENTENCES)] for i in range(size)]


def measure(variant: str, threads: int, sizes: Sequence[int], repeats: int) -> None:
    files = EncoderFiles(default_zip_path(), default_onnx_path())
    encoder = load_encoder(variant, files, threads)
    for size in sizes:
        texts = batch(size)
        tokens = encoder.tokenize(texts)
        encoder.encode(texts)  # warm-up
        wall, cpu = [], []
        for _ in range(repeats):
            started, started_cpu = time.perf_counter(), time.process_time()
            encoder.encode(texts)
            wall.append(time.perf_counter() - started)
            cpu.append(time.process_time() - started_cpu)
        median_ms = statistics.median(wall) * 1000
        print(
            f"{variant:5} threads={threads} batch={size:3} tokens={tokens.padded:5}"
            f"  {median_ms:8.2f} ms/batch  {median_ms / size:7.2f} ms/item"
            f"  {statistics.median(cpu) * 1000:8.2f} ms CPU/batch"
        )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m modelroll_models.batch_cost")
    parser.add_argument("--variant", choices=VARIANTS, action="append")
    parser.add_argument("--threads", type=int, action="append", help="intra-op threads (int8)")
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args(argv)
    for variant in args.variant or VARIANTS:
        for threads in args.threads or [1]:
            measure(variant, threads, args.sizes, args.repeats)


if __name__ == "__main__":
    main()
