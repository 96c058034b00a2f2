"""``make bench-gateway``: what the gateway adds, measured against the same servers in one run.

1. Added latency at moderate load: Poisson arrivals at a fixed rate, alternating between calling a
   sidecar directly and calling it through the gateway (zero-cost demo model behind the sidecar).
   Added p50/p99 = through-gateway minus direct, per round; the median round is reported. One
   more gateway routes by sticky cohorts (two versions, requests keyed by 1000 users in turn):
   its p50/p99 less the round robin gateway's, paired by round, is what sticky routing costs.
   Another copies 10% of its requests to a shadow version whose model takes 10 ms and fails
   half its items: its p50/p99 less the plain gateway's is what shadow traffic costs clients.
   Nothing is pinned here: under contention a pinned process waits for its CPU.
2. Request rate of one gateway process at saturation (wrk), against a bare aiohttp echo server in
   the same run, alternating in short rounds; the target is judged on the median of the paired
   (same-round) ratios, which other load on the machine disturbs least. The ceiling is fair: each
   gateway event loop is compared with an echo server on that same loop (and the same json
   module). The gateway forwards to an echo server of its own. Unless --no-pin (and given 2+
   CPUs) the server under test has CPU 0 to itself; wrk and the gateway's upstream share CPU 1,
   so both arms measure one server process on one core. CPU time per request (from /proc) is
   reported beside the rates.
Every gateway event loop given is measured in the same rounds; targets are judged on the first.

``--baseline-python`` adds one more gateway arm to both parts, on the first event loop: the
gateway of another checkout (say, the last release, in a ``git worktree`` with its own
``make venv``), run by that checkout's interpreter, so a change is judged before and after in the
same rounds, as paired ratios.
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

from modelroll_devcluster.processes import free_port

from . import wrk
from .loadgen import json_bodies, open_loop
from .servers import Server, finish, serve_module
from .stats import Spread, spread

MODEL = "bench"
BASELINE = "baseline"
"""The label of the other checkout's gateway (``--baseline-python``)."""
PAYLOAD = "a short review of a good film"
COHORT_HEADER = "X-User-Id"
STICKY = "sticky"
"""The label suffix of the arm whose gateway routes by sticky cohorts (a key per user)."""
USERS = 1000
"""The keys the sticky arm's requests carry, in turn."""
SHADOWED = "shadow"
"""The label suffix of the arm whose gateway copies a share of its requests to a shadow."""
SHADOW_PERCENT = 10
SHADOW_MODEL = ("--fixed-ms", "10", "--per-token-ms", "0", "--error-rate", "0.5")
"""The shadow's model: 10 ms a call where the served one takes none, half its items failing."""


@dataclass(frozen=True)
class Setup:
    rate: float = 200.0
    """Requests per second in the latency comparison ("moderate load")."""
    latency_s: int = 4
    """Seconds per latency run."""
    duration_s: int = 3
    """Seconds per saturation run."""
    connections: int = 64
    rounds: int = 9
    pin: bool = True
    event_loops: tuple[str, ...] = ("uvloop", "asyncio")
    """Gateway event loops to measure, each against an echo ceiling on the same loop; the targets
    are judged on the first (uvloop, the gateway's default)."""
    baseline_python: str | None = None
    """The interpreter of another checkout whose gateway is measured beside this one's."""


def _cpu(cpu: int | None, setup: Setup) -> int | None:
    """The CPU to pin a server to, when pinning is on."""
    return cpu if setup.pin else None


@contextlib.asynccontextmanager
async def gateway_to(
    upstream: str,
    setup: Setup,
    event_loop: str,
    cpu: int | None,
    python: str = sys.executable,
    *,
    sticky: bool = False,
    shadow: str | None = None,
) -> AsyncIterator[Server]:
    """A gateway on `event_loop` whose one model routes every request to `upstream`; `python`
    runs it (another checkout's, for the baseline). With `sticky`, the model has two versions
    at 50/50, both at `upstream`, and sticky cohorts keyed by COHORT_HEADER; with `shadow`, a
    version at that URL gets copies of SHADOW_PERCENT of the requests."""
    with tempfile.TemporaryDirectory(prefix="modelroll-bench-") as tmp:
        routes = Path(tmp, "routes.json")
        route: dict[str, Any] = {
            "model": MODEL,
            "versions": [{"name": "v1", "weight": 1, "endpoint": upstream}],
        }
        if sticky:
            route["versions"].append({"name": "v2", "weight": 1, "endpoint": upstream})
            route["cohortHeader"] = COHORT_HEADER
        if shadow is not None:
            copies = {"name": "shadow", "weight": 0, "endpoint": shadow, "shadow": SHADOW_PERCENT}
            route["versions"].append(copies)
        await asyncio.to_thread(routes.write_text, json.dumps({MODEL: route}))
        port = free_port()
        args = ["--host", "127.0.0.1", "--port", str(port), "--routes-file", str(routes)]
        args += ["--event-loop", event_loop, "--log-level", "WARNING"]
        if python == sys.executable:
            # No metrics are read here: no admin port, so that the arms running at once do not
            # all take its default. (The baseline, one arm, may predate --admin-port.)
            args += ["--admin-port", "0"]
        async with serve_module(
            "modelroll_gateway", args, port, _cpu(cpu, setup), python
        ) as server:
            yield server


def _gateways(setup: Setup) -> list[tuple[str, str, str]]:
    """The gateway arms: label, event loop and interpreter (the baseline's last)."""
    arms = [(f"gateway/{loop}", loop, sys.executable) for loop in setup.event_loops]
    if setup.baseline_python is not None:
        loop = setup.event_loops[0]
        arms.append((f"{BASELINE}/{loop}", loop, setup.baseline_python))
    return arms


async def latency_comparison(setup: Setup) -> dict[str, Any]:
    """p50/p99 of direct sidecar calls against the same calls through each gateway."""
    bodies = json_bodies([PAYLOAD])
    rounds: list[dict[str, Any]] = []
    async with contextlib.AsyncExitStack() as stack:

        async def version(name: str, model_flags: Sequence[str]) -> Server:
            """A demo model with ``model_flags`` behind a sidecar serving version ``name``."""
            mport, sport = free_port(), free_port()
            model_args = ["--port", str(mport), *model_flags]
            sidecar_args = ["--port", str(sport), "--upstream", f"http://127.0.0.1:{mport}"]
            sidecar_args += ["--model", MODEL, "--version", name, "--max-wait-ms", "1"]
            await stack.enter_async_context(
                serve_module("modelroll_standins.model", model_args, mport)
            )
            return await stack.enter_async_context(
                serve_module("modelroll_sidecar", sidecar_args, sport)
            )

        sidecar = await version("v1", ("--fixed-ms", "0", "--per-token-ms", "0"))
        shadow = await version("shadow", SHADOW_MODEL)
        arms = {"direct": sidecar.url + "/v1/infer"}
        for label, loop, python in _gateways(setup):
            gateway = await stack.enter_async_context(
                gateway_to(sidecar.url, setup, loop, None, python)
            )
            arms[label] = gateway.url + f"/v1/models/{MODEL}/infer"
        sticky_label = f"gateway/{setup.event_loops[0]} {STICKY}"
        sticky = await stack.enter_async_context(
            gateway_to(sidecar.url, setup, setup.event_loops[0], None, sticky=True)
        )
        arms[sticky_label] = sticky.url + f"/v1/models/{MODEL}/infer"
        shadow_label = f"gateway/{setup.event_loops[0]} {SHADOWED}"
        shadowed = await stack.enter_async_context(
            gateway_to(sidecar.url, setup, setup.event_loops[0], None, shadow=shadow.url)
        )
        arms[shadow_label] = shadowed.url + f"/v1/models/{MODEL}/infer"
        users = [
            {"Content-Type": "application/json", COHORT_HEADER: f"user-{i}"} for i in range(USERS)
        ]
        headers = {sticky_label: lambda i: users[i % USERS]}
        for label, url in arms.items():
            await open_loop(url, bodies, setup.rate, 2, label="warm-up", headers=headers.get(label))
        for r in range(setup.rounds):
            row: dict[str, Any] = {}
            for label, url in arms.items():
                result = await open_loop(
                    url,
                    bodies,
                    setup.rate,
                    setup.latency_s,
                    seed=r,
                    label=label,
                    headers=headers.get(label),
                )
                row[label] = result.summary()
            direct = row["direct"]
            line = [
                f"  latency round {r + 1}: direct p50 {direct['p50_ms']:.2f} "
                f"p99 {direct['p99_ms']:.2f} ms"
            ]
            for label in (*(g[0] for g in _gateways(setup)), sticky_label, shadow_label):
                through = row[label]
                through["added_p50_ms"] = round(through["p50_ms"] - direct["p50_ms"], 3)
                through["added_p99_ms"] = round(through["p99_ms"] - direct["p99_ms"], 3)
                line.append(
                    f"{label}: added p50 {through['added_p50_ms']:+.2f} "
                    f"p99 {through['added_p99_ms']:+.2f} ms, errors {through['errors'] or 0}"
                )
            rounds.append(row)
            print(" | ".join(line), flush=True)
    added = {
        label.removeprefix("gateway/"): {
            "added_p50_ms": spread(row[label]["added_p50_ms"] for row in rounds),
            "added_p99_ms": spread(row[label]["added_p99_ms"] for row in rounds),
        }
        for label in (*(g[0] for g in _gateways(setup)), sticky_label, shadow_label)
    }
    plain = f"gateway/{setup.event_loops[0]}"

    def over_plain(label: str) -> dict[str, Spread | None]:
        return {
            f"{q}_ms": spread(row[label][f"{q}_ms"] - row[plain][f"{q}_ms"] for row in rounds)
            for q in ("p50", "p99")
        }

    return {
        "rate_rps": setup.rate,
        "rounds": rounds,
        "added": added,
        "sticky_over_plain": over_plain(sticky_label),
        "shadow_over_plain": over_plain(shadow_label),
        "shadow_errors": sum(row[shadow_label]["errors"] or 0 for row in rounds),
    }


async def rate_comparison(setup: Setup) -> dict[str, Any]:
    """Saturation rate of one gateway process against a bare aiohttp echo server.

    Also the CPU time the server under test spends per request (from /proc), which other load
    on the machine disturbs far less than the rate: echo's CPU per request over the gateway's is
    the rate ratio one uncontended core would show.
    """
    body = json.dumps({"payload": PAYLOAD})
    loops = setup.event_loops
    gateways = _gateways(setup)
    ceiling = {label: f"echo/{loop}" for label, loop, _ in gateways}
    labels = [*(f"echo/{loop}" for loop in loops), *ceiling]
    runs: dict[str, list[float]] = {label: [] for label in labels}
    cpu_us: dict[str, list[float]] = {label: [] for label in labels}
    failures: dict[str, int] = dict.fromkeys(labels, 0)
    async with contextlib.AsyncExitStack() as stack:

        async def echo_on(loop: str, cpu: int) -> Server:
            port = free_port()
            return await stack.enter_async_context(
                serve_module("modelroll_bench.echo", [str(port), loop], port, _cpu(cpu, setup))
            )

        upstream = await echo_on(loops[0], 1)
        arms: dict[str, tuple[str, Server]] = {}
        for loop in loops:
            echo = await echo_on(loop, 0)
            arms[f"echo/{loop}"] = (echo.url + "/v1/infer", echo)
        for label, loop, python in gateways:
            gateway = await stack.enter_async_context(
                gateway_to(upstream.url, setup, loop, 0, python)
            )
            arms[label] = (gateway.url + f"/v1/models/{MODEL}/infer", gateway)
        for r in range(setup.rounds):
            for label, (url, server) in arms.items():
                cpu_before = server.cpu_seconds()
                result = await asyncio.to_thread(
                    wrk.run,
                    label,
                    url,
                    body,
                    connections=setup.connections,
                    duration_s=setup.duration_s,
                )
                used = (server.cpu_seconds() - cpu_before) / max(result.requests, 1) * 1e6
                runs[label].append(result.rps)
                cpu_us[label].append(round(used, 1))
                failures[label] += result.non_2xx + result.socket_errors
                print(
                    f"  rate round {r + 1}: {label:<16} {result.rps:8.1f} req/s  "
                    f"CPU {used:6.1f} us/req  p50 {result.p50_ms:.2f} ms  "
                    f"p99 {result.p99_ms:.2f} ms  non-2xx {result.non_2xx}  "
                    f"socket errors {result.socket_errors}",
                    flush=True,
                )
    ratios = {
        label: [round(g / e, 3) for g, e in zip(runs[label], runs[echo], strict=True)]
        for label, echo in ceiling.items()
    }
    medians = {label: statistics.median(values) for label, values in runs.items()}
    cpu_medians = {label: statistics.median(values) for label, values in cpu_us.items()}
    report: dict[str, Any] = {
        "runs_rps": runs,
        "cpu_us_per_request": cpu_us,
        "failures": failures,
        "median_rps": medians,
        "median_cpu_us_per_request": cpu_medians,
        "ceiling": ceiling,
        "ratio_of_echo": {
            label: round(medians[label] / medians[echo], 3) for label, echo in ceiling.items()
        },
        "paired_ratio_of_echo": {
            label: statistics.median(values) for label, values in ratios.items()
        },
        "cpu_ratio_of_echo": {
            label: round(cpu_medians[echo] / cpu_medians[label], 3)
            for label, echo in ceiling.items()
        },
        "round_ratios": ratios,
    }
    if setup.baseline_python is not None:
        this, baseline = gateways[0][0], gateways[-1][0]
        report["vs_baseline"] = {
            "rate_ratios": [
                round(a / b, 3) for a, b in zip(runs[this], runs[baseline], strict=True)
            ],
            "cpu_ratios": [
                round(b / a, 3) for a, b in zip(cpu_us[this], cpu_us[baseline], strict=True)
            ],
        }
    return report


def verdicts(report: dict[str, Any], judged: str) -> list[tuple[str, bool, str]]:
    """The targets, judged on the gateway running on the `judged` event loop; with a
    baseline, also that this gateway is not slower than the baseline's."""
    lat, rate = report["latency"], report["rate"]
    label, echo = f"gateway/{judged}", f"echo/{judged}"
    p50, p99 = lat["added"][judged]["added_p50_ms"], lat["added"][judged]["added_p99_ms"]
    ratios = rate["round_ratios"][label]
    return [
        (
            f"added p50 <= 1 ms at {lat['rate_rps']:g} req/s ({judged})",
            p50.median <= 1.0,
            f"{p50.median:.2f} ms (rounds {p50.low:.2f}..{p50.high:.2f}); "
            f"added p99 {p99.median:.2f} ms (rounds {p99.low:.2f}..{p99.high:.2f})",
        ),
        (
            f"one gateway process ({judged}) >= 50% of a bare aiohttp echo server's rate "
            f"(same loop)",
            rate["paired_ratio_of_echo"][label] >= 0.5 and rate["failures"][label] == 0,
            f"median of paired rounds {rate['paired_ratio_of_echo'][label]:.1%} "
            f"(rounds {min(ratios):.1%}..{max(ratios):.1%}); medians "
            f"{rate['median_rps'][label]:.0f} / {rate['median_rps'][echo]:.0f} req/s; "
            f"by CPU per request {rate['cpu_ratio_of_echo'][label]:.1%} "
            f"({rate['median_cpu_us_per_request'][echo]:.0f} against "
            f"{rate['median_cpu_us_per_request'][label]:.0f} us)",
        ),
        _sticky(lat),
        _shadowed(lat),
        *_baseline(rate),
    ]


def _sticky(lat: dict[str, Any]) -> tuple[str, bool, str]:
    """What sticky cohorts cost over the weighted round robin, paired by round."""
    p50, p99 = lat["sticky_over_plain"]["p50_ms"], lat["sticky_over_plain"]["p99_ms"]
    return (
        "sticky cohorts add <= 0.25 ms p50 over the weighted round robin (same rounds)",
        p50.median <= 0.25,
        f"{p50.median:+.3f} ms (rounds {p50.low:+.3f}..{p50.high:+.3f}); p99 "
        f"{p99.median:+.3f} ms (rounds {p99.low:+.3f}..{p99.high:+.3f}); "
        f"{USERS} keys over two versions",
    )


def _shadowed(lat: dict[str, Any]) -> tuple[str, bool, str]:
    """What copying 10% of the requests to a slow, failing shadow costs the clients."""
    p50, p99 = lat["shadow_over_plain"]["p50_ms"], lat["shadow_over_plain"]["p99_ms"]
    return (
        f"{SHADOW_PERCENT}% shadow traffic to a 10 ms model failing half its items adds <= "
        "0.25 ms p50 and no client error (same rounds)",
        p50.median <= 0.25 and lat["shadow_errors"] == 0,
        f"{p50.median:+.3f} ms (rounds {p50.low:+.3f}..{p50.high:+.3f}); p99 "
        f"{p99.median:+.3f} ms (rounds {p99.low:+.3f}..{p99.high:+.3f}); client "
        f"errors {lat['shadow_errors']}",
    )


def _baseline(rate: dict[str, Any]) -> list[tuple[str, bool, str]]:
    """This gateway's rate against the baseline's, paired by round (none without a baseline)."""
    paired = rate.get("vs_baseline")
    if paired is None:
        return []
    rates, cpus = paired["rate_ratios"], paired["cpu_ratios"]
    median, cpu = statistics.median(rates), statistics.median(cpus)
    return [
        (
            "this gateway's rate >= the baseline's (same rounds)",
            median >= 1.0,
            f"median of paired rounds {median:.1%} of the baseline's rate "
            f"(rounds {min(rates):.1%}..{max(rates):.1%}); by CPU per request {cpu:.1%} "
            f"(rounds {min(cpus):.1%}..{max(cpus):.1%})",
        )
    ]


async def run(setup: Setup) -> dict[str, Any]:
    pinned = "rate runs pinned: gateways and echo on CPU 0, wrk and upstreams on CPU 1"
    print(
        f"Gateway event loops: {', '.join(setup.event_loops)}; "
        f"{pinned if setup.pin else 'unpinned'}.",
        flush=True,
    )
    report = {"latency": await latency_comparison(setup)}
    if setup.pin:
        os.sched_setaffinity(0, {1})  # this process and wrk (its child) stay off CPU 0
    report["rate"] = await rate_comparison(setup)
    report["setup"] = asdict(setup)
    return report


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="make bench-gateway", description=__doc__)
    parser.add_argument("--rate", type=float, default=Setup.rate, help="req/s for latency runs")
    parser.add_argument("--latency-seconds", type=int, default=Setup.latency_s)
    parser.add_argument("--duration", type=int, default=Setup.duration_s, help="s per wrk run")
    parser.add_argument("--connections", type=int, default=Setup.connections)
    parser.add_argument("--rounds", type=int, default=Setup.rounds, help="alternating rounds")
    parser.add_argument(
        "--event-loops",
        default=",".join(Setup.event_loops),
        help="comma-separated gateway event loops; the targets are judged on the first",
    )
    parser.add_argument(
        "--no-pin", dest="pin", action="store_false", help="do not pin processes to CPUs"
    )
    parser.add_argument(
        "--baseline-python",
        help="the python of another checkout's virtualenv (e.g. ../before/.venv/bin/python): "
        "its gateway is measured in the same rounds, on the first event loop",
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
        event_loops=tuple(args.event_loops.split(",")),
        baseline_python=args.baseline_python,
    )
    report = asyncio.run(run(setup))
    finish(report, verdicts(report, setup.event_loops[0]), args.out)


if __name__ == "__main__":
    main()
