"""One measured run against a server: the workload it sends, open-loop, closed-loop or wrk
saturation, with the batching counters read around it; and the machine's state while it ran."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import statistics
import subprocess
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import aiohttp

from modelroll_devcluster.sentences import sentence
from modelroll_sidecar.cost_model import MIN_BATCHES

from . import arithmetic, results, wrk
from .figures import BatchSummary, OpenRun
from .lengths import CostModel, Lengths, parse
from .lengths import payload as make_payload
from .loadgen import HEADERS, Body, Length, LoadResult, closed_loop, json_bodies, open_loop
from .metrics import BatchCounters, Watch, scrape
from .systems import demo_model, encoder_model

Progress = Callable[[float], None]
WRK_TIMEOUT_S = 60
"""wrk's own default (2 s) would drop the slow answers of an unbatched server from its figures."""
ModelName = Literal["demo", "encoder"]
LIMIT_BODIES = 256
"""Bodies sent in full batches to measure a real model's limit (about 10 s on the encoder)."""


@dataclass(frozen=True)
class Workload:
    """What every request looks like: ``bodies`` distinct payloads with lengths drawn from
    ``lengths`` (seeded), sent in that order and cycled."""

    lengths: Lengths
    bodies: int = 2000
    seed: int = 1
    sentences: bool = False
    """English sentences of each length in words, for a real model, instead of ``x x x ...``."""

    def sample(self) -> list[int]:
        return self.lengths.sample(self.bodies, self.seed)

    def payloads(self) -> list[str]:
        if not self.sentences:
            return [make_payload(n) for n in self.sample()]
        rng = random.Random(self.seed)
        return [sentence(rng, n) for n in self.sample()]

    def text(self, length: int) -> str:
        """One payload of ``length``, the same on every call (for lone requests)."""
        return sentence(random.Random(length), length) if self.sentences else make_payload(length)

    def json_bodies(self) -> list[str]:
        return [json.dumps({"payload": p}) for p in self.payloads()]

    def body(self) -> Body:
        return json_bodies(list(self.payloads()))

    def length(self) -> Length:
        """The length of the ``i``-th body :meth:`body` gives."""
        sample = self.sample()
        return lambda i: sample[i % len(sample)]


@dataclass(frozen=True)
class Scenario:
    """The model and the request lengths: what compare and sweep hold fixed. ``model`` is
    ``demo`` (modelroll-demo-model at the cost below) or ``encoder`` (modelroll-encoder,
    all-MiniLM-L6-v2 int8 on onnxruntime with one intra-op thread, sent English sentences of
    each length in words; the cost flags do not apply)."""

    lengths: str = "lognormal:3,0.7"
    fixed_ms: float = 10.0
    per_token_ms: float = 0.02
    parallel: int = 1
    seed: int = 1
    model: ModelName = "demo"

    @property
    def cost(self) -> CostModel:
        return CostModel(self.fixed_ms, self.per_token_ms, self.parallel)

    @property
    def workload(self) -> Workload:
        return Workload(parse(self.lengths), seed=self.seed, sentences=self.model == "encoder")

    def serve(self) -> contextlib.AbstractAsyncContextManager[str]:
        """The model's process on loopback, for the length of the block; yields its URL."""
        return demo_model(self.cost) if self.model == "demo" else encoder_model()

    def limit_rps(self, max_batch: int) -> float:
        """The demo model's limit from its cost formula."""
        return self.cost.limit_rps(self.workload.lengths, max_batch, seed=self.seed)

    async def limits_rps(self, url: str, sizes: Sequence[int]) -> dict[int, float]:
        """The model's limit at each batch size: the demo model's from its formula, the
        encoder's measured at ``url`` (full batches of the workload's bodies, arrival order)."""
        if self.model == "demo":
            return {size: self.limit_rps(size) for size in sizes}
        payloads = self.workload.payloads()[:LIMIT_BODIES]
        return {size: await full_batches_rps(url, payloads, size) for size in sizes}

    def describe(self) -> str:
        if self.model == "encoder":
            return (
                "Model: modelroll-encoder, all-MiniLM-L6-v2 int8 ONNX on onnxruntime, one "
                f"intra-op thread; English sentences of {self.lengths} words (seed {self.seed})."
            )
        return (
            f"Demo model: {self.fixed_ms:g} ms + {self.per_token_ms:g} ms x batch size x longest "
            f"length, parallel {self.parallel}; lengths {self.lengths} (seed {self.seed})."
        )

    @staticmethod
    def add_arguments(
        parser: argparse.ArgumentParser,
        results: str = "",
        lengths: str | None = None,
        lengths_help: str = "length distribution",
        *,
        out: bool = True,
    ) -> None:
        """The scenario's flags, and where results and plots go (bench/results/RESULTS.json, or
        with ``out`` False the --out a suite's harness adds); ``lengths``: the default of
        --lengths, when not the scenario's own."""
        d = Scenario()
        parser.add_argument(
            "--lengths", default=lengths or d.lengths, help=f"{lengths_help} (%(default)s)"
        )
        parser.add_argument("--fixed-ms", type=float, default=d.fixed_ms, help="(%(default)s)")
        parser.add_argument(
            "--per-token-ms", type=float, default=d.per_token_ms, help="(%(default)s)"
        )
        parser.add_argument("--parallel", type=int, default=d.parallel, help="(%(default)s)")
        parser.add_argument("--seed", type=int, default=d.seed, help="seeds lengths and arrivals")
        parser.add_argument(
            "--model",
            choices=("demo", "encoder"),
            default=d.model,
            help="demo: modelroll-demo-model at the cost flags; encoder: the real sentence "
            "encoder, int8 (%(default)s)",
        )
        if out:
            parser.add_argument("--out", type=Path, default=Path(f"bench/results/{results}.json"))
        parser.add_argument(
            "--plots", type=Path, default=Path("bench/results"), help="PNG directory (%(default)s)"
        )

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> Scenario:
        parse(args.lengths)  # a bad spec fails here, before anything starts
        return cls(
            args.lengths, args.fixed_ms, args.per_token_ms, args.parallel, args.seed, args.model
        )


def write(report: Any, out: Path) -> None:
    results.write(report, out)
    print(f"Results in {out}")


async def watched(stats_url: str | None, load: Awaitable[LoadResult]) -> dict[str, Any]:
    """Run ``load``; its summary, plus how the server batched meanwhile if ``stats_url`` says."""
    async with Watch(stats_url) as watch:
        result = await load
    return {**result.summary(), "batching": watch.delta and watch.delta.summary()}


async def open_report(
    url: str,
    workload: Workload,
    rate: float,
    duration_s: float,
    *,
    seed: int = 1,
    label: str = "",
    stats_url: str | None = None,
    progress: Progress | None = None,
    slo_ms: float | None = None,
    drain_s: float | None = None,
) -> OpenRun:
    """Poisson arrivals at ``rate`` for ``duration_s``, waiting at most ``drain_s`` after the
    last for answers (open_loop's); besides the summary, latency by length decile, and with
    ``slo_ms`` the requests per second answered within it."""
    async with Watch(stats_url) as watch:
        result = await open_loop(
            url + "/v1/infer",
            workload.body(),
            rate,
            duration_s,
            seed=seed,
            label=label,
            progress=progress,
            length=workload.length(),
            drain_s=drain_s,
        )
    timed = list(zip(result.lengths, result.latencies_s, strict=True))
    return OpenRun(
        load=result.report(),
        batching=watch.delta.report() if watch.delta else None,
        within_slo_rps=None if slo_ms is None else round(result.within_rps(slo_ms / 1000), 1),
        by_length_decile=arithmetic.by_length_decile(result.sent_lengths, timed),
    )


async def closed_run(
    url: str,
    workload: Workload,
    concurrency: int,
    duration_s: float,
    *,
    stats_url: str | None = None,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """``concurrency`` clients back to back for ``duration_s`` (after a 1 s warm-up)."""
    load = closed_loop(
        url + "/v1/infer", workload.body(), concurrency, duration_s, progress=progress
    )
    return await watched(stats_url, load)


async def saturate(
    url: str,
    workload: Workload,
    connections: int,
    duration_s: int,
    *,
    label: str = "",
    stats_url: str | None = None,
) -> Saturated:
    """wrk with ``connections`` keep-alive connections cycling through the workload's bodies."""
    bodies = workload.json_bodies()
    async with Watch(stats_url) as watch:
        result = await asyncio.to_thread(
            wrk.run,
            label,
            url + "/v1/infer",
            bodies,
            connections=connections,
            duration_s=duration_s,
            timeout_s=WRK_TIMEOUT_S,
        )
    return Saturated(result, watch.delta.report() if watch.delta else None)


@dataclass(frozen=True)
class Saturated:
    """One wrk run at saturation, and how the server batched meanwhile (None where its
    counters were not read)."""

    result: wrk.WrkResult
    batching: BatchSummary | None


async def idle(stats_url: str, quiet_s: float = 0.3, timeout_s: float = 60.0) -> BatchCounters:
    """Wait until the model at ``stats_url`` (its ``/v1/stats``) has nothing left to do: a
    server that wrk or a capped open run left with a backlog (they drop their connections, not
    the requests sent) has worked through it. Counters that stay still for ``quiet_s`` are not
    enough when one batch takes longer, so a batch of one is then sent straight to the model:
    it is answered after whatever batch was running, and the model is idle when nothing but it
    ran meanwhile. Returns what those batches of one added to the counters, for a figure that
    spans the wait to leave out."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    probe = json.dumps({"inputs": ["idle"]})
    batch_url = stats_url.removesuffix("/v1/stats") + "/v1/batch"
    probes = 0
    async with aiohttp.ClientSession() as http:
        last = await scrape(http, stats_url)
        still_since = loop.time()
        while loop.time() < deadline:
            await asyncio.sleep(quiet_s / 3)
            now = await scrape(http, stats_url)
            if now.items != last.items:
                last, still_since = now, loop.time()
                continue
            if loop.time() - still_since < quiet_s:
                continue
            async with http.post(batch_url, data=probe, headers=HEADERS) as resp:
                await resp.read()
            probes += 1
            last, still_since = await scrape(http, stats_url), loop.time()
            if last.items - now.items <= 1:  # the batch of one alone: what one probe adds
                one = last - now
                return BatchCounters(
                    probes * one.batches,
                    probes * one.items,
                    {},
                    probes * one.useful_tokens,
                    probes * one.padded_tokens,
                )
    return BatchCounters()


async def sequential_ms(url: str, body: Any, calls: int = 40, warmup: int = 5) -> float:
    """Median time of ``calls`` sequential POSTs of ``body`` to ``url`` over one keep-alive
    connection, after ``warmup`` uncounted ones: what one lone request costs there."""
    data = json.dumps(body).encode()
    times: list[float] = []
    async with aiohttp.ClientSession() as http:
        for i in range(warmup + calls):
            started = time.perf_counter()
            async with http.post(url, data=data, headers=HEADERS) as resp:
                await resp.read()
                resp.raise_for_status()
            if i >= warmup:
                times.append(time.perf_counter() - started)
    return statistics.median(times) * 1000


async def full_batches_rps(url: str, payloads: Sequence[str], size: int) -> float:
    """Requests per second a model serves when sent nothing but full batches of ``size``, one
    after another, straight to its ``POST /v1/batch``, once through ``payloads`` in order."""
    started = time.perf_counter()
    async with aiohttp.ClientSession() as http:
        for i in range(0, len(payloads), size):
            body = json.dumps({"inputs": list(payloads[i : i + size])})
            async with http.post(url + "/v1/batch", data=body, headers=HEADERS) as resp:
                resp.raise_for_status()
                await resp.read()
    return round(len(payloads) / (time.perf_counter() - started), 1)


async def batch_of_one_ms(model_url: str, payload: str) -> float:
    """The measured cost of a batch of one: ``payload`` sent straight to the model's
    ``POST /v1/batch``, alone. The floor of any batcher's latency for one lone request of its
    length: the model's cost plus one local HTTP round trip."""
    return await sequential_ms(model_url + "/v1/batch", {"inputs": [payload]})


async def lone_request_ms(batcher_url: str, payload: str) -> float:
    """One lone request of ``payload`` through a batcher (``POST /v1/infer``), nothing else in
    flight: the batch of one plus the batcher's hop and whatever it waits for company."""
    body = {"payload": payload}
    # The uncounted calls train the adaptive wait's cost fit, which it trusts after MIN_BATCHES.
    return await sequential_ms(batcher_url + "/v1/infer", body, warmup=MIN_BATCHES + 2)


def load_average() -> float:
    """The 1-minute load average (runnable processes); compare it with the CPU count."""
    return os.getloadavg()[0]


def machine() -> dict[str, Any]:
    """What the figures depend on: CPUs, load when the run started, the commit measured (empty
    where there is no git, as on a GPU machine that got a copy of the working tree)."""
    commit = ""
    with contextlib.suppress(OSError):
        commit = subprocess.run(
            ["git", "describe", "--always", "--dirty"], capture_output=True, text=True, check=False
        ).stdout.strip()
    return {"cpus": os.cpu_count(), "load_average_1m": round(load_average(), 2), "commit": commit}


@contextlib.contextmanager
def bar(total: float, desc: str, unit: str = "run") -> Iterator[Any]:
    """A tqdm progress bar on stderr; none when stderr is not a terminal."""
    from tqdm import tqdm  # type: ignore[import-untyped]  # tqdm ships no type information

    with tqdm(total=total, desc=desc, unit=unit, dynamic_ncols=True, disable=None) as progress:
        yield progress
