"""``make bench-sidecar`` (``modelroll-bench sidecar``): the sidecar against no batching and the
classic sleep-then-drain micro-batcher, all in front of the same demo model in one run, reported
as ratios.

1. Throughput at saturation (wrk, closed loop), against the model's own limit:
   parallel x max batch size / cost of a full batch.
2. p50/p95/p99 at fixed Poisson arrival rates (30/50/70/90% of that limit).
3. With a zero-cost model: the sidecar's request rate against a bare aiohttp echo server running
   on the sidecar's event loop (uvloop when installed) with the sidecar's JSON functions
   (``protocol.decode`` and ``protocol.encode``), so the ceiling does everything the sidecar does
   except batching; both in the same run, alternated.

Every mean batch size is the demo model's (its ``/v1/stats``: items over batches it ran while the
row was measured), so the rows of all three batchers are counted the same way.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import TypeVar

from modelroll_devcluster.processes import free_port

from . import wrk
from .figures import Latency, LoadSummary, PairedRatio, Rate
from .loadgen import json_bodies, open_loop
from .metrics import Watch
from .runs import idle
from .servers import Check, serve_module
from .stats import Spread, spread
from .suite import Suite, markdown

T = TypeVar("T")
EVENT_LOOP = "uvloop" if importlib.util.find_spec("uvloop") is not None else "asyncio"
"""The sidecar's loop by default (``--event-loop auto``), named, so that echo runs on it too."""
ECHO_JSON = "sidecar"
"""echo.py's JSON functions: the sidecar's own."""


@dataclass(frozen=True)
class Setup:
    fixed_ms: float = 20.0
    per_token_ms: float = 0.05
    parallel: int = 1
    tokens: int = 16
    max_batch: int = 32
    max_wait_ms: float = 10.0
    duration_s: int = 8
    connections: int = 128
    rounds: int = 3
    """Alternating echo/sidecar rounds with the zero-cost model."""
    shares: tuple[float, ...] = (0.3, 0.5, 0.7, 0.9)
    """The fixed arrival rates, as fractions of the model's limit."""

    @property
    def full_batch_cost_ms(self) -> float:
        return self.fixed_ms + self.per_token_ms * self.max_batch * self.tokens

    @property
    def model_limit_rps(self) -> float:
        return self.parallel * self.max_batch / (self.full_batch_cost_ms / 1000)

    @property
    def p99_bound_ms(self) -> float:
        cost = self.full_batch_cost_ms
        return 1.1 * (max(self.max_wait_ms, cost) + cost) + 2

    @property
    def payload(self) -> str:
        return " ".join(["tok"] * self.tokens)


def sidecar_args(port: int, upstream: str, max_batch: int, setup: Setup) -> list[str]:
    return [
        *("--port", str(port), "--upstream", upstream, "--max-batch-size", str(max_batch)),
        *("--max-wait-ms", str(setup.max_wait_ms), "--max-concurrent-batches", str(setup.parallel)),
        *("--max-queue-size", "4096", "--event-loop", EVENT_LOOP),
    ]


@dataclass(frozen=True)
class AtShare:
    """One system at one fixed arrival rate; no load where that rate was beyond its saturation."""

    share: float
    load: LoadSummary | None = None
    mean_batch: float | None = None


@dataclass(frozen=True)
class SystemRun:
    """One batcher in front of the demo model: saturation, then each fixed rate."""

    label: str
    saturation: wrk.WrkResult
    mean_batch: float | None
    shares: list[AtShare]


@dataclass(frozen=True)
class ZeroCostRound:
    """One round of the zero-cost comparison: echo, then the sidecar."""

    echo: Rate
    sidecar: Rate


@dataclass(frozen=True)
class Measured:
    systems: list[SystemRun]
    zero_cost: list[ZeroCostRound]
    event_loop: str = EVENT_LOOP
    echo_json: str = ECHO_JSON


@dataclass(frozen=True)
class Row:
    """One system's row of the table."""

    label: str
    saturation_rps: float
    of_model_limit: float
    mean_batch: float | None
    at_share: list[Latency | None]
    """p50/p95/p99 at each of the setup's shares; None where it was overloaded."""


@dataclass(frozen=True)
class ZeroCost:
    """The sidecar against the echo server, zero-cost model: medians and ranges over rounds."""

    echo_rps: Spread | None
    sidecar_rps: Spread | None
    ratio: float | None
    """The sidecar's median rate over echo's."""
    paired: PairedRatio
    """The sidecar's rate over echo's of the same round."""
    echo_cpu_us: Spread | None
    sidecar_cpu_us: Spread | None
    cpu_ratio: float | None
    """Echo's median CPU per request over the sidecar's."""


@dataclass(frozen=True)
class Summary:
    model_limit_rps: float
    rows: list[Row]
    zero_cost: ZeroCost


async def mean_batch_during(stats_url: str, run: Awaitable[T]) -> tuple[T, float | None]:
    """``run``'s result, and the mean size of the batches the model ran meanwhile (its own
    counters at ``stats_url``; None when it ran none)."""
    async with Watch(stats_url) as watch:
        result = await run
    return result, watch.delta.mean_batch if watch.delta else None


def warm_up(label: str, url: str, setup: Setup, body: str) -> None:
    """One second of wrk that is not counted: connections opening and the first batches filling
    are not steady state."""
    wrk.run(label, url + "/v1/infer", body, connections=setup.connections, duration_s=1)


def saturate(label: str, url: str, setup: Setup, body: str) -> wrk.WrkResult:
    """Closed-loop saturation with wrk, after a warm-up."""
    warm_up(label, url, setup, body)
    return measured_saturation(label, url, setup, body)


def measured_saturation(label: str, url: str, setup: Setup, body: str) -> wrk.WrkResult:
    target = url + "/v1/infer"
    return wrk.run(label, target, body, connections=setup.connections, duration_s=setup.duration_s)


async def batching_comparison(setup: Setup) -> list[SystemRun]:
    body = json.dumps({"payload": setup.payload})
    bodies = json_bodies([setup.payload])
    found: list[SystemRun] = []
    mport = free_port()
    model_args = ["--port", str(mport), "--fixed-ms", str(setup.fixed_ms)]
    model_args += ["--per-token-ms", str(setup.per_token_ms), "--parallel", str(setup.parallel)]
    async with serve_module("modelroll_standins.model", model_args, mport) as model_server:
        model = model_server.url
        stats = model + "/v1/stats"
        ports = free_port(), free_port(), free_port()
        systems = {
            "no batching": ("modelroll_sidecar", sidecar_args(ports[0], model, 1, setup)),
            "sidecar": ("modelroll_sidecar", sidecar_args(ports[1], model, setup.max_batch, setup)),
            "sleep-then-drain": (
                "modelroll_bench.classic",
                [str(ports[2]), model, str(setup.max_batch), str(setup.max_wait_ms)],
            ),
        }
        for (label, (module, args)), port in zip(systems.items(), ports, strict=True):
            async with serve_module(module, args, port) as server:
                url = server.url
                await asyncio.to_thread(warm_up, label, url, setup, body)
                sat, mean_batch = await mean_batch_during(
                    stats, asyncio.to_thread(measured_saturation, label, url, setup, body)
                )
                print(
                    f"  saturation  {label:<17} {sat.rps:8.1f} req/s "
                    f"= {sat.rps / setup.model_limit_rps:6.1%} of the model's limit"
                    f"  (mean batch {_batch(mean_batch)}, non-2xx {sat.non_2xx})",
                    flush=True,
                )
                await idle(stats)  # wrk leaves a backlog: not part of the next row's batches
                rows = []
                for share in setup.shares:
                    rate = share * setup.model_limit_rps
                    if rate > sat.rps * 0.9:
                        print(f"  {share:.0%} load    {label:<17} skipped: beyond its saturation")
                        rows.append(AtShare(share))
                        continue
                    result, batch = await mean_batch_during(
                        stats,
                        open_loop(url + "/v1/infer", bodies, rate, setup.duration_s, label=label),
                    )
                    load = result.report()
                    rows.append(AtShare(share, load, batch and round(batch, 2)))
                    print(
                        f"  {share:.0%} load    {label:<17} {load.latency.text()}  "
                        f"mean batch {_batch(batch)}  errors {load.error_count}",
                        flush=True,
                    )
                found.append(SystemRun(label, sat, mean_batch and round(mean_batch, 1), rows))
    return found


def _batch(mean: float | None) -> str:
    return "-" if mean is None else f"{mean:.1f}"


async def zero_cost_comparison(setup: Setup) -> list[ZeroCostRound]:
    """Sidecar (zero-cost model behind it) against a bare aiohttp echo server on the sidecar's
    event loop and JSON functions, alternated. Besides requests per second (which other processes
    on the machine disturb), each server's CPU time per request, which they disturb much less."""
    body = json.dumps({"payload": setup.payload})
    rounds: list[ZeroCostRound] = []
    mport, sport, eport = free_port(), free_port(), free_port()
    model_args = ["--port", str(mport), "--fixed-ms", "0", "--per-token-ms", "0"]
    async with (
        serve_module("modelroll_standins.model", model_args, mport) as model,
        serve_module(
            "modelroll_sidecar", sidecar_args(sport, model.url, setup.max_batch, setup), sport
        ) as sidecar,
        serve_module("modelroll_bench.echo", [str(eport), EVENT_LOOP, ECHO_JSON], eport) as echo,
    ):
        for _ in range(setup.rounds):
            pair: dict[str, Rate] = {}
            for label, server in (("echo", echo), ("sidecar", sidecar)):
                cpu_before = server.cpu_seconds()
                result = await asyncio.to_thread(saturate, label, server.url, setup, body)
                cpu = (server.cpu_seconds() - cpu_before) / result.requests * 1e6
                failed = result.non_2xx + result.socket_errors
                pair[label] = Rate(result.rps, round(cpu, 1), failed)
                print(
                    f"  zero-cost   {label:<17} {result.rps:8.1f} req/s  {cpu:5.1f} us CPU/request",
                    flush=True,
                )
            rounds.append(ZeroCostRound(**pair))
    return rounds


def _ratio(value: Spread | None, base: Spread | None) -> float | None:
    """The ratio of two medians over rounds."""
    if value is None or base is None or not base.median:
        return None
    return round(value.median / base.median, 3)


def zero_cost_summary(rounds: list[ZeroCostRound]) -> ZeroCost:
    echo = [r.echo.rps for r in rounds]
    sidecar = [r.sidecar.rps for r in rounds]
    echo_cpu = spread(r.echo.cpu_us_per_request for r in rounds)
    sidecar_cpu = spread(r.sidecar.cpu_us_per_request for r in rounds)
    return ZeroCost(
        echo_rps=spread(echo, 1),
        sidecar_rps=spread(sidecar, 1),
        ratio=_ratio(spread(sidecar), spread(echo)),
        paired=PairedRatio.of(sidecar, echo),
        echo_cpu_us=echo_cpu,
        sidecar_cpu_us=sidecar_cpu,
        cpu_ratio=_ratio(echo_cpu, sidecar_cpu),
    )


def row(setup: Setup, run: SystemRun) -> Row:
    by_share = {a.share: a for a in run.shares}
    return Row(
        label=run.label,
        saturation_rps=run.saturation.rps,
        of_model_limit=round(run.saturation.rps / setup.model_limit_rps, 3),
        mean_batch=run.mean_batch,
        at_share=[
            found.load.latency if (found := by_share.get(s)) and found.load else None
            for s in setup.shares
        ],
    )


def summarize(setup: Setup, measured: Measured) -> Summary:
    return Summary(
        model_limit_rps=round(setup.model_limit_rps, 1),
        rows=[row(setup, run) for run in measured.systems],
        zero_cost=zero_cost_summary(measured.zero_cost),
    )


def render(setup: Setup, summary: Summary) -> str:
    """The table docs/performance.md shows, and the zero-cost comparison under it."""
    head = [
        "",
        f"throughput at saturation (wrk, {setup.connections} connections, {setup.duration_s} s)",
        *(f"p50 / p95 / p99 at {s:.0%} of the limit" for s in setup.shares),
    ]
    rows = []
    for r in summary.rows:
        batch = "" if r.mean_batch is None else f" (mean batch {r.mean_batch:.1f})"
        sat = f"{r.saturation_rps:.1f} req/s = {r.of_model_limit:.1%} of the limit{batch}"
        cells = ["overloaded" if lat is None else lat.text() for lat in r.at_share]
        rows.append([r.label, sat, *cells])
    zero = summary.zero_cost
    return "\n".join(
        [
            "",
            f"Model limit {summary.model_limit_rps:g} req/s (C = {setup.full_batch_cost_ms:.1f} "
            "ms a full batch).",
            "",
            markdown(head, rows),
            "",
            f"Zero-cost model, {setup.rounds} alternating rounds: sidecar "
            f"{_spread(zero.sidecar_rps)} req/s against echo's {_spread(zero.echo_rps)} "
            f"({_percent(zero.ratio)}; per round "
            f"{', '.join(f'{r:.1%}' for r in zero.paired.by_round)}); CPU per request "
            f"{_spread(zero.sidecar_cpu_us)} us against echo's {_spread(zero.echo_cpu_us)} us.",
        ]
    )


def _spread(found: Spread | None) -> str:
    if found is None:
        return "-"
    return f"{found.median:,.1f} ({found.low:,.1f}-{found.high:,.1f})"


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def checks(setup: Setup, summary: Summary) -> list[Check]:
    [sidecar] = [r for r in summary.rows if r.label == "sidecar"]
    at70 = dict(zip(setup.shares, sidecar.at_share, strict=True)).get(0.7)
    p99 = None if at70 is None else at70.p99_ms
    zero = summary.zero_cost
    return [
        (
            "saturation >= 95% of the model's limit",
            sidecar.saturation_rps >= 0.95 * setup.model_limit_rps,
            f"{sidecar.saturation_rps:.1f} of {setup.model_limit_rps:.1f} req/s "
            f"({sidecar.of_model_limit:.1%})",
        ),
        (
            "p99 at 70% load <= 1.1 x (max(max-wait, C) + C) + 2 ms",
            p99 is not None and p99 <= setup.p99_bound_ms,
            f"{'-' if p99 is None else f'{p99:.1f}'} ms against {setup.p99_bound_ms:.1f} ms",
        ),
        (
            f"zero-cost model: sidecar >= 70% of an aiohttp echo server ({EVENT_LOOP}, the "
            "sidecar's JSON functions)",
            zero.ratio is not None and zero.ratio >= 0.7,
            f"{_percent(zero.ratio)} by median req/s ({_median(zero.sidecar_rps)} / "
            f"{_median(zero.echo_rps)}); {_percent(zero.cpu_ratio)} by CPU time per request",
        ),
    ]


def _median(found: Spread | None) -> str:
    return "-" if found is None else f"{found.median:.0f}"


class SidecarSuite(Suite[Setup, Measured, Summary]):
    name = "sidecar"
    help = "the sidecar against no batching and a sleep-then-drain batcher, and an echo server"
    description = __doc__ or ""
    setup_type = Setup
    measured_type = Measured

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--duration", type=int, default=Setup.duration_s, help="seconds per run"
        )
        parser.add_argument(
            "--rounds", type=int, default=Setup.rounds, help="alternating echo/sidecar rounds"
        )

    def setup(self, args: argparse.Namespace) -> Setup:
        return Setup(duration_s=args.duration, rounds=args.rounds)

    async def measure(self, setup: Setup) -> Measured:
        print(
            f"Demo model: {setup.fixed_ms:g} ms + {setup.per_token_ms:g} ms/token, parallel "
            f"{setup.parallel}; payloads of {setup.tokens} tokens; sidecar max batch "
            f"{setup.max_batch}, max-wait {setup.max_wait_ms:g} ms, event loop {EVENT_LOOP}."
            "\nFull batch costs C = "
            f"{setup.full_batch_cost_ms:.1f} ms, so the model's limit is "
            f"{setup.model_limit_rps:.1f} req/s.",
            flush=True,
        )
        systems = await batching_comparison(setup)
        return Measured(systems, await zero_cost_comparison(setup))

    summarize = staticmethod(summarize)
    render = staticmethod(render)
    checks = staticmethod(checks)


SUITE = SidecarSuite()
