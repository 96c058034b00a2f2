"""``make bench-llm``'s and ``make bench-llama``'s result shapes and their figures in words:
ratios that respect lower bounds, the lines printed as the run goes, the summary tables at its
end, the TTFT target judged, and beside it (for information) what modelroll costs beyond as many
bare aiohttp hops.

A figure named in a row's ``at_least`` is only a lower bound (streams cut before they got there,
:mod:`.llm_load`); a ratio with such a figure on one side is a bound too, and says which way.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from .llm_counters import EngineSummary
from .llm_load import StreamSummary
from .servers import Check
from .stats import Spread

LATENCY_KEYS = tuple(f"{n}_{p}_ms" for n in ("ttft", "e2e") for p in ("p50", "p95", "p99"))
RATIO_KEYS = ("output_tps", *LATENCY_KEYS)
OVERHEAD_KEYS = ("ttft_p50_ms", "ttft_p95_ms", "ttft_p99_ms", "e2e_p50_ms")
TARGET_MS = 1.0
"""What the sidecar and the gateway together may add to TTFT at p50."""
JUDGED = "gateway+sidecar"
DIRECT = "direct"


def bounded_ratio(
    num: float | None, num_exact: bool, den: float | None, den_exact: bool
) -> tuple[float | None, str]:
    """``num / den`` and what it is: ``=`` exact; ``<=`` when only the denominator is a lower
    bound (the true one can only be larger); ``>=`` when only the numerator is; no value when
    both are bounds, one is missing, or the denominator is 0."""
    if num is None or den is None or den == 0 or not (num_exact or den_exact):
        return None, ""
    relation = "=" if num_exact and den_exact else ("<=" if num_exact else ">=")
    return round(num / den, 3), relation


@dataclass(frozen=True)
class Ratio:
    """One figure's ratio and what it is: ``=`` exact, ``<=`` or ``>=`` a bound, ``""`` (with
    no value) when nothing can be said."""

    ratio: float | None
    relation: str

    def text(self) -> str:
        if self.ratio is None:
            return "-"
        relation = "" if self.relation == "=" else self.relation
        return f"{relation}{self.ratio:.2f}x"


def ratios(a: StreamSummary, b: StreamSummary) -> dict[str, Ratio]:
    """``a``'s figures over ``b``'s, by figure (RATIO_KEYS)."""
    return {
        key: Ratio(*bounded_ratio(a.value(key), a.exact(key), b.value(key), b.exact(key)))
        for key in RATIO_KEYS
    }


def figure(row: StreamSummary, key: str, digits: int = 0) -> str:
    """A row's figure for a table: ``>=`` before a lower bound, ``-`` when there is none."""
    value = row.value(key)
    if value is None:
        return "-"
    return ("" if row.exact(key) else ">=") + f"{value:.{digits}f}"


def ratio_text(found: Ratio | None) -> str:
    return "-" if found is None else found.text()


def _share(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def latencies(row: StreamSummary, name: str) -> str:
    return " / ".join(figure(row, f"{name}_{p}_ms") for p in ("p50", "p95", "p99"))


# -- the shapes -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Saturation:
    """One scheduler at saturation: the engine's counters over the window, and the requests that
    started and ended within it."""

    scheduler: str
    streams: int
    engine: EngineSummary
    clients: StreamSummary


@dataclass(frozen=True)
class SchedulerRun:
    """One scheduler's Poisson run at one rate: the clients' figures, the engine's counters."""

    clients: StreamSummary
    engine: EngineSummary
    load_average_1m: float
    above_saturation: bool


@dataclass(frozen=True)
class RateRow:
    """Both schedulers at one rate, by scheduler."""

    rate_rps: float
    share: float
    runs: dict[str, SchedulerRun]


@dataclass(frozen=True)
class Scheduling:
    """Part 1 as measured: both schedulers at saturation, then at each rate."""

    saturation: dict[str, Saturation]
    capacity_rps: float
    ceiling_tps: float
    rates: list[RateRow]

    def saturation_ratio(self) -> dict[str, Ratio]:
        """Continuous over static at saturation: tokens/s from the engines' counters, the
        latencies from the clients."""
        a, b = (self.saturation[s] for s in ("continuous", "static"))
        return ratios(
            replace(a.clients, output_tps=a.engine.output_tps),
            replace(b.clients, output_tps=b.engine.output_tps),
        )


@dataclass(frozen=True)
class OverheadRound:
    """One round of the overhead part: each path's figures, and the machine's load."""

    paths: dict[str, StreamSummary]
    load_average_1m: float


@dataclass(frozen=True)
class Overhead:
    """Part 2 as measured: the rounds of interleaved Poisson arrivals over the paths."""

    max_tokens: int
    rate_rps: float
    rounds: list[OverheadRound]


@dataclass(frozen=True)
class PathMedians:
    """One path's TTFT p50/p95/p99 and e2e p50, each the median over the rounds."""

    ttft_p50_ms: float | None
    ttft_p95_ms: float | None
    ttft_p99_ms: float | None
    e2e_p50_ms: float | None


@dataclass(frozen=True)
class OverheadSummary:
    """Per path, the medians over rounds; what each path adds to direct TTFT and what each
    modelroll path adds beyond as many bare hops (by figure, then path), taken round by round;
    and the streams that failed or were cut."""

    max_tokens: int
    rate_rps: float
    rounds: int
    ceilings: dict[str, str]
    median: dict[str, PathMedians]
    added: dict[str, dict[str, Spread | None]]
    beyond_bare: dict[str, dict[str, Spread | None]]
    failed: int
    failed_by_path: dict[str, int]


# -- lines as the run goes --------------------------------------------------------------------


def saturation_line(found: Saturation) -> str:
    engine, clients = found.engine, found.clients
    return (
        f"    {found.scheduler:<10} {engine.output_tps} output tokens/s, "
        f"{engine.requests_per_s} req/s, slots wasted {_share(engine.wasted_fraction)}, "
        f"mean batch {engine.mean_batch}, over {engine.seconds} s; "
        f"TTFT p50/p95/p99 {latencies(clients, 'ttft')} ms"
    )


def open_line(rate: float, row: StreamSummary, engine: EngineSummary) -> str:
    return (
        f"    {rate:6.1f} req/s {row.label:<10} {figure(row, 'output_tps')} tokens/s, "
        f"TTFT {latencies(row, 'ttft')} ms, e2e {latencies(row, 'e2e')} ms, "
        f"wasted {_share(engine.wasted_fraction)}, ok {row.ok}/{row.requests}, "
        f"cut {row.cut}, failed {row.failed}"
    )


def _minus(a: float | None, b: float | None) -> str:
    return "-" if a is None or b is None else f"{a - b:+.2f}"


def _plus(value: float | None) -> str:
    return "-" if value is None else f"{value:+.2f}"


def overhead_line(round_no: int, row: OverheadRound, paths: Sequence[str]) -> str:
    """One round: the direct TTFT p50, and what each other path adds at p50 / p99."""
    direct = row.paths[DIRECT]
    added = []
    for path in paths:
        if path == DIRECT:
            continue
        p50 = _minus(row.paths[path].ttft_p50_ms, direct.ttft_p50_ms)
        p99 = _minus(row.paths[path].ttft_p99_ms, direct.ttft_p99_ms)
        added.append(f"{path} {p50}/{p99}")
    failed = sum(row.paths[p].failed + row.paths[p].cut for p in paths)
    return (
        f"    round {round_no}: direct TTFT p50 {direct.ttft_p50_ms} ms; added p50/p99 ms: "
        f"{', '.join(added)}; failed or cut {failed}"
    )


# -- the tables -------------------------------------------------------------------------------


def scheduling_table(found: Scheduling, setup_duration_s: float, setup_drain_s: float) -> str:
    sat = found.saturation
    lines = [
        f"\nSaturation (closed loop, {sat['continuous'].streams} streams; engine counters):",
        f"  {'scheduler':<12} {'tokens/s':>9} {'req/s':>7} {'wasted':>7} {'mean batch':>10}"
        f"   TTFT p50 / p95 / p99 ms",
    ]
    for scheduler, row in sat.items():
        e = row.engine
        lines.append(
            f"  {scheduler:<12} {e.output_tps:>9} {e.requests_per_s:>7} "
            f"{_share(e.wasted_fraction):>7} {e.mean_batch:>10}   "
            f"{latencies(row.clients, 'ttft')}"
        )
    lines.append(
        f"  continuous / static: output tokens/s "
        f"{ratio_text(found.saturation_ratio().get('output_tps'))}; the cost model's "
        f"ceiling (every slot a token): {found.ceiling_tps} tokens/s"
    )
    static = sat["static"].engine
    lines.append(
        f"  Early finish: at saturation static batching charged {static.slot_steps_per_s} "
        f"sequence slots/s, {_share(static.wasted_fraction)} of them for sequences that had "
        f"already ended (continuous: {_share(sat['continuous'].engine.wasted_fraction)})"
    )
    lines.append(
        f"\nPoisson arrivals, {setup_duration_s:g} s each, then {setup_drain_s:g} s to "
        f"finish ('>=': a bound, streams were cut); rates as shares of continuous saturation "
        f"({found.capacity_rps} req/s); tokens/s: received in the last 3/4 of the arrivals:"
    )
    lines.append(
        f"  {'rate':<14} {'scheduler':<12} {'tokens/s':>9}  {'TTFT p50 / p95 / p99 ms':<26}"
        f"{'e2e p50 / p95 / p99 ms':<28}{'wasted':>7}  ok/sent"
    )
    for at in found.rates:
        rate = f"{at.rate_rps:g} ({at.share:.0%})"
        for scheduler in ("continuous", "static"):
            r = at.runs[scheduler]
            c = r.clients
            over = " (above its saturation)" if r.above_saturation else ""
            lines.append(
                f"  {rate:<14} {scheduler:<12} {figure(c, 'output_tps'):>9}  "
                f"{latencies(c, 'ttft'):<26}{latencies(c, 'e2e'):<28}"
                f"{_share(r.engine.wasted_fraction):>7}  {c.ok}/{c.requests}{over}"
            )
            rate = ""
        q = ratios(at.runs["continuous"].clients, at.runs["static"].clients)
        ttft = " / ".join(ratio_text(q.get(f"ttft_{p}_ms")) for p in ("p50", "p95", "p99"))
        e2e = " / ".join(ratio_text(q.get(f"e2e_{p}_ms")) for p in ("p50", "p95", "p99"))
        lines.append(
            f"  {'':<14} {'cont/static':<12} {ratio_text(q.get('output_tps')):>9}  "
            f"{ttft:<26}{e2e:<28}"
        )
    return "\n".join(lines)


def _spread_text(found: Spread | None) -> str:
    """``+median (+low..+high)``; ``-`` for a figure no round had."""
    if found is None:
        return "-"
    return f"{_plus(found.median)} ({_plus(found.low)}..{_plus(found.high)})"


def _median_text(found: Spread | None) -> str:
    return _plus(None if found is None else found.median)


def _rounds_text(found: Spread | None) -> str:
    """``+median ms (rounds +low..+high)``; ``- ms`` for a figure no round had."""
    if found is None:
        return "- ms"
    return f"{_plus(found.median)} ms (rounds {_plus(found.low)}..{_plus(found.high)})"


def _figure_text(figures: dict[str, Spread | None], path: str) -> str:
    """A path's figure as :func:`_spread_text` writes it; empty for a path without one."""
    return _spread_text(figures[path]) if path in figures else ""


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def overhead_table(found: OverheadSummary) -> str:
    keys = ("ttft_p50_ms", "ttft_p99_ms")
    lines = [
        f"\nTTFT by path ({found.rate_rps:g} req/s interleaved over the paths, "
        f"max_tokens {found.max_tokens}; medians over {found.rounds} rounds; differences taken "
        f"round by round, median (min..max)):"
    ]
    heads = ("added p50", "added p99", "beyond bare p50", "beyond bare p99")
    rows: list[tuple[str, str, list[str]]] = []
    for path, row in found.median.items():
        text = [_figure_text(found.added[k], path) for k in keys]
        text += [_figure_text(found.beyond_bare.get(k, {}), path) for k in keys]
        ttft = " ".join(
            _ms(v).rjust(7) for v in (row.ttft_p50_ms, row.ttft_p95_ms, row.ttft_p99_ms)
        )
        rows.append((path, ttft, text))
    width = max(len(t) for t in [*heads, *(t for _, _, text in rows for t in text)]) + 2
    lines.append(
        f"  {'path':<16} {'p50':>7} {'p95':>7} {'p99':>7}   "
        f"{''.join(h.ljust(width) for h in heads)}".rstrip()
    )
    for path, ttft, text in rows:
        lines.append(f"  {path:<16} {ttft}   {''.join(t.ljust(width) for t in text)}".rstrip())
    if found.ceilings:
        pairs = "; ".join(f"{path} - {bare}" for path, bare in found.ceilings.items())
        lines.append(f"  beyond bare: minus the bare aiohttp proxies with as many hops ({pairs})")
    return "\n".join(lines)


def checks(found: OverheadSummary | None) -> list[Check]:
    """The target: what the gateway and the sidecar together add to TTFT at p50, median
    over the rounds, with every stream of those rounds answered."""
    if found is None:
        return []
    p50 = found.added["ttft_p50_ms"][JUDGED]
    p99 = found.added["ttft_p99_ms"][JUDGED]
    alone = found.added["ttft_p50_ms"]["sidecar"]
    bare = found.added["ttft_p50_ms"].get(found.ceilings.get(JUDGED, ""))
    floor = "" if bare is None else f"; two bare aiohttp hops {_plus(bare.median)} ms"
    met = p50 is not None and p50.median <= TARGET_MS and found.failed == 0
    return [
        (
            f"gateway + sidecar add <= {TARGET_MS:g} ms to TTFT p50 at "
            f"{found.rate_rps:g} req/s (median of {found.rounds} rounds)",
            met,
            f"{_rounds_text(p50)}; the sidecar alone {_median_text(alone)} ms{floor}; added p99 "
            f"{_median_text(p99)} ms; streams failed or cut: {found.failed}",
        )
    ]


def informational(found: OverheadSummary | None) -> list[tuple[str, str]]:
    """Beside the target, not judged: what the gateway and the sidecar add to TTFT beyond two
    bare aiohttp hops (and the sidecar beyond one), median over the same rounds."""
    if found is None or JUDGED not in found.beyond_bare.get("ttft_p50_ms", {}):
        return []
    beyond = found.beyond_bare
    ceilings = found.ceilings
    p50, p99 = beyond["ttft_p50_ms"][JUDGED], beyond["ttft_p99_ms"][JUDGED]
    alone = beyond["ttft_p50_ms"].get("sidecar")
    one_hop = (
        ""
        if alone is None
        else f"; one hop (sidecar - {ceilings['sidecar']}): {_median_text(alone)} ms"
    )
    return [
        (
            f"modelroll's TTFT cost beyond two bare aiohttp hops ({JUDGED} - {ceilings[JUDGED]}, "
            f"median of {found.rounds} rounds)",
            f"p50 {_spread_text(p50)} ms, p99 {_spread_text(p99)} ms{one_hop}",
        )
    ]
