"""The servers a benchmark starts, as real processes on loopback: the demo model or the real
sentence encoder, and the batchers under test in front of it (the modelroll sidecar, the classic
sleep-then-drain batcher, KServe's batcher, Ray Serve's ``@serve.batch``, BentoML's adaptive
batcher), all answering ``POST /v1/infer {"payload": p}``."""

from __future__ import annotations

import argparse
import contextlib
import shlex
import sys
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

from modelroll_common.settings import CHOICES_BY_ATTR
from modelroll_devcluster import processes
from modelroll_devcluster.processes import Component, free_port

from .lengths import CostModel

# `make kserve-batcher` builds it into the checkout's .bin/ (two levels above this package).
KSERVE_BIN = Path(__file__).resolve().parents[2] / ".bin" / "kserve-batcher"
# `make ray-serve` makes Ray Serve's own virtualenv; its batcher is bench/ray/serve_batcher.py.
RAY_PYTHON = Path(__file__).resolve().parents[2] / ".venv-ray" / "bin" / "python"
RAY_BATCHER = Path(__file__).resolve().parents[1] / "ray" / "serve_batcher.py"
RAY_START_S = 90.0
"""Ray starts a local cluster (GCS, raylet, Serve's controller, proxy and replica): about 6 s
on the 2-CPU machine when quiet."""
# `make bentoml` makes BentoML's own virtualenv; its service is bench/bentoml/service.py.
BENTOML_PYTHON = Path(__file__).resolve().parents[2] / ".venv-bentoml" / "bin" / "python"
BENTOML_SERVICE = Path(__file__).resolve().parents[1] / "bentoml" / "service.py"
BENTOML_START_S = 60.0
"""BentoML starts its arbiter and one worker process: about 10 s on the 2-CPU machine."""
Kind = Literal["sidecar", "classic", "kserve", "ray", "bentoml"]


class StartError(RuntimeError):
    """A server exited or never became ready."""


@dataclass(frozen=True)
class Batching:
    """One batcher configuration; ``max_batch_tokens`` 0 means no token budget. ``batch_by``
    (arrival or length), ``wait_policy`` (fixed or adaptive) and ``length_from`` (words or
    tokenizer) are the sidecar's flags of those names; the other batchers ignore them."""

    max_batch: int = 32
    max_wait_ms: float = 10.0
    max_batch_tokens: int = 0
    batch_by: str = "arrival"
    wait_policy: str = "fixed"
    length_from: str = "words"

    @property
    def name(self) -> str:
        tokens = f", {self.max_batch_tokens} tokens" if self.max_batch_tokens else ""
        by = ", by length" if self.batch_by != "arrival" else ""
        wait = f", {self.wait_policy} wait" if self.wait_policy != "fixed" else ""
        unit = f", lengths from the {self.length_from}" if self.length_from != "words" else ""
        return f"B={self.max_batch}, wait {self.max_wait_ms:g} ms{tokens}{by}{wait}{unit}"

    @classmethod
    def from_flags(cls, text: str, base: Batching) -> Batching:
        """``base`` with the sidecar's batching flags in ``text`` applied, such as
        ``"--batch-by length --max-batch-size 16 --max-wait-ms 0"``; ValueError naming what is
        wrong (an unknown flag, a value that is not a number or not one of the flag's words)."""
        parser = argparse.ArgumentParser(prog="sidecar flags", add_help=False, exit_on_error=False)
        parser.add_argument("--max-batch-size", dest="max_batch", type=int)
        parser.add_argument("--max-wait-ms", dest="max_wait_ms", type=float)
        parser.add_argument("--max-batch-tokens", dest="max_batch_tokens", type=int)
        for attr in ("batch_by", "wait_policy", "length_from"):
            choice = CHOICES_BY_ATTR[attr]
            parser.add_argument(choice.flag, dest=attr, choices=choice.words)
        try:
            found, rest = parser.parse_known_args(shlex.split(text))
        except argparse.ArgumentError as exc:
            raise ValueError(f"{text!r}: {exc}") from None
        if rest:
            raise ValueError(f"{text!r}: not a batching flag: {' '.join(rest)}")
        given = {k: v for k, v in vars(found).items() if v is not None}
        return replace(base, **given)

    def sidecar_flags(self) -> list[str]:
        """Every batching flag, the defaults' values included, so a row measures the same
        configuration whatever the sidecar's defaults are."""
        return [
            *("--max-batch-size", str(self.max_batch), "--max-wait-ms", f"{self.max_wait_ms:g}"),
            *("--max-batch-tokens", str(self.max_batch_tokens)),
            *("--batch-by", self.batch_by, "--wait-policy", self.wait_policy),
            *("--length-from", self.length_from),
        ]


SIDECAR_DEFAULTS = "the sidecar's defaults"
"""What a system without a Batching runs: the sidecar with none of the batching flags."""


@dataclass(frozen=True)
class System:
    """A batcher under test: which implementation, and how it is configured. A sidecar with
    ``defaults`` runs with none of the batching flags (``batching`` is then unused): what a
    ModelVersion without ``spec.batching`` gets, whatever the defaults are. ``slo_ms`` is
    BentoML's ``max_latency_ms``, the latency its dispatcher aims at (the others take no SLO)."""

    label: str
    kind: Kind
    batching: Batching
    defaults: bool = False
    slo_ms: float = 0.0

    @property
    def name(self) -> str:
        return SIDECAR_DEFAULTS if self.defaults else self.batching.name

    def argv(self, port: int, upstream: str, parallel: int) -> list[str]:
        if self.kind == "sidecar":
            return [
                *(sys.executable, "-m", "modelroll_sidecar", "--host", "127.0.0.1"),
                *("--port", str(port), "--upstream", upstream, "--model", "bench"),
                *("--version", self.label.replace(" ", "-"), "--max-queue-size", "4096"),
                *("--max-concurrent-batches", str(parallel)),
                *([] if self.defaults else self.batching.sidecar_flags()),
            ]
        b = self.batching
        bounds = [str(b.max_batch), f"{b.max_wait_ms:g}"]
        match self.kind:
            case "classic":
                return [
                    *(sys.executable, "-m", "modelroll_bench.classic", str(port), upstream),
                    *bounds,
                ]
            case "kserve":
                return [
                    *(str(KSERVE_BIN), "--port", str(port), "--upstream", upstream),
                    *("--max-batch-size", str(b.max_batch)),
                    *("--max-latency-ms", str(round(b.max_wait_ms))),
                ]
            case "ray":
                return [str(RAY_PYTHON), str(RAY_BATCHER), str(port), upstream, *bounds]
            case _:
                return [
                    *(str(BENTOML_PYTHON), str(BENTOML_SERVICE), str(port), upstream),
                    *(str(b.max_batch), f"{self.slo_ms:g}"),
                ]


@contextlib.asynccontextmanager
async def running(
    argv: list[str], port: int, ready_path: str = "/readyz", start_s: float = 20.0
) -> AsyncIterator[Component]:
    """Run ``argv`` until the block ends, once ``ready_path`` on ``port`` answers 200. Its
    output goes to a temporary log, whose end the StartError shows when it fails to start. It
    gets 30 s to exit on SIGTERM (Ray stops its local cluster in about 10) before it is
    killed."""
    url = f"http://127.0.0.1:{port}{ready_path}"
    with tempfile.TemporaryDirectory(prefix="modelroll-bench-") as tmp:
        server = Component(Path(argv[0]).name, argv, Path(tmp) / "server.log")
        async with processes.serve(
            server, url, start_s=start_s, stop_s=30.0, error=StartError
        ) as started:
            yield started


@contextlib.asynccontextmanager
async def serve(
    argv: list[str], port: int, ready_path: str = "/readyz", start_s: float = 20.0
) -> AsyncIterator[str]:
    """:func:`running`, yielding the server's base URL."""
    async with running(argv, port, ready_path, start_s):
        yield f"http://127.0.0.1:{port}"


@contextlib.asynccontextmanager
async def demo_model(cost: CostModel) -> AsyncIterator[str]:
    port = free_port()
    argv = [sys.executable, "-m", "modelroll_standins.model", "--port", str(port)]
    argv += ["--fixed-ms", f"{cost.fixed_ms:g}", "--per-token-ms", f"{cost.per_token_ms:g}"]
    argv += ["--parallel", str(cost.parallel)]
    async with serve(argv, port) as url:
        yield url


@contextlib.asynccontextmanager
async def encoder_model(variant: str = "int8", intra_op_threads: int = 1) -> AsyncIterator[str]:
    """modelroll-encoder (all-MiniLM-L6-v2) serving ``variant``; it loads in a few seconds."""
    port = free_port()
    argv = [sys.executable, "-m", "modelroll_models", "--port", str(port)]
    argv += ["--variant", variant, "--intra-op-threads", str(intra_op_threads)]
    async with serve(argv, port, start_s=60.0) as url:
        yield url


@contextlib.asynccontextmanager
async def batcher(system: System, model_url: str, parallel: int) -> AsyncIterator[str]:
    port = free_port()
    start_s = {"ray": RAY_START_S, "bentoml": BENTOML_START_S}.get(system.kind, 20.0)
    async with serve(system.argv(port, model_url, parallel), port, start_s=start_s) as url:
        yield url
