"""``make bench-gateway`` (``modelroll-bench gateway``): what the gateway adds, measured against
the same servers in one run.

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
import sys
import tempfile
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from modelroll_devcluster.processes import free_port

from . import wrk
from .figures import LoadSummary, PairedRatio, Rate
from .loadgen import json_bodies, open_loop
from .servers import Check, Server, serve_module
from .stats import Spread, spread
from .suite import Suite, markdown

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


@dataclass(frozen=True)
class LatencyRound:
    """One round of the latency part: every arm's open-loop run, by label."""

    by_arm: dict[str, LoadSummary]


@dataclass(frozen=True)
class RateRound:
    """One round of the rate part: every arm's saturation run, by label."""

    by_arm: dict[str, Rate]


@dataclass(frozen=True)
class Measured:
    latency: list[LatencyRound]
    rate: list[RateRound]


@dataclass(frozen=True)
class Over:
    """One arm's p50 and p99 less another's, paired by round; and the arm's client errors."""

    arm: str
    p50_ms: Spread | None
    p99_ms: Spread | None
    errors: int


@dataclass(frozen=True)
class ArmRate:
    """One gateway arm's rate against the echo server on its loop (its ceiling)."""

    arm: str
    ceiling: str
    rps: Spread | None
    ceiling_rps: Spread | None
    of_ceiling: PairedRatio
    """The arm's rate over the ceiling's, paired by round."""
    cpu_us: Spread | None
    ceiling_cpu_us: Spread | None
    failures: int


@dataclass(frozen=True)
class VsBaseline:
    """This checkout's gateway against the baseline's, paired by round: rate, and CPU per
    request (the baseline's over this one's, so above 1 is better for both)."""

    rate: PairedRatio
    cpu: PairedRatio


@dataclass(frozen=True)
class Summary:
    rate_rps: float
    added: list[Over]
    """Each gateway arm (plain, sticky, shadowed) over calling the sidecar directly."""
    sticky: Over
    """The sticky arm over the plain gateway on the same loop."""
    shadowed: Over
    """The shadowed arm over the plain gateway on the same loop."""
    rates: list[ArmRate]
    vs_baseline: VsBaseline | None


def _arms(setup: Setup) -> tuple[str, str, list[str]]:
    """The sticky arm's label, the shadowed arm's, and every gateway arm of the latency part."""
    sticky = f"gateway/{setup.event_loops[0]} {STICKY}"
    shadowed = f"gateway/{setup.event_loops[0]} {SHADOWED}"
    return sticky, shadowed, [*(g[0] for g in _gateways(setup)), sticky, shadowed]


async def latency_comparison(setup: Setup) -> list[LatencyRound]:
    """p50/p99 of direct sidecar calls against the same calls through each gateway."""
    bodies = json_bodies([PAYLOAD])
    rounds: list[LatencyRound] = []
    sticky_label, shadow_label, gateways = _arms(setup)
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
        sticky = await stack.enter_async_context(
            gateway_to(sidecar.url, setup, setup.event_loops[0], None, sticky=True)
        )
        arms[sticky_label] = sticky.url + f"/v1/models/{MODEL}/infer"
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
            row: dict[str, LoadSummary] = {}
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
                row[label] = result.report()
            direct = row["direct"]
            line = [f"  latency round {r + 1}: direct {direct.latency.text()}"]
            for label in gateways:
                through = row[label]
                line.append(
                    f"{label}: added p50 {_minus(through.p50_ms, direct.p50_ms)} "
                    f"p99 {_minus(through.p99_ms, direct.p99_ms)} ms, "
                    f"errors {through.error_count}"
                )
            rounds.append(LatencyRound(row))
            print(" | ".join(line), flush=True)
    return rounds


def _difference(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else round(a - b, 3)


def _minus(a: float | None, b: float | None) -> str:
    found = _difference(a, b)
    return "-" if found is None else f"{found:+.2f}"


def over(rounds: Sequence[LatencyRound], arm: str, base: str) -> Over:
    """``arm``'s p50 and p99 less ``base``'s, round by round."""
    pairs = [(r.by_arm[arm], r.by_arm[base]) for r in rounds]
    return Over(
        arm=arm,
        p50_ms=spread(_difference(a.p50_ms, b.p50_ms) for a, b in pairs),
        p99_ms=spread(_difference(a.p99_ms, b.p99_ms) for a, b in pairs),
        errors=sum(a.error_count for a, _ in pairs),
    )


async def rate_comparison(setup: Setup) -> list[RateRound]:
    """Saturation rate of one gateway process against a bare aiohttp echo server.

    Also the CPU time the server under test spends per request (from /proc), which other load
    on the machine disturbs far less than the rate: echo's CPU per request over the gateway's is
    the rate ratio one uncontended core would show.
    """
    body = json.dumps({"payload": PAYLOAD})
    loops = setup.event_loops
    rounds: list[RateRound] = []
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
        for label, loop, python in _gateways(setup):
            gateway = await stack.enter_async_context(
                gateway_to(upstream.url, setup, loop, 0, python)
            )
            arms[label] = (gateway.url + f"/v1/models/{MODEL}/infer", gateway)
        for r in range(setup.rounds):
            found: dict[str, Rate] = {}
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
                found[label] = Rate(
                    result.rps, round(used, 1), result.non_2xx + result.socket_errors
                )
                print(
                    f"  rate round {r + 1}: {label:<16} {result.rps:8.1f} req/s  "
                    f"CPU {used:6.1f} us/req  p50 {result.p50_ms:.2f} ms  "
                    f"p99 {result.p99_ms:.2f} ms  non-2xx {result.non_2xx}  "
                    f"socket errors {result.socket_errors}",
                    flush=True,
                )
            rounds.append(RateRound(found))
    return rounds


def arm_rate(rounds: Sequence[RateRound], arm: str, ceiling: str) -> ArmRate:
    rps = [r.by_arm[arm].rps for r in rounds]
    ceiling_rps = [r.by_arm[ceiling].rps for r in rounds]
    return ArmRate(
        arm=arm,
        ceiling=ceiling,
        rps=spread(rps, 1),
        ceiling_rps=spread(ceiling_rps, 1),
        of_ceiling=PairedRatio.of(rps, ceiling_rps),
        cpu_us=spread((r.by_arm[arm].cpu_us_per_request for r in rounds), 1),
        ceiling_cpu_us=spread((r.by_arm[ceiling].cpu_us_per_request for r in rounds), 1),
        failures=sum(r.by_arm[arm].failures for r in rounds),
    )


def vs_baseline(setup: Setup, rounds: Sequence[RateRound]) -> VsBaseline | None:
    gateways = _gateways(setup)
    if setup.baseline_python is None:
        return None
    this, baseline = gateways[0][0], gateways[-1][0]
    ours = [r.by_arm[this] for r in rounds]
    theirs = [r.by_arm[baseline] for r in rounds]
    return VsBaseline(
        rate=PairedRatio.of([a.rps for a in ours], [b.rps for b in theirs]),
        cpu=PairedRatio.of(
            [b.cpu_us_per_request for b in theirs], [a.cpu_us_per_request for a in ours]
        ),
    )


def summarize(setup: Setup, measured: Measured) -> Summary:
    sticky, shadowed, gateways = _arms(setup)
    plain = f"gateway/{setup.event_loops[0]}"
    return Summary(
        rate_rps=setup.rate,
        added=[over(measured.latency, arm, "direct") for arm in gateways],
        sticky=over(measured.latency, sticky, plain),
        shadowed=over(measured.latency, shadowed, plain),
        rates=[arm_rate(measured.rate, arm, f"echo/{loop}") for arm, loop, _ in _gateways(setup)],
        vs_baseline=vs_baseline(setup, measured.rate),
    )


def _rounds(
    found: Spread | None, fmt: str = "+.2f", unit: str = " ms", rounds: str = "rounds "
) -> str:
    """``median unit (rounds low..high)``; ``-`` for a figure no round had."""
    if found is None:
        return "-"
    low, high = format(found.low, fmt), format(found.high, fmt)
    return f"{format(found.median, fmt)}{unit} ({rounds}{low}..{high})"


def _median(found: Spread | None, fmt: str = ".0f") -> str:
    return "-" if found is None else format(found.median, fmt)


def _ratio(found: PairedRatio) -> str:
    return _rounds(found.spread, ".1%", "")


def _over_row(name: str, found: Over) -> list[str]:
    p50, p99 = (_rounds(v, rounds="") for v in (found.p50_ms, found.p99_ms))
    return [name, p50, p99, str(found.errors)]


def render(setup: Setup, summary: Summary) -> str:
    """The tables docs/performance.md shows: what each gateway arm adds over calling the sidecar
    directly, what sticky cohorts and shadow traffic add over the plain gateway, and one gateway
    process's rate against the echo server on its loop."""
    added = markdown(
        ["arm", "added p50: median (rounds)", "added p99: median (rounds)", "client errors"],
        [_over_row(o.arm.removeprefix("gateway/"), o) for o in summary.added],
    )
    features = markdown(
        [
            "arm",
            "p50 over the plain gateway: median (rounds)",
            "p99: median (rounds)",
            "client errors",
        ],
        [
            _over_row("sticky cohorts", summary.sticky),
            _over_row(f"{SHADOW_PERCENT}% shadow", summary.shadowed),
        ],
    )
    rates = markdown(
        [
            "arm",
            "req/s, median",
            "ceiling req/s",
            "% of the ceiling, paired (rounds)",
            "CPU per request, us (ceiling's)",
            "failures",
        ],
        [
            [
                f"{a.arm} against {a.ceiling}",
                _median(a.rps),
                _median(a.ceiling_rps),
                _ratio(a.of_ceiling),
                f"{_median(a.cpu_us, '.1f')} ({_median(a.ceiling_cpu_us, '.1f')})",
                str(a.failures),
            ]
            for a in summary.rates
        ],
    )
    lines = [
        "",
        f"Added latency at {summary.rate_rps:g} req/s ({setup.rounds} rounds of "
        f"{setup.latency_s} s), through minus direct, paired by round:",
        "",
        added,
        "",
        features,
        "",
        f"One gateway process at saturation (wrk, {setup.connections} connections, "
        f"{setup.duration_s} s, {setup.rounds} rounds):",
        "",
        rates,
    ]
    if summary.vs_baseline is not None:
        lines += [
            "",
            f"This gateway over the baseline's, paired by round: rate "
            f"{_ratio(summary.vs_baseline.rate)}, by CPU per request "
            f"{_ratio(summary.vs_baseline.cpu)}.",
        ]
    return "\n".join(lines)


def checks(setup: Setup, summary: Summary) -> list[Check]:
    """The targets, judged on the gateway running on the first event loop; with a baseline,
    also that this gateway is not slower than the baseline's."""
    judged = setup.event_loops[0]
    [added] = [o for o in summary.added if o.arm == f"gateway/{judged}"]
    [rate] = [a for a in summary.rates if a.arm == f"gateway/{judged}"]
    p50, ratio = added.p50_ms, rate.of_ceiling.spread
    return [
        (
            f"added p50 <= 1 ms at {summary.rate_rps:g} req/s ({judged})",
            p50 is not None and p50.median <= 1.0,
            f"{_rounds(p50, '.2f')}; added p99 {_rounds(added.p99_ms, '.2f')}",
        ),
        (
            f"one gateway process ({judged}) >= 50% of a bare aiohttp echo server's rate "
            f"(same loop)",
            ratio is not None and ratio.median >= 0.5 and rate.failures == 0,
            f"median of paired rounds {_ratio(rate.of_ceiling)}; medians "
            f"{_median(rate.rps)} / {_median(rate.ceiling_rps)} req/s; by CPU per request "
            f"{_percent(rate.ceiling_cpu_us, rate.cpu_us)} ({_median(rate.ceiling_cpu_us)} "
            f"against {_median(rate.cpu_us)} us)",
        ),
        (
            "sticky cohorts add <= 0.25 ms p50 over the weighted round robin (same rounds)",
            _at_most(summary.sticky.p50_ms, 0.25),
            f"{_rounds(summary.sticky.p50_ms, '+.3f')}; p99 "
            f"{_rounds(summary.sticky.p99_ms, '+.3f')}; {USERS} keys over two versions",
        ),
        (
            f"{SHADOW_PERCENT}% shadow traffic to a 10 ms model failing half its items adds <= "
            "0.25 ms p50 and no client error (same rounds)",
            _at_most(summary.shadowed.p50_ms, 0.25) and summary.shadowed.errors == 0,
            f"{_rounds(summary.shadowed.p50_ms, '+.3f')}; p99 "
            f"{_rounds(summary.shadowed.p99_ms, '+.3f')}; client errors "
            f"{summary.shadowed.errors}",
        ),
        *_baseline(summary.vs_baseline),
    ]


def _at_most(found: Spread | None, bound: float) -> bool:
    return found is not None and found.median <= bound


def _percent(numerator: Spread | None, denominator: Spread | None) -> str:
    """The ratio of two medians, as a percentage."""
    if numerator is None or denominator is None or not denominator.median:
        return "-"
    return f"{numerator.median / denominator.median:.1%}"


def _baseline(found: VsBaseline | None) -> list[Check]:
    """This gateway's rate against the baseline's, paired by round (none without a baseline)."""
    if found is None:
        return []
    rate = found.rate.spread
    return [
        (
            "this gateway's rate >= the baseline's (same rounds)",
            rate is not None and rate.median >= 1.0,
            f"median of paired rounds {_ratio(found.rate)} of the baseline's rate; by CPU per "
            f"request {_ratio(found.cpu)}",
        )
    ]


class GatewaySuite(Suite[Setup, Measured, Summary]):
    name = "gateway"
    help = "the gateway's added p50/p99 and its rate against a bare aiohttp echo server"
    description = __doc__ or ""
    setup_type = Setup
    measured_type = Measured

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
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

    def setup(self, args: argparse.Namespace) -> Setup:
        return Setup(
            rate=args.rate,
            latency_s=args.latency_seconds,
            duration_s=args.duration,
            connections=args.connections,
            rounds=args.rounds,
            pin=args.pin and len(os.sched_getaffinity(0)) >= 2,
            event_loops=tuple(args.event_loops.split(",")),
            baseline_python=args.baseline_python,
        )

    async def measure(self, setup: Setup) -> Measured:
        pinned = "rate runs pinned: gateways and echo on CPU 0, wrk and upstreams on CPU 1"
        print(
            f"Gateway event loops: {', '.join(setup.event_loops)}; "
            f"{pinned if setup.pin else 'unpinned'}.",
            flush=True,
        )
        latency = await latency_comparison(setup)
        if setup.pin:
            os.sched_setaffinity(0, {1})  # this process and wrk (its child) stay off CPU 0
        return Measured(latency, await rate_comparison(setup))

    summarize = staticmethod(summarize)
    render = staticmethod(render)
    checks = staticmethod(checks)


SUITE = GatewaySuite()
