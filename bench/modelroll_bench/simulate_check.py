"""``make bench-simulate ARGS=--check``: the simulator against the real thing. The real sidecar in
front of the real encoder (int8, one intra-op thread) under Poisson arrivals at three loads, and
the simulator on the same arrivals and the same bodies (their lengths counted in the encoder's
tokens, as the sidecar counts them), for a few configurations: simulated against measured
throughput and p99, and their ratios.

The loads are shares of no batching's saturation as the surface predicts it, so nothing but the
surface is measured before the runs.
"""

from __future__ import annotations

import argparse
import asyncio
from dataclasses import dataclass
from typing import Any

from . import simulate as sim
from .figures import OpenRun
from .lengths import PRESETS, parse
from .runs import Workload, batch_of_one_ms, idle, machine, open_report, write
from .surface import Surface, sentence_tokens, tokenizer_of
from .systems import Batching, System, batcher, encoder_model

CHECKED = (
    ("no batching", Batching(max_batch=1, length_from="tokenizer")),
    ("FIFO 32, 10 ms", Batching(length_from="tokenizer")),
    ("by length", Batching(batch_by="length", length_from="tokenizer")),
    ("by length, auto", Batching(batch_by="length", wait_policy="auto", length_from="tokenizer")),
)
"""Each configuration as the simulator and the sidecar run it: lengths in the encoder's tokens,
max batch 32 and max-wait 10 ms but for no batching; first in first out with a fixed wait, by
length with a fixed wait, and by length with the automatic wait."""
SHARES = (0.3, 0.6, 0.9)
DURATION_S = 10.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--check-shares",
        type=sim._floats,
        default=SHARES,
        help="--check: loads as shares of no batching's simulated saturation (0.3,0.6,0.9)",
    )
    parser.add_argument(
        "--check-duration",
        type=float,
        default=DURATION_S,
        help="--check: seconds of arrivals per configuration and load (%(default)s)",
    )


def ratio(simulated: float, measured: float) -> float | None:
    return round(simulated / measured, 3) if measured else None


@dataclass(frozen=True)
class Pair:
    """One figure simulated and measured, and simulated / measured (None without a measure)."""

    simulated: float | None
    measured: float | None
    ratio: float | None = None

    @classmethod
    def of(cls, simulated: float | None, measured: float | None) -> Pair:
        if simulated is None or measured is None:
            return cls(simulated, measured)
        return cls(simulated, measured, ratio(simulated, measured))

    def text(self) -> str:
        return f"{_number(self.simulated)} / {_number(self.measured)} ({self.ratio or 0:.2f}x)"


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


@dataclass(frozen=True)
class Compared:
    """One configuration at one load: throughput, p50, p99 and the mean batch, simulated and
    measured."""

    label: str
    share: float
    rate_rps: float
    throughput_rps: Pair
    p50_ms: Pair
    p99_ms: Pair
    mean_batch: Pair


@dataclass(frozen=True)
class Checked:
    no_batching_saturation_rps: float
    rows: list[Compared]


@dataclass(frozen=True)
class Report:
    """What ``modelroll-bench simulate --check`` writes."""

    surface: Surface
    surface_path: str
    lengths: str
    machine: dict[str, Any]
    duration_s: float
    found: Checked


def compared(
    label: str, share: float, rate: float, simulated: sim.Figures, measured: OpenRun
) -> Compared:
    """Simulated and measured throughput, p50, p99 and mean batch, and their ratios."""
    load = measured.load
    batching = measured.batching
    return Compared(
        label=label,
        share=share,
        rate_rps=rate,
        throughput_rps=Pair.of(simulated.throughput_rps, load.throughput_rps),
        p50_ms=Pair.of(simulated.p50_ms, load.p50_ms),
        p99_ms=Pair.of(simulated.p99_ms, load.p99_ms),
        mean_batch=Pair(simulated.mean_batch, batching.mean_batch if batching else None),
    )


async def run(
    cost: Surface, spec: str, seed: int, shares: tuple[float, ...], duration_s: float, slo_ms: float
) -> Checked:
    workload = Workload(parse(spec), seed=seed, sentences=True)
    rows = []
    async with encoder_model() as model:
        lengths = sentence_tokens(workload, await tokenizer_of(model))
        alone = CHECKED[0][1]
        saturation = await asyncio.to_thread(
            sim.saturation_rps, alone, cost, lengths, sim.REQUESTS, seed
        )
        print(
            f"English sentences of {spec} words (seed {seed}), in the encoder's tokens: longest "
            f"{max(lengths)}. No batching's simulated saturation {saturation:.1f} req/s.",
            flush=True,
        )
        await batch_of_one_ms(model, workload.text(20))  # the encoder's first calls are slow
        print(
            f"{'configuration':<18} {'load':>5} {'req/s':>6}  {'throughput sim/meas':>22}  "
            f"{'p99 ms sim/meas':>22}  {'mean batch sim/meas':>20}"
        )
        for label, config in CHECKED:
            async with batcher(System(label, "sidecar", config), model, 1) as url:
                for share in shares:
                    rate = share * saturation
                    measured = await open_report(
                        url,
                        workload,
                        rate,
                        duration_s,
                        seed=seed,
                        label=label,
                        stats_url=model + "/v1/stats",
                        slo_ms=slo_ms,
                    )
                    await idle(model + "/v1/stats")
                    trace = sim.Trace.poisson(rate, duration_s, lengths, seed)
                    # In a thread: the simulation runs its own (virtual-time) event loop.
                    result = await asyncio.to_thread(sim.simulate, config, cost, trace)
                    found = compared(label, share, rate, result.figures(slo_ms), measured)
                    rows.append(found)
                    print(line(found), flush=True)
    return Checked(round(saturation, 2), rows)


def line(found: Compared) -> str:
    batch = found.mean_batch
    return (
        f"{found.label:<18} {found.share:>5.0%} {found.rate_rps:>6.1f}  "
        f"{found.throughput_rps.text():>22}  {found.p99_ms.text():>22}  "
        f"{_number(batch.simulated):>9} / {_number(batch.measured)}"
    )


def main(args: argparse.Namespace, cost: Surface) -> int:
    spec = PRESETS.get(args.lengths, args.lengths)
    found = asyncio.run(
        run(cost, spec, args.seed, args.check_shares, args.check_duration, args.slo_ms)
    )
    report = Report(cost, str(args.surface), spec, machine(), args.check_duration, found)
    write(report, args.out or sim.DEFAULT_SURFACE.with_name("simulate-check.json"))
    return 0
