"""``make bench-sidecar``: the sidecar against no batching and the classic sleep-then-drain
micro-batcher, all in front of the same demo model in one run, reported as ratios.

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
import statistics
from collections.abc import Awaitable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TypeVar

from modelroll_devcluster.processes import free_port

from . import wrk
from .loadgen import json_bodies, open_loop
from .metrics import Watch
from .runs import idle
from .servers import finish, serve_module

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


async def batching_comparison(setup: Setup) -> dict[str, Any]:
    body = json.dumps({"payload": setup.payload})
    bodies = json_bodies([setup.payload])
    report: dict[str, Any] = {"saturation": {}, "fixed_rates": {}}
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
                report["saturation"][label] = {
                    **asdict(sat),
                    "of_model_limit": round(sat.rps / setup.model_limit_rps, 3),
                    "mean_batch": mean_batch and round(mean_batch, 1),
                }
                print(
                    f"  saturation  {label:<17} {sat.rps:8.1f} req/s "
                    f"= {sat.rps / setup.model_limit_rps:6.1%} of the model's limit"
                    f"  (mean batch {_batch(mean_batch)}, non-2xx {sat.non_2xx})",
                    flush=True,
                )
                await idle(stats)  # wrk leaves a backlog: not part of the next row's batches
                rows = []
                for share in (0.3, 0.5, 0.7, 0.9):
                    rate = share * setup.model_limit_rps
                    if rate > sat.rps * 0.9:
                        print(f"  {share:.0%} load    {label:<17} skipped: beyond its saturation")
                        rows.append({"share": share, "skipped": "offered rate beyond saturation"})
                        continue
                    result, mean_batch = await mean_batch_during(
                        stats,
                        open_loop(url + "/v1/infer", bodies, rate, setup.duration_s, label=label),
                    )
                    row = {
                        "share": share,
                        **result.summary(),
                        "mean_batch": mean_batch and round(mean_batch, 2),
                    }
                    rows.append(row)
                    print(
                        f"  {share:.0%} load    {label:<17} p50 {row['p50_ms']:7.1f}  "
                        f"p95 {row['p95_ms']:7.1f}  p99 {row['p99_ms']:7.1f} ms  "
                        f"mean batch {_batch(mean_batch)}  errors {row['errors'] or 0}",
                        flush=True,
                    )
                report["fixed_rates"][label] = rows
    return report


def _batch(mean: float | None) -> str:
    return "-" if mean is None else f"{mean:.1f}"


async def zero_cost_comparison(setup: Setup, rounds: int) -> dict[str, Any]:
    """Sidecar (zero-cost model behind it) against a bare aiohttp echo server on the sidecar's
    event loop and JSON functions, alternated. Besides requests per second (which other processes
    on the machine disturb), reports each server's CPU time per request, which they disturb much
    less, and the ratio of every round's pair."""
    body = json.dumps({"payload": setup.payload})
    runs: dict[str, list[float]] = {"echo": [], "sidecar": []}
    cpu_us: dict[str, list[float]] = {"echo": [], "sidecar": []}
    mport, sport, eport = free_port(), free_port(), free_port()
    model_args = ["--port", str(mport), "--fixed-ms", "0", "--per-token-ms", "0"]
    async with (
        serve_module("modelroll_standins.model", model_args, mport) as model,
        serve_module(
            "modelroll_sidecar", sidecar_args(sport, model.url, setup.max_batch, setup), sport
        ) as sidecar,
        serve_module("modelroll_bench.echo", [str(eport), EVENT_LOOP, ECHO_JSON], eport) as echo,
    ):
        for _ in range(rounds):
            for label, server in (("echo", echo), ("sidecar", sidecar)):
                cpu_before = server.cpu_seconds()
                result = await asyncio.to_thread(saturate, label, server.url, setup, body)
                cpu = (server.cpu_seconds() - cpu_before) / result.requests * 1e6
                runs[label].append(result.rps)
                cpu_us[label].append(round(cpu, 1))
                print(
                    f"  zero-cost   {label:<17} {result.rps:8.1f} req/s  {cpu:5.1f} us CPU/request",
                    flush=True,
                )
    echo_rps, sidecar_rps = statistics.median(runs["echo"]), statistics.median(runs["sidecar"])
    echo_cpu, sidecar_cpu = statistics.median(cpu_us["echo"]), statistics.median(cpu_us["sidecar"])
    paired = [s / e for s, e in zip(runs["sidecar"], runs["echo"], strict=True) if e]
    return {
        "echo": {"event_loop": EVENT_LOOP, "json": ECHO_JSON},
        "sidecar_event_loop": EVENT_LOOP,
        "runs_rps": runs,
        "cpu_us_per_request": cpu_us,
        "echo_median_rps": echo_rps,
        "sidecar_median_rps": sidecar_rps,
        "ratio": round(sidecar_rps / echo_rps, 3),
        "paired_ratios": [round(r, 3) for r in paired],
        "cpu_ratio": round(echo_cpu / sidecar_cpu, 3),
    }


def verdicts(setup: Setup, report: dict[str, Any]) -> list[tuple[str, bool, str]]:
    sat = report["saturation"]["sidecar"]["rps"]
    at70 = next(r for r in report["fixed_rates"]["sidecar"] if r["share"] == 0.7)
    ratio = report["zero_cost"]["ratio"]
    return [
        (
            "saturation >= 95% of the model's limit",
            sat >= 0.95 * setup.model_limit_rps,
            f"{sat:.1f} of {setup.model_limit_rps:.1f} req/s ({sat / setup.model_limit_rps:.1%})",
        ),
        (
            "p99 at 70% load <= 1.1 x (max(max-wait, C) + C) + 2 ms",
            at70["p99_ms"] <= setup.p99_bound_ms,
            f"{at70['p99_ms']:.1f} ms against {setup.p99_bound_ms:.1f} ms",
        ),
        (
            f"zero-cost model: sidecar >= 70% of an aiohttp echo server ({EVENT_LOOP}, the "
            "sidecar's JSON functions)",
            ratio >= 0.7,
            f"{ratio:.1%} by median req/s ({report['zero_cost']['sidecar_median_rps']:.0f} / "
            f"{report['zero_cost']['echo_median_rps']:.0f}); "
            f"{report['zero_cost']['cpu_ratio']:.1%} by CPU time per request",
        ),
    ]


async def run(setup: Setup, rounds: int) -> dict[str, Any]:
    print(
        f"Demo model: {setup.fixed_ms:g} ms + {setup.per_token_ms:g} ms/token, parallel "
        f"{setup.parallel}; payloads of {setup.tokens} tokens; sidecar max batch "
        f"{setup.max_batch}, max-wait {setup.max_wait_ms:g} ms, event loop {EVENT_LOOP}."
        "\nFull batch costs C = "
        f"{setup.full_batch_cost_ms:.1f} ms, so the model's limit is "
        f"{setup.model_limit_rps:.1f} req/s.",
        flush=True,
    )
    report = await batching_comparison(setup)
    report["zero_cost"] = await zero_cost_comparison(setup, rounds)
    report["setup"] = {
        **asdict(setup),
        "full_batch_cost_ms": setup.full_batch_cost_ms,
        "model_limit_rps": setup.model_limit_rps,
        "p99_bound_ms": setup.p99_bound_ms,
    }
    return report


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="make bench-sidecar", description=__doc__)
    parser.add_argument("--duration", type=int, default=Setup.duration_s, help="seconds per run")
    parser.add_argument("--rounds", type=int, default=3, help="alternating echo/sidecar rounds")
    parser.add_argument("--out", type=Path, default=Path("bench/results/sidecar.json"))
    args = parser.parse_args(argv)
    setup = Setup(duration_s=args.duration)
    report = asyncio.run(run(setup, args.rounds))
    finish(report, verdicts(setup, report), args.out)


if __name__ == "__main__":
    main()
