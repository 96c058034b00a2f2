"""``make bench-gateway``: what the gateway adds, measured against the same servers in one run.

1. Added latency at moderate load: Poisson arrivals at a fixed rate, alternating between calling a
   sidecar directly and calling it through the gateway (zero-cost demo model behind the sidecar).
   Added p50/p99 = through-gateway minus direct, per round; the median round is reported.
2. Request rate of one gateway process at saturation (wrk), against a bare aiohttp echo server in
   the same run, alternating. The gateway forwards to an echo server of its own. With --pin (the
   default on 2+ CPUs) the server under test has CPU 0 to itself; wrk and the gateway's upstream
   share CPU 1, so both arms measure one server process on one core.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import sys
import tempfile
from collections.abc import AsyncIterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from modelroll_sidecar.demo import free_port, process

from . import wrk
from .loadgen import json_bodies, open_loop

MODEL = "bench"
PAYLOAD = "a short review of a good film"


@dataclass(frozen=True)
class Setup:
    rate: float = 200.0
    """Requests per second in the latency comparison ("moderate load")."""
    latency_s: int = 10
    """Seconds per latency run."""
    duration_s: int = 8
    """Seconds per saturation run."""
    connections: int = 64
    rounds: int = 3
    pin: bool = True
    event_loop: str = "asyncio"
    """The gateway's event loop (asyncio: like for like with the echo server; or uvloop)."""


def _pin(pid: int, cpu: int, setup: Setup) -> None:
    if setup.pin:
        os.sched_setaffinity(pid, {cpu})


@contextlib.asynccontextmanager
async def serve(
    module: str, args: list[str], port: int, cpu: int, setup: Setup
) -> AsyncIterator[str]:
    """Run ``python -m module args`` until the block ends; yields its base URL."""
    url = f"http://127.0.0.1:{port}"
    async with process([module, *args], url + "/readyz") as proc:
        _pin(proc.pid, cpu, setup)
        yield url


@contextlib.asynccontextmanager
async def gateway_to(upstream: str, setup: Setup, cpu: int = 0) -> AsyncIterator[str]:
    """A gateway whose one model routes every request to `upstream`."""
    with tempfile.TemporaryDirectory(prefix="modelroll-bench-") as tmp:
        routes = Path(tmp, "routes.json")
        version = {"name": "v1", "weight": 1, "endpoint": upstream}
        await asyncio.to_thread(
            routes.write_text, json.dumps({MODEL: {"model": MODEL, "versions": [version]}})
        )
        port = free_port()
        args = ["--host", "127.0.0.1", "--port", str(port), "--routes-file", str(routes)]
        args += ["--event-loop", setup.event_loop, "--log-level", "WARNING"]
        async with serve("modelroll_gateway", args, port, cpu, setup) as url:
            yield url


async def latency_comparison(setup: Setup) -> dict[str, Any]:
    """p50/p99 of direct sidecar calls against the same calls through the gateway."""
    bodies = json_bodies([PAYLOAD])
    mport, sport = free_port(), free_port()
    model_args = ["--port", str(mport), "--fixed-ms", "0", "--per-token-ms", "0"]
    sidecar_args = ["--port", str(sport), "--upstream", f"http://127.0.0.1:{mport}"]
    sidecar_args += ["--model", MODEL, "--version", "v1", "--max-wait-ms", "1"]
    rounds: list[dict[str, Any]] = []
    async with (
        serve("modelroll_sidecar.demo_model", model_args, mport, 1, setup),
        serve("modelroll_sidecar", sidecar_args, sport, 1, setup) as sidecar,
        gateway_to(sidecar, setup) as gateway,
    ):
        arms = {
            "direct": sidecar + "/v1/infer",
            "gateway": gateway + f"/v1/models/{MODEL}/infer",
        }
        await open_loop(arms["gateway"], bodies, setup.rate, 2, label="warm-up")
        for r in range(setup.rounds):
            row: dict[str, Any] = {}
            for label, url in arms.items():
                result = await open_loop(
                    url, bodies, setup.rate, setup.latency_s, seed=r, label=label
                )
                row[label] = result.summary()
            row["added_p50_ms"] = round(row["gateway"]["p50_ms"] - row["direct"]["p50_ms"], 3)
            row["added_p99_ms"] = round(row["gateway"]["p99_ms"] - row["direct"]["p99_ms"], 3)
            rounds.append(row)
            direct, through = row["direct"], row["gateway"]
            print(
                f"  latency round {r + 1}: direct p50 {direct['p50_ms']:.2f} "
                f"p99 {direct['p99_ms']:.2f} ms | gateway p50 {through['p50_ms']:.2f} "
                f"p99 {through['p99_ms']:.2f} ms | added p50 {row['added_p50_ms']:+.2f} "
                f"p99 {row['added_p99_ms']:+.2f} ms | errors {direct['errors'] or 0}/"
                f"{through['errors'] or 0}",
                flush=True,
            )
    p50s = [row["added_p50_ms"] for row in rounds]
    p99s = [row["added_p99_ms"] for row in rounds]
    return {
        "rate_rps": setup.rate,
        "rounds": rounds,
        "added_p50_ms": {"median": statistics.median(p50s), "min": min(p50s), "max": max(p50s)},
        "added_p99_ms": {"median": statistics.median(p99s), "min": min(p99s), "max": max(p99s)},
    }


async def rate_comparison(setup: Setup) -> dict[str, Any]:
    """Saturation rate of one gateway process against a bare aiohttp echo server."""
    body = json.dumps({"payload": PAYLOAD})
    bare_port, upstream_port = free_port(), free_port()
    runs: dict[str, list[float]] = {"echo": [], "gateway": []}
    failures: dict[str, int] = {"echo": 0, "gateway": 0}
    async with (
        serve("modelroll_bench.echo", [str(bare_port)], bare_port, 0, setup) as echo,
        serve("modelroll_bench.echo", [str(upstream_port)], upstream_port, 1, setup) as upstream,
        gateway_to(upstream, setup) as gateway,
    ):
        arms = {"echo": echo + "/v1/infer", "gateway": gateway + f"/v1/models/{MODEL}/infer"}
        for r in range(setup.rounds):
            for label, url in arms.items():
                result = await asyncio.to_thread(
                    wrk.run,
                    label,
                    url,
                    body,
                    connections=setup.connections,
                    duration_s=setup.duration_s,
                )
                runs[label].append(result.rps)
                failures[label] += result.non_2xx + result.socket_errors
                print(
                    f"  rate round {r + 1}: {label:<8} {result.rps:8.1f} req/s  "
                    f"p50 {result.p50_ms:.2f} ms  p99 {result.p99_ms:.2f} ms  "
                    f"non-2xx {result.non_2xx}  socket errors {result.socket_errors}",
                    flush=True,
                )
    ratios = [g / e for g, e in zip(runs["gateway"], runs["echo"], strict=True)]
    echo_rps, gateway_rps = statistics.median(runs["echo"]), statistics.median(runs["gateway"])
    return {
        "runs_rps": runs,
        "failures": failures,
        "echo_median_rps": echo_rps,
        "gateway_median_rps": gateway_rps,
        "ratio": round(gateway_rps / echo_rps, 3),
        "round_ratios": [round(x, 3) for x in ratios],
    }


def verdicts(report: dict[str, Any]) -> list[tuple[str, bool, str]]:
    lat, rate = report["latency"], report["rate"]
    p50 = lat["added_p50_ms"]
    return [
        (
            f"added p50 <= 1 ms at {lat['rate_rps']:g} req/s",
            p50["median"] <= 1.0,
            f"{p50['median']:.2f} ms (rounds {p50['min']:.2f}..{p50['max']:.2f}); "
            f"added p99 {lat['added_p99_ms']['median']:.2f} ms",
        ),
        (
            "one gateway process >= 50% of a bare aiohttp echo server's rate",
            rate["ratio"] >= 0.5 and rate["failures"]["gateway"] == 0,
            f"{rate['gateway_median_rps']:.0f} / {rate['echo_median_rps']:.0f} req/s = "
            f"{rate['ratio']:.1%} (rounds {min(rate['round_ratios']):.1%}.."
            f"{max(rate['round_ratios']):.1%})",
        ),
    ]


async def run(setup: Setup) -> dict[str, Any]:
    pinned = "server under test on CPU 0, load and upstreams on CPU 1" if setup.pin else "unpinned"
    print(f"Gateway event loop: {setup.event_loop}; {pinned}.", flush=True)
    if setup.pin:
        os.sched_setaffinity(0, {1})  # this process and wrk (its child) stay off CPU 0
    report = {"latency": await latency_comparison(setup), "rate": await rate_comparison(setup)}
    report["setup"] = asdict(setup)
    return report


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="make bench-gateway", description=__doc__)
    parser.add_argument("--rate", type=float, default=Setup.rate, help="req/s for latency runs")
    parser.add_argument("--latency-seconds", type=int, default=Setup.latency_s)
    parser.add_argument("--duration", type=int, default=Setup.duration_s, help="s per wrk run")
    parser.add_argument("--connections", type=int, default=Setup.connections)
    parser.add_argument("--rounds", type=int, default=Setup.rounds, help="alternating rounds")
    parser.add_argument("--event-loop", choices=["asyncio", "uvloop"], default=Setup.event_loop)
    parser.add_argument(
        "--no-pin", dest="pin", action="store_false", help="do not pin processes to CPUs"
    )
    parser.add_argument("--out", type=Path, default=Path("bench/results/gateway.json"))
    args = parser.parse_args(argv)
    pin = args.pin and len(os.sched_getaffinity(0)) >= 2
    setup = Setup(
        rate=args.rate,
        latency_s=args.latency_seconds,
        duration_s=args.duration,
        connections=args.connections,
        rounds=args.rounds,
        pin=pin,
        event_loop=args.event_loop,
    )
    report = asyncio.run(run(setup))
    checks = verdicts(report)
    report["targets"] = [{"target": t, "met": ok, "measured": m} for t, ok, m in checks]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))
    print("\nTargets:")
    for target, ok, measured in checks:
        print(f"  [{'met' if ok else 'MISSED'}] {target}: {measured}")
    print(f"Results in {args.out}")
    sys.exit(0 if all(ok for _, ok, _ in checks) else 1)


if __name__ == "__main__":
    main()
