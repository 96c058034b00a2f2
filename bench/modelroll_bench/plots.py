"""PNG plots of the reports (matplotlib, Agg backend: no display needed)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator

from .arithmetic import Point, Recommendation, goodput_by_setting
from .stats import Spread


def _log_ms(ax: Axes) -> None:
    """A log y axis labelled in plain milliseconds (10, 20, 50, ...), not powers of ten."""
    ax.set_yscale("log")
    ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_minor_locator(LogLocator(base=10, subs=(3.0, 4.0, 6.0, 7.0, 8.0, 9.0)))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_formatter(FuncFormatter(lambda _v, _p: ""))
    ax.grid(True, which="major", axis="y", alpha=0.3)


def _bars(
    ax: Axes,
    summary: dict[str, Any],
    key: str,
    title: str,
    ylabel: str = "req/s",
    fmt: str = ".0f",
    colours: dict[str, Any] | None = None,
) -> None:
    labels = list(summary)
    medians, low, high = [], [], []
    for label in labels:
        value = summary[label][key].value or Spread(0.0, 0.0, 0.0, 0)
        medians.append(value.median)
        low.append(value.median - value.low)
        high.append(value.high - value.median)
    colour = [colours[label] for label in labels] if colours else "#4c72b0"
    ax.bar(range(len(labels)), medians, yerr=[low, high], capsize=4, color=colour)
    ax.set_xticks(range(len(labels)), labels, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    for x, (m, up) in enumerate(zip(medians, high, strict=True)):
        ax.annotate(
            format(m, fmt),
            (x, m + up),
            xytext=(0, 2),
            textcoords="offset points",
            ha="center",
            va="bottom",
            fontsize=7,
        )


def _colours(labels: list[str]) -> dict[str, Any]:
    """One colour per system, the same in every panel and figure."""
    cycle = plt.get_cmap("tab10")
    return {label: cycle(i % 10) for i, label in enumerate(labels)}


def _latency_lines(
    ax: Axes, summary: dict[str, Any], shares: list[float], q: str, colours: dict[str, Any]
) -> None:
    for label, entry in summary.items():
        xs, ys, lows, highs = [], [], [], []
        for share in shares:
            value = entry[f"{q}_at_{share:.0%}"].value
            if value is not None:
                xs.append(share * 100)
                ys.append(value.median)
                lows.append(value.low)
                highs.append(value.high)
        if xs:
            colour = colours[label]
            ax.plot(xs, ys, marker="o", label=label, color=colour)
            ax.fill_between(xs, lows, highs, color=colour, alpha=0.15, linewidth=0)
    _log_ms(ax)
    ax.set_xlabel("Poisson arrival rate, % of the model's limit")


def compare(report: dict[str, Any], directory: Path) -> list[Path]:
    """Two figures, a row per length distribution: ``bench-compare.png`` (throughput at
    saturation, goodput under the SLO, padding efficiency over each system's runs) and
    ``bench-latency.png`` (p50 and p99 against load, a line per system; median over rounds, band:
    range)."""
    directory.mkdir(parents=True, exist_ok=True)
    setup, dists = report["setup"], report["distributions"]
    colours = _colours(list(report["systems"]))
    scenario, rows = setup["scenario"], max(1, len(dists))
    caption = (
        f"Demo model {scenario['fixed_ms']:g} ms + {scenario['per_token_ms']:g} ms/padded token, "
        f"max batch {setup['max_batch']}, max-wait {setup['max_wait_ms']:g} ms; median over "
        f"{setup['rounds']} rounds, whiskers and bands: range"
    )

    fig, axes = plt.subplots(rows, 3, figsize=(17, 5.2 * rows), layout="constrained", squeeze=False)
    for (sat, good, pad), dist in zip(axes, dists.values(), strict=False):
        summary, limit, name = dist["summary"], dist["model_limit_rps"], dist["name"]
        _bars(
            sat,
            summary,
            "saturation_rps",
            f"{name}: throughput at saturation (wrk)",
            colours=colours,
        )
        sat.axhline(limit, color="grey", linestyle="--", label=f"model's limit {limit:.0f} req/s")
        sat.legend(loc="lower right", fontsize=8)
        _bars(
            good,
            summary,
            "goodput_rps",
            f"{name}: goodput with p99 <= {setup['slo_ms']:g} ms",
            colours=colours,
        )
        _bars(
            pad,
            summary,
            "padding_overall",
            f"{name}: padding efficiency (useful / padded tokens, all runs)",
            ylabel="useful / padded tokens",
            fmt=".2f",
            colours=colours,
        )
        pad.set_ylim(0, 1.1)
    fig.suptitle(caption)
    bars = directory / "bench-compare.png"
    fig.savefig(bars, dpi=110)
    plt.close(fig)

    fig, axes = plt.subplots(rows, 2, figsize=(15, 5.5 * rows), layout="constrained", squeeze=False)
    for (p50, p99), dist in zip(axes, dists.values(), strict=False):
        summary, name = dist["summary"], dist["name"]
        _latency_lines(p50, summary, setup["shares"], "p50", colours)
        one = dist["batch_of_one"].get("measured_ms")
        if one:
            p50.axhline(
                one.median,
                color="grey",
                linestyle=":",
                label=f"batch of one, {one.median:.1f} ms",
            )
        p50.set_ylabel("p50 latency, ms (log)")
        p50.set_title(f"{name} ({dist['lengths']}): p50 against load")
        p50.legend(fontsize=7)
        _latency_lines(p99, summary, setup["shares"], "p99", colours)
        p99.axhline(
            setup["slo_ms"], color="grey", linestyle="--", label=f"SLO {setup['slo_ms']:g} ms"
        )
        p99.set_ylabel("p99 latency, ms (log)")
        p99.set_title(f"{name} ({dist['lengths']}): p99 against load")
        p99.legend(fontsize=7)
    fig.suptitle(caption)
    lines = directory / "bench-latency.png"
    fig.savefig(lines, dpi=110)
    plt.close(fig)
    return [bars, lines]


def sweep(
    points: list[Point],
    slo_ms: float,
    pick: Recommendation | None,
    title: str,
    directory: Path,
) -> list[Path]:
    """``bench-sweep.png`` (p99 against throughput, one line per max batch size at the chosen
    max-wait, every other run in grey) and ``bench-sweep-goodput.png`` (goodput over the grid)."""
    directory.mkdir(parents=True, exist_ok=True)
    batches = sorted({p.max_batch for p in points})
    waits = sorted({p.max_wait_ms for p in points})
    wait = pick.max_wait_ms if pick else waits[len(waits) // 2]

    fig, ax = plt.subplots(figsize=(9, 6), layout="constrained")
    for b in batches:
        for w in waits:
            line = sorted(
                (p for p in points if p.setting == (b, w) and math.isfinite(p.p99_ms)),
                key=lambda p: p.offered_rps,
            )
            if not line:
                continue
            xs, ys = [p.throughput_rps for p in line], [p.p99_ms for p in line]
            if w == wait:
                ax.plot(xs, ys, marker="o", linewidth=2, label=f"max batch {b}")
            else:
                ax.plot(xs, ys, color="lightgrey", linewidth=0.8, zorder=0)
    ax.axhline(slo_ms, color="grey", linestyle="--", label=f"p99 SLO {slo_ms:g} ms")
    if pick is not None:
        ax.plot(
            [pick.goodput_rps],
            [pick.p99_ms],
            marker="*",
            markersize=18,
            color="crimson",
            linestyle="none",
            label=f"recommended: {pick.max_batch} / {pick.max_wait_ms:g} ms",
        )
    _log_ms(ax)
    ax.set_xlabel("throughput, req/s")
    ax.set_ylabel("p99 latency, ms (log)")
    ax.set_title(f"{title}\ncoloured: max-wait {wait:g} ms; grey: the other max-waits")
    ax.legend(fontsize=8)
    knee = directory / "bench-sweep.png"
    fig.savefig(knee, dpi=110)
    plt.close(fig)

    best = goodput_by_setting(points, slo_ms)
    grid = [
        [best[(b, w)].throughput_rps if (b, w) in best else 0.0 for w in waits] for b in batches
    ]
    fig, ax = plt.subplots(figsize=(7, 5), layout="constrained")
    image = ax.imshow(grid, cmap="viridis", aspect="auto", origin="lower")
    ax.set_xticks(range(len(waits)), [f"{w:g}" for w in waits])
    ax.set_yticks(range(len(batches)), [str(b) for b in batches])
    ax.set_xlabel("max-wait, ms")
    ax.set_ylabel("max batch size")
    middle = (min(map(min, grid)) + max(map(max, grid))) / 2
    for i, row in enumerate(grid):
        for j, value in enumerate(row):
            colour = "black" if value > middle else "white"  # readable on viridis
            ax.text(j, i, f"{value:.0f}", ha="center", va="center", color=colour, fontsize=9)
    fig.colorbar(image, label=f"goodput, req/s with p99 <= {slo_ms:g} ms")
    ax.set_title(f"Goodput by setting (highest tested rate within the SLO)\n{title}")
    heat = directory / "bench-sweep-goodput.png"
    fig.savefig(heat, dpi=110)
    plt.close(fig)
    return [knee, heat]


def rollback(
    delays_ms: dict[str, list[float]],
    kubectl: tuple[str, list[float]],
    title: str,
    directory: Path,
) -> list[Path]:
    """``bench-rollback.png``: every flip's delay, per mode, against the flip number; crosses
    mark when ``kubectl patch`` itself returned."""
    directory.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(8, 4.5), layout="constrained")
    for label, delays in delays_ms.items():
        ax.plot(range(1, len(delays) + 1), delays, marker="o", linestyle="none", label=label)
    mode, returned = kubectl
    ax.plot(
        range(1, len(returned) + 1),
        returned,
        marker="x",
        linestyle="none",
        color="grey",
        label=f"kubectl patch returned ({mode})",
    )
    highest = max((d for delays in delays_ms.values() for d in delays), default=0.0)
    if highest > 500:
        ax.axhline(1000, color="grey", linestyle="--", label="target: p99 < 1 s")
    else:
        title += "\n(target: p99 < 1 s, off this scale)"
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("flip")
    ax.set_ylabel("ms after kubectl patch started")
    ax.set_ylim(bottom=0)
    ax.set_title(title)
    ax.legend(fontsize=8)
    path = directory / "bench-rollback.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return [path]
