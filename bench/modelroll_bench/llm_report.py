"""``make bench-llm``'s figures in words: ratios that respect lower bounds, the lines printed as
the run goes, the summary tables at its end, the TTFT target judged, and beside it (for
information) what modelroll costs beyond as many bare aiohttp hops.

A figure named in a row's ``at_least`` is only a lower bound (streams cut before they got there,
:mod:`.llm_load`); a ratio with such a figure on one side is a bound too, and says which way.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

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


def ratios(a: dict[str, Any], b: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """``a``'s figures over ``b``'s (RATIO_KEYS that both have)."""
    out: dict[str, dict[str, Any]] = {}
    for key in RATIO_KEYS:
        if key not in a or key not in b:
            continue
        value, relation = bounded_ratio(
            a[key], key not in a.get("at_least", []), b[key], key not in b.get("at_least", [])
        )
        out[key] = {"ratio": value, "is": relation}
    return out


def figure(row: dict[str, Any], key: str, digits: int = 0) -> str:
    """A row's figure for a table: ``>=`` before a lower bound, ``-`` when there is none."""
    value = row.get(key)
    if value is None:
        return "-"
    return (">=" if key in row.get("at_least", []) else "") + f"{value:.{digits}f}"


def ratio_text(found: dict[str, Any] | None) -> str:
    if not found or found["ratio"] is None:
        return "-"
    relation = "" if found["is"] == "=" else found["is"]
    return f"{relation}{found['ratio']:.2f}x"


def _share(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def latencies(row: dict[str, Any], name: str) -> str:
    return " / ".join(figure(row, f"{name}_{p}_ms") for p in ("p50", "p95", "p99"))


def saturation_line(found: dict[str, Any]) -> str:
    engine, clients = found["engine"], found["clients"]
    return (
        f"    {found['scheduler']:<10} {engine['output_tps']} output tokens/s, "
        f"{engine['requests_per_s']} req/s, slots wasted {_share(engine['wasted_fraction'])}, "
        f"mean batch {engine['mean_batch']}, over {engine['seconds']} s; "
        f"TTFT p50/p95/p99 {latencies(clients, 'ttft')} ms"
    )


def open_line(rate: float, row: dict[str, Any]) -> str:
    return (
        f"    {rate:6.1f} req/s {row['label']:<10} {figure(row, 'output_tps')} tokens/s, "
        f"TTFT {latencies(row, 'ttft')} ms, e2e {latencies(row, 'e2e')} ms, "
        f"wasted {_share(row['engine']['wasted_fraction'])}, ok {row['ok']}/{row['requests']}, "
        f"cut {row['cut']}, failed {row['failed']}"
    )


def _minus(a: float | None, b: float | None) -> str:
    return "-" if a is None or b is None else f"{a - b:+.2f}"


def _plus(value: float | None) -> str:
    return "-" if value is None else f"{value:+.2f}"


def overhead_line(round_no: int, row: dict[str, Any], paths: Sequence[str]) -> str:
    """One round: the direct TTFT p50, and what each other path adds at p50 / p99."""
    direct = row[DIRECT]
    added = []
    for path in paths:
        if path == DIRECT:
            continue
        p50 = _minus(row[path]["ttft_p50_ms"], direct["ttft_p50_ms"])
        p99 = _minus(row[path]["ttft_p99_ms"], direct["ttft_p99_ms"])
        added.append(f"{path} {p50}/{p99}")
    failed = sum(row[p]["failed"] + row[p]["cut"] for p in paths)
    return (
        f"    round {round_no}: direct TTFT p50 {direct['ttft_p50_ms']} ms; added p50/p99 ms: "
        f"{', '.join(added)}; failed or cut {failed}"
    )


def print_summary(report: dict[str, Any]) -> None:
    if "scheduling" in report:
        _print_scheduling(report["scheduling"], report["setup"])
    if "overhead" in report:
        print_overhead(report["overhead"])
        for what, measured in informational(report):
            print(f"  For information (no target): {what}: {measured}")


def _print_scheduling(found: dict[str, Any], setup: dict[str, Any]) -> None:
    sat = found["saturation"]
    print(f"\nSaturation (closed loop, {sat['continuous']['streams']} streams; engine counters):")
    print(
        f"  {'scheduler':<12} {'tokens/s':>9} {'req/s':>7} {'wasted':>7} {'mean batch':>10}"
        f"   TTFT p50 / p95 / p99 ms"
    )
    for scheduler, row in sat.items():
        e = row["engine"]
        print(
            f"  {scheduler:<12} {e['output_tps']:>9} {e['requests_per_s']:>7} "
            f"{_share(e['wasted_fraction']):>7} {e['mean_batch']:>10}   "
            f"{latencies(row['clients'], 'ttft')}"
        )
    print(
        f"  continuous / static: output tokens/s "
        f"{ratio_text(found['saturation_ratio'].get('output_tps'))}; the cost model's "
        f"ceiling (every slot a token): {found['ceiling_tps']} tokens/s"
    )
    static = sat["static"]["engine"]
    print(
        f"  Early finish: at saturation static batching charged {static['slot_steps_per_s']} "
        f"sequence slots/s, {_share(static['wasted_fraction'])} of them for sequences that had "
        f"already ended (continuous: {_share(sat['continuous']['engine']['wasted_fraction'])})"
    )
    print(
        f"\nPoisson arrivals, {setup['duration_s']:g} s each, then {setup['drain_s']:g} s to "
        f"finish ('>=': a bound, streams were cut); rates as shares of continuous saturation "
        f"({found['capacity_rps']} req/s); tokens/s: received in the last 3/4 of the arrivals:"
    )
    print(
        f"  {'rate':<14} {'scheduler':<12} {'tokens/s':>9}  {'TTFT p50 / p95 / p99 ms':<26}"
        f"{'e2e p50 / p95 / p99 ms':<28}{'wasted':>7}  ok/sent"
    )
    for row in found["rates"]:
        rate = f"{row['rate_rps']:g} ({row['share']:.0%})"
        for scheduler in ("continuous", "static"):
            r = row[scheduler]
            over = " (above its saturation)" if r["above_saturation"] else ""
            print(
                f"  {rate:<14} {scheduler:<12} {figure(r, 'output_tps'):>9}  "
                f"{latencies(r, 'ttft'):<26}{latencies(r, 'e2e'):<28}"
                f"{_share(r['engine']['wasted_fraction']):>7}  {r['ok']}/{r['requests']}{over}"
            )
            rate = ""
        q = row["continuous_over_static"]
        ttft = " / ".join(ratio_text(q.get(f"ttft_{p}_ms")) for p in ("p50", "p95", "p99"))
        e2e = " / ".join(ratio_text(q.get(f"e2e_{p}_ms")) for p in ("p50", "p95", "p99"))
        print(
            f"  {'':<14} {'cont/static':<12} {ratio_text(q.get('output_tps')):>9}  "
            f"{ttft:<26}{e2e:<28}"
        )


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


def print_overhead(found: dict[str, Any]) -> None:
    rounds = len(found["rounds"])
    keys = ("ttft_p50_ms", "ttft_p99_ms")
    beyond = found.get("beyond_bare", {})
    ceilings: dict[str, str] = found.get("ceilings", {})
    print(
        f"\nTTFT by path ({found['rate_rps']:g} req/s interleaved over the paths, "
        f"max_tokens {found['max_tokens']}; medians over {rounds} rounds; differences taken "
        f"round by round, median (min..max)):"
    )
    heads = ("added p50", "added p99", "beyond bare p50", "beyond bare p99")
    lines: list[tuple[str, str, list[str]]] = []
    for path, row in found["median"].items():
        text = [_figure_text(found["added"][k], path) for k in keys]
        text += [_figure_text(beyond.get(k, {}), path) for k in keys]
        ttft = " ".join(figure(row, f"ttft_{p}_ms", 2).rjust(7) for p in ("p50", "p95", "p99"))
        lines.append((path, ttft, text))
    width = max(len(t) for t in [*heads, *(t for _, _, text in lines for t in text)]) + 2
    print(
        f"  {'path':<16} {'p50':>7} {'p95':>7} {'p99':>7}   "
        f"{''.join(h.ljust(width) for h in heads)}".rstrip()
    )
    for path, ttft, text in lines:
        print(f"  {path:<16} {ttft}   {''.join(t.ljust(width) for t in text)}".rstrip())
    if ceilings:
        pairs = "; ".join(f"{path} - {bare}" for path, bare in ceilings.items())
        print(f"  beyond bare: minus the bare aiohttp proxies with as many hops ({pairs})")


def checks(report: dict[str, Any]) -> list[Check]:
    """The target: what the gateway and the sidecar together add to TTFT at p50, median
    over the rounds, with every stream of those rounds answered."""
    found = report.get("overhead")
    if found is None:
        return []
    p50 = found["added"]["ttft_p50_ms"][JUDGED]
    p99 = found["added"]["ttft_p99_ms"][JUDGED]
    alone = found["added"]["ttft_p50_ms"]["sidecar"]
    bare = found["added"]["ttft_p50_ms"].get(found.get("ceilings", {}).get(JUDGED, ""))
    floor = "" if bare is None else f"; two bare aiohttp hops {_plus(bare.median)} ms"
    met = p50 is not None and p50.median <= TARGET_MS and found["failed"] == 0
    return [
        (
            f"gateway + sidecar add <= {TARGET_MS:g} ms to TTFT p50 at "
            f"{found['rate_rps']:g} req/s (median of {len(found['rounds'])} rounds)",
            met,
            f"{_rounds_text(p50)}; the sidecar alone {_median_text(alone)} ms{floor}; added p99 "
            f"{_median_text(p99)} ms; streams failed or cut: {found['failed']}",
        )
    ]


def informational(report: dict[str, Any]) -> list[tuple[str, str]]:
    """Beside the target, not judged: what the gateway and the sidecar add to TTFT beyond two
    bare aiohttp hops (and the sidecar beyond one), median over the same rounds."""
    found = report.get("overhead")
    if found is None or JUDGED not in found.get("beyond_bare", {}).get("ttft_p50_ms", {}):
        return []
    beyond = found["beyond_bare"]
    ceilings = found["ceilings"]
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
            f"median of {len(found['rounds'])} rounds)",
            f"p50 {_spread_text(p50)} ms, p99 {_spread_text(p99)} ms{one_hop}",
        )
    ]
