"""``make bench ARGS=--length-switch``: how fast each batcher follows traffic whose lengths change.

One open-loop run per system and round at a fixed rate: the first half of its requests are
drawn from short lengths (lognormal, median 8 words), the rest from long ones (median 60), so
the switch comes halfway through. The rate is a share (``--switch-share``) of no batching's
saturation on the long lengths, measured with wrk before the rounds: after the switch the load is
heavy but no batching can still serve it. Reported per system: goodput (requests answered within
the SLO per second, by arrival) before the switch, and in consecutive windows after it, as medians
over rounds and as ratios to no batching and to the best static configuration for the long
lengths (``--best-static switch=FLAGS``), paired by round; and when the sidecar's defaults come
back within 5% of that configuration's goodput to stay.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from . import arithmetic
from .figures import Figure
from .lengths import parse_list
from .loadgen import open_loop
from .metrics import Watch
from .runs import Scenario, Workload, idle, load_average
from .stats import Spread, paired_ratios, spread
from .systems import System, batcher

RECOVERED = 0.95
"""Back "within 5%": goodput at least this share of the best static configuration's."""
RECOVERY_TARGET_S = 30.0
"""The sidecar's defaults should be back within 5% this long after the switch."""


@dataclass(frozen=True)
class Switch:
    before: str = "lognormal:2.08,0.5"
    """Lengths of the first half (median e^2.08 = 8 words)."""
    after: str = "lognormal:4.09,0.5"
    """Lengths of the second half (median e^4.09 = 60 words)."""
    share: float = 0.7
    """The rate, as a share of no batching's saturation on the ``after`` lengths."""
    half_s: float = 40.0
    """Seconds of arrivals on each side of the switch."""
    window_s: float = 5.0

    @property
    def windows(self) -> int:
        return math.ceil(self.half_s / self.window_s)

    def workloads(self, scenario: Scenario) -> tuple[Workload, Workload]:
        return (
            replace(scenario, lengths=self.before).workload,
            replace(scenario, lengths=self.after).workload,
        )

    def estimate_s(self, rounds: int, systems: int, calibration_s: float) -> float:
        """The calibration, then one run of both halves per system and round, plus about 10 s
        a run for starting the batcher and draining what it was left with."""
        return calibration_s + rounds * systems * (2 * self.half_s + 10)


def parse_switch(text: str) -> tuple[str, str]:
    """``BEFORE,AFTER`` length specs (lengths.py) -> both specs; ValueError otherwise."""
    found = parse_list(text)
    if len(found) != 2:
        raise ValueError(f"{text!r}: give two length distributions, before and after the switch")
    return found[0].spec, found[1].spec


async def one_run(
    system: System,
    model: str,
    scenario: Scenario,
    switch: Switch,
    rate: float,
    round_no: int,
    slo_ms: float,
) -> dict[str, Any]:
    """One run of both halves through ``system``: goodput before the switch and per window
    after it, with the model's batching over the whole run. Answers are waited for at most
    ``slo_ms`` after the last arrival (what comes later is past the SLO anyway)."""
    short, long = switch.workloads(scenario)
    first, second = short.body(), long.body()
    first_len, second_len = short.length(), long.length()
    n = round(rate * switch.half_s)
    stats = model + "/v1/stats"
    async with (
        batcher(system, model, scenario.parallel) as url,
        Watch(stats) as watch,
    ):
        result = await open_loop(
            url + "/v1/infer",
            lambda i: first(i) if i < n else second(i - n),
            rate,
            2 * switch.half_s,
            seed=round_no,
            label=system.label,
            length=lambda i: first_len(i) if i < n else second_len(i - n),
            drain_s=slo_ms / 1000,
        )
        if result.unanswered:
            await idle(stats)
    at = next((t for i, t, _ in result.timeline if i == n), switch.half_s)
    slo_s = slo_ms / 1000
    [before] = arithmetic.goodput_windows(result.timeline, 0.0, at, 1, slo_s)
    return {
        "round": round_no,
        "load_average_1m": round(load_average(), 2),
        "switch_at_s": round(at, 3),
        "before_rps": round(before, 2),
        "windows_rps": [
            round(g, 2)
            for g in arithmetic.goodput_windows(
                result.timeline, at, switch.window_s, switch.windows, slo_s
            )
        ],
        "summary": result.summary(),
        "batching": watch.delta and watch.delta.summary(),
    }


def figures(row: dict[str, Any]) -> dict[str, float]:
    """A round's goodput figures by name: ``before``, then ``w0``, ``w1``, ... after."""
    found = {"before": float(row["before_rps"])}
    found.update({f"w{k}": float(v) for k, v in enumerate(row["windows_rps"])})
    return found


def summarize(
    rounds: dict[str, list[dict[str, Any]]], baseline: str, best: str
) -> dict[str, dict[str, Figure]]:
    """Per system and figure, median and range over rounds, and paired ratios to ``baseline``
    and to ``best`` (None where it did not run)."""
    out: dict[str, dict[str, Figure]] = {}
    for label, rows in rounds.items():
        entry: dict[str, Figure] = {}
        names = figures(rows[0]) if rows else {}
        for name in names:
            values: list[float | None] = [figures(r).get(name) for r in rows]
            entry[name] = Figure(
                spread(values, 2),
                _ratios(values, rows, rounds.get(baseline, []), name),
                _ratios(values, rows, rounds.get(best, []), name),
            )
        out[label] = entry
    return out


def _ratios(
    values: list[float | None],
    rows: list[dict[str, Any]],
    reference: list[dict[str, Any]],
    name: str,
) -> Spread | None:
    """``values`` over the reference's figure ``name`` of the same round."""
    theirs = {r["round"]: figures(r).get(name) for r in reference}
    return spread(paired_ratios(values, [theirs.get(r["round"]) for r in rows]))


def recovery_s(entry: dict[str, Figure], window_s: float) -> float | None:
    """Seconds after the switch from which every window's goodput (median of paired ratios) is
    at least RECOVERED of the best static configuration's; None when it never is, or when the
    best static configuration did not run."""
    ratios = [
        fig.ratio_to_best_static.median if fig.ratio_to_best_static else None
        for name, fig in entry.items()
        if name.startswith("w")
    ]
    if not ratios or None in ratios:
        return None
    for k in range(len(ratios)):
        if all(r is not None and r >= RECOVERED for r in ratios[k:]):
            return k * window_s
    return None


def print_windows(summary: dict[str, dict[str, Figure]], switch: Switch, width: int) -> None:
    """Goodput before the switch and per window after it (median over rounds), then the same
    as ratios to the best static configuration where it ran."""
    heads = ["before"] + [
        f"+{k * switch.window_s:g}-{(k + 1) * switch.window_s:g}s" for k in range(switch.windows)
    ]
    print(
        "\nGoodput (requests/s answered within the SLO, by arrival), median over rounds; "
        "second line: ratio to best static, paired by round"
    )
    print(f"{'system':<{width}} " + " ".join(f"{h:>9}" for h in heads))
    for label, entry in summary.items():
        values = [fig.value for fig in entry.values()]
        print(
            f"{label:<{width}} "
            + " ".join(f"{v.median:>9.1f}" if v else f"{'-':>9}" for v in values)
        )
        ratios = [fig.ratio_to_best_static for fig in entry.values()]
        if any(ratios):
            print(
                f"{'':<{width}} "
                + " ".join(f"{r.median:>8.2f}x" if r else f"{'-':>9}" for r in ratios)
            )
