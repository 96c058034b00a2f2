"""``make bench``: every batcher in front of the same model, under the same request lengths, in
one run, reported as ratios to no batching (the sidecar with max batch 1), paired by round.

Systems: no batching; the sidecar with its defaults (no batching flag at all: what a ModelVersion
without ``spec.batching`` runs, the self-tuning policy); the best static configuration, when
``--best-static`` names it (sidecar flags, optionally per load); the sidecar's former default, first
in first out with a fixed wait (B=32, 10 ms); the same with a token budget; by length
(``--batch-by length``), with the adaptive wait (``--wait-policy adaptive``), and with both;
text-embeddings-inference's rule (never wait, take queued requests in arrival order up to a
padded-token budget) as sidecar flags; the classic sleep-then-drain micro-batcher
(``classic.py``); KServe's batcher (``bench/kserve``, ``make kserve-batcher``); Ray Serve's
``@serve.batch`` (``bench/ray``, ``make ray-serve``); BentoML's adaptive batcher
(``bench/bentoml``, ``make bentoml``). Every sidecar row but the defaults' passes every batching
flag, so what it measures does not move when the defaults do.

The model (``--model``) is the demo model, which charges its cost formula, or the real sentence
encoder (``modelroll-encoder``, int8), sent English sentences of the drawn lengths in words; in
front of the encoder every sidecar row with flags counts lengths in the encoder's own tokens
(``--length-from tokenizer``), and the model's limit and padding are measured, not computed.

Length distributions (``--lengths``, each measured in full): ``lognormal`` (lognormal:3,0.7) and
``bimodal`` (bimodal:8,16,100,200,0.2: 80% short, 20% long); see ``lengths.py`` for why. The demo
model charges padded tokens, so how a batcher groups lengths shows in its cost.

Loads (``--loads-from``): shares of the model's limit, parallel x max batch / E[cost of a full
batch of random lengths] (what a batcher that ignores length can get out of it; the demo model's
default, shares 10-90%), or shares of no batching's saturation, measured with wrk through the
no-batching sidecar before the rounds (the encoder's default, shares 10-120%). Every load is
run, past a system's saturation too: the run's arrivals last ``--duration-s``, answers are waited
for at most the SLO after the last arrival, and what is still unanswered then counts as not
within the SLO (a percentile that falls among them is unknown, shown as ``-``).

Figures, per distribution, system and round: throughput at saturation (wrk, cycling through the
same bodies); at each load, p50/p95/p99 under Poisson arrivals, p99 per length decile, and the
requests per second answered within the SLO (goodput at that load); goodput under the p99 SLO
(the highest arrival rate whose p99 stays within it, found by bisection); the mean batch size and
the padding efficiency (useful tokens over padded tokens), both from the model's own counters, so
every batcher is counted the same way. Before each distribution's systems, the cost of a batch of
one at the median length is measured straight at the model; and for each system, before its
saturation run, the time of a lone request through it. Systems alternate within each round, and
every figure is reported as median and range over the rounds; ratios to no batching (and to the
best static configuration) are taken within a round, then the median.

``--length-switch`` measures instead one run per system and round whose first half sends short
sentences and second half long ones (``length_switch.py``), at one load.

Targets, judged for the sidecar's defaults:

* at every load, requests/s answered within the SLO not below no batching's, and at least
  0.95x the best static configuration's (paired by round; 1% tolerance against no batching);
* goodput under the p99 SLO not below no batching's, and at least 0.95x the best static's;
* at 10% load, p50 within 1 ms of no batching's.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from . import arithmetic, length_switch, plots
from .figures import BatchSummary, Figure, OpenRun
from .lengths import PRESETS, parse, parse_list
from .lengths import name as lengths_name
from .metrics import BatchCounters, Watch
from .runs import (
    Saturated,
    Scenario,
    bar,
    batch_of_one_ms,
    idle,
    load_average,
    lone_request_ms,
    machine,
    open_report,
    saturate,
    write,
)
from .stats import Spread, paired_ratios, spread
from .systems import (
    BENTOML_PYTHON,
    KSERVE_BIN,
    RAY_PYTHON,
    Batching,
    StartError,
    System,
    batcher,
)

BASELINE = "no batching"
DEFAULTS = "sidecar default (self-tuning)"
BEST_STATIC = "best static"
LENGTH, ADAPTIVE, BOTH = "sidecar length-aware", "sidecar adaptive", "sidecar length + adaptive"
TEI = "TEI rule (no wait, token budget)"
JUDGED = (DEFAULTS,)
"""The systems the targets are judged on."""
OF_BEST_TARGET = 0.95
"""Goodput against the best static configuration's, at every load and under the SLO."""
BATCH_OF_ONE_MARGIN_MS = 1.0
"""At 10% load, p50 may exceed no batching's by this much."""
LOW_SHARE = 0.1
DECILE_SHARES = (0.7, 0.9)
"""The loads whose p99 by length decile is reported against no batching's."""
NOT_BELOW_TOLERANCE = 0.01
LIMIT_SHARES = (0.1, 0.3, 0.5, 0.7, 0.9)
"""Loads as shares of the model's limit (``--loads-from limit``)."""
SATURATION_SHARES = (0.1, 0.3, 0.5, 0.7, 0.9, 1.0, 1.2)
"""Loads as shares of no batching's saturation (``--loads-from no-batching``)."""
LoadsFrom = Literal["limit", "no-batching"]
TEI_ROWS = 32
"""text-embeddings-inference's default token budget, 16384, is 32 inputs of the longest its
default models (BERT's 512 positions) take; the TEI row's budget is as many of the longest input
the model here takes, ``TEI_MAX_LENGTH``."""
TEI_MAX_LENGTH = 256
"""modelroll-encoder truncates at 256 tokens (all-MiniLM-L6-v2's max_seq_length); the demo model
is given the same, which is above any length the presets draw but a few."""
TEI_MAX_BATCH = 256
"""TEI bounds a batch's request count only when told to; 256 is the most one call to
modelroll-encoder takes."""
WIDTH = 33
"""Width of the system column in the tables (the longest label is 32 characters)."""


@dataclass(frozen=True)
class Setup:
    scenario: Scenario = field(default_factory=Scenario)
    """The model's cost and the seed; its ``lengths`` is ignored for ``distributions``."""
    distributions: tuple[str, ...] = ("lognormal", "bimodal")
    """Preset names or specs (lengths.py), each measured in full."""
    max_batch: int = 32
    max_wait_ms: float = 10.0
    max_batch_tokens: int = 1536
    tei_tokens: int = TEI_ROWS * TEI_MAX_LENGTH
    loads_from: LoadsFrom = "limit"
    shares: tuple[float, ...] = LIMIT_SHARES
    slo_ms: float = 150.0
    duration_s: float = 6.0
    connections: int = 128
    rounds: int = 3
    goodput_probes: int = 4
    only: tuple[str, ...] = ()
    best_static: tuple[tuple[str, str], ...] = ()
    """``--best-static``: (where, sidecar flags); where is "" (every load), a share such as
    "0.5", or "switch" (the long half of ``--length-switch``)."""

    @property
    def unit(self) -> str:
        return "tokenizer" if self.scenario.model == "encoder" else "words"

    @property
    def fifo(self) -> Batching:
        return Batching(self.max_batch, self.max_wait_ms, length_from=self.unit)

    @property
    def fifo_label(self) -> str:
        return f"sidecar FIFO, B={self.max_batch} {self.max_wait_ms:g} ms"

    def no_batching(self) -> System:
        return System(BASELINE, "sidecar", replace(self.fifo, max_batch=1))

    def best_static_at(self, where: str) -> Batching | None:
        """The best static configuration ``--best-static`` gives for ``where`` (a share as text,
        or "switch"), else the one it gives for every load, else None."""
        found = dict(self.best_static)
        flags = found.get(where, found.get(""))
        return None if flags is None else Batching.from_flags(flags, self.fifo)

    def systems(self, where: str = "") -> list[System]:
        """The systems ``--only`` selects; the best static row runs the configuration
        ``--best-static`` gives for ``where`` ("" for the loads, "switch" for the length
        switch), and is left out when it gives none."""
        fifo = self.fifo
        tei = Batching(TEI_MAX_BATCH, 0, self.tei_tokens, "arrival", "fixed", self.unit)
        best = self.best_static_at(where)
        every = [
            self.no_batching(),
            System(DEFAULTS, "sidecar", fifo, defaults=True),
            *([System(BEST_STATIC, "sidecar", best)] if best else []),
            System(self.fifo_label, "sidecar", fifo),
            System(
                "sidecar + tokens", "sidecar", replace(fifo, max_batch_tokens=self.max_batch_tokens)
            ),
            System(LENGTH, "sidecar", replace(fifo, batch_by="length")),
            System(ADAPTIVE, "sidecar", replace(fifo, wait_policy="adaptive")),
            System(BOTH, "sidecar", replace(fifo, batch_by="length", wait_policy="adaptive")),
            System(TEI, "sidecar", tei),
            System("sleep-then-drain", "classic", fifo),
            System("KServe batcher", "kserve", fifo),
            System("Ray Serve batch", "ray", fifo),
            System("BentoML adaptive", "bentoml", fifo, slo_ms=self.slo_ms),
        ]
        return [s for s in every if not self.only or s.label in self.only]

    def share_systems(self, system: System) -> dict[float, System]:
        """The loads at which ``system`` runs another configuration than its own: the best
        static configuration's per-load entries."""
        if system.label != BEST_STATIC:
            return {}
        found = {share: self.best_static_at(str(share)) for share in self.shares}
        return {
            share: replace(system, batching=b)
            for share, b in found.items()
            if b is not None and b != system.batching
        }

    def scenario_for(self, distribution: str) -> Scenario:
        return replace(self.scenario, lengths=PRESETS.get(distribution, distribution))

    @property
    def wrk_seconds(self) -> int:
        return max(1, round(self.duration_s))

    @property
    def drain_s(self) -> float:
        """How long an open run waits after its last arrival: an answer later than this is
        past the SLO whatever its arrival."""
        return self.slo_ms / 1000

    def estimate_s(self, systems: int) -> float:
        """A rough duration of the whole run: every measured run, plus about 1.5 s per run for
        starting servers, draining, and reading counters (measured on the 2-CPU machine), and
        with loads from no batching's saturation, its measurement per distribution."""
        runs = self.rounds * len(self.distributions) * systems
        per_run = self.duration_s + self.drain_s
        per_system = self.wrk_seconds + (len(self.shares) + self.goodput_probes) * per_run
        calibration = (self.wrk_seconds + 5) * len(self.distributions)
        if self.loads_from == "limit":
            calibration = 0
        return calibration + runs * (
            per_system + 1.5 * (1 + len(self.shares) + self.goodput_probes)
        )


@dataclass(frozen=True)
class Loads:
    """What the loads of a distribution are shares of: ``reference_rps``, called ``name`` in
    the report; and the model's limit at the max batch, which saturation is reported against."""

    name: str
    reference_rps: float
    limit_rps: float


def unavailable(system: System) -> str | None:
    """Why a system cannot run here, or None."""
    if system.kind == "kserve" and not KSERVE_BIN.exists():
        return f"{KSERVE_BIN} is missing: `make kserve-batcher` did not build it (see its output)"
    if system.kind == "ray" and not RAY_PYTHON.exists():
        return f"{RAY_PYTHON} is missing: `make ray-serve` did not make it (see its output)"
    if system.kind == "bentoml" and not BENTOML_PYTHON.exists():
        return f"{BENTOML_PYTHON} is missing: `make bentoml` did not make it (see its output)"
    return None


@dataclass(frozen=True)
class ShareRun:
    """One fixed load of a round: its share, the open-loop run, and the configuration it ran
    when the system has one of its own for that load."""

    share: float
    run: OpenRun
    configuration: str | None = None


@dataclass(frozen=True)
class Goodput:
    """The highest rate tried that met the SLO: what it served, its rate and p99, its latency
    by length decile (none where no rate met it), and every rate tried."""

    rps: float
    offered_rps: float | None
    p99_ms: float | None
    by_length_decile: list[dict[str, Any]] | None
    probes: list[float]


@dataclass(frozen=True)
class Round:
    """One round of one system: a lone request's time, saturation (and its share of the
    model's limit), the fixed loads by share, the goodput search, and every batch the model ran
    in the round."""

    round: int
    load_average_1m: float
    lone_ms: float
    saturation: Saturated
    of_model_limit: float
    shares: dict[str, ShareRun]
    goodput: Goodput
    total: BatchSummary | None

    def at(self, share: float) -> OpenRun | None:
        found = self.shares.get(str(share))
        return None if found is None else found.run


async def measure(
    system: System,
    model: str,
    setup: Setup,
    scenario: Scenario,
    loads: Loads,
    round_no: int,
    progress: Any,
    lone_length: int,
) -> Round:
    """One round for one system: one lone request of ``lone_length`` tokens at a time,
    saturation, the fixed shares, then the goodput search."""
    workload, stats = scenario.workload, model + "/v1/stats"
    load_average_1m = round(load_average(), 2)
    per_share = setup.share_systems(system)
    probes = BatchCounters()  # the batches of one idle() sent, left out of the round's figures

    def step(what: str) -> None:
        progress.set_postfix_str(f"round {round_no} {system.label}: {what}")

    async def run_at(url: str, rate: float) -> OpenRun:
        result = await open_report(
            url,
            workload,
            rate,
            setup.duration_s,
            seed=round_no,
            label=system.label,
            stats_url=stats,
            slo_ms=setup.slo_ms,
            drain_s=setup.drain_s,
        )
        if result.load.errors.get("unanswered"):
            nonlocal probes
            probes += await idle(stats)  # the backlog the run left, before the next run starts
        return result

    async with Watch(stats) as whole, batcher(system, model, scenario.parallel) as url:
        # First, so no arrival rate from a burst lingers (the adaptive wait's estimate follows
        # about a second); its warm-up calls also train the adaptive wait's cost fit.
        step("lone requests")
        lone_ms = round(await lone_request_ms(url, scenario.workload.text(lone_length)), 3)
        step("saturation")
        sat = await saturate(
            url,
            workload,
            setup.connections,
            setup.wrk_seconds,
            label=system.label,
            stats_url=stats,
        )
        progress.update()
        probes += await idle(stats)
        tried: dict[float, OpenRun] = {}
        shares: dict[str, ShareRun] = {}
        for share in setup.shares:
            step(f"{share:.0%} of {loads.name}")
            rate = share * loads.reference_rps
            if share in per_share:
                async with batcher(per_share[share], model, scenario.parallel) as share_url:
                    result = await run_at(share_url, rate)
                shares[str(share)] = ShareRun(share, result, per_share[share].name)
            else:
                result = tried[rate] = await run_at(url, rate)
                shares[str(share)] = ShareRun(share, result)
            progress.update()

        def meets(found: OpenRun) -> bool:
            return arithmetic.meets_slo(found.load, setup.slo_ms)

        passing = [r for r, res in tried.items() if meets(res)]
        failing = [r for r, res in tried.items() if not meets(res)]
        searched = 0
        for _ in range(setup.goodput_probes):
            ceiling = arithmetic.SATURATED * sat.result.rps
            probe = arithmetic.next_probe(passing, failing, ceiling)
            if probe is None:
                break
            step(f"goodput probe at {probe:.0f} req/s")
            result = tried[probe] = await run_at(url, probe)
            (passing if meets(result) else failing).append(probe)
            progress.update()
            searched += 1
        progress.update(setup.goodput_probes - searched)
        best = max(passing, default=None)
        found = None if best is None else tried[best]
        goodput = Goodput(
            rps=found.load.throughput_rps if found is not None else 0.0,
            offered_rps=round(best, 1) if best is not None else None,
            p99_ms=found.load.p99_ms if found is not None else None,
            by_length_decile=found.by_length_decile if found is not None else None,
            probes=sorted(round(r, 1) for r in tried),
        )
    # Every batch the model ran for this system in the round: saturation, loads and probes.
    total = None if whole.delta is None else (whole.delta - probes).report()
    of_limit = round(sat.result.rps / loads.limit_rps, 3)
    return Round(round_no, load_average_1m, lone_ms, sat, of_limit, shares, goodput, total)


Getter = Callable[[Round], float | None]
"""One per-round figure of a system's round."""


def _batching(found: BatchSummary | None, key: str) -> float | None:
    value = None if found is None else getattr(found, key)
    return None if value is None else float(value)


def _at(share: float, figure: Callable[[OpenRun], float | None]) -> Getter:
    def get(row: Round) -> float | None:
        found = row.at(share)
        return None if found is None else figure(found)

    return get


def figure_getters(setup: Setup) -> dict[str, Getter]:
    """Every per-round figure aggregate() reports, by name, and how to read it from a round."""
    getters: dict[str, Getter] = {
        "saturation_rps": lambda r: r.saturation.result.rps,
        "lone_ms": lambda r: r.lone_ms,
        "goodput_rps": lambda r: r.goodput.rps,
        "mean_batch_at_saturation": lambda r: _batching(r.saturation.batching, "mean_batch"),
        "padding_at_saturation": lambda r: _batching(r.saturation.batching, "padding_efficiency"),
        "mean_batch_overall": lambda r: _batching(r.total, "mean_batch"),
        "padding_overall": lambda r: _batching(r.total, "padding_efficiency"),
    }
    for share in setup.shares:
        at = f"{share:.0%}"
        getters[f"p50_at_{at}"] = _at(share, lambda o: o.load.p50_ms)
        getters[f"p95_at_{at}"] = _at(share, lambda o: o.load.p95_ms)
        getters[f"p99_at_{at}"] = _at(share, lambda o: o.load.p99_ms)
        getters[f"slo_rps_at_{at}"] = _at(share, lambda o: o.within_slo_rps)
        getters[f"mean_batch_at_{at}"] = _at(share, lambda o: _batching(o.batching, "mean_batch"))
        getters[f"padding_at_{at}"] = _at(
            share, lambda o: _batching(o.batching, "padding_efficiency")
        )
    return getters


def aggregate(setup: Setup, rounds: dict[str, list[Round]], limit: float) -> dict[str, Any]:
    """Median and range over rounds of every figure, and the same as ratios to the baseline (and
    to the best static configuration, when it ran); and at the decile shares, p99 per length
    decile and the worst decile's excess over the baseline's."""
    out: dict[str, Any] = {}
    base = rounds.get(BASELINE, [])
    best = rounds.get(BEST_STATIC, [])
    getters = figure_getters(setup)
    for label, rows in rounds.items():
        entry: dict[str, Any] = {}
        for name, get in getters.items():
            values = [get(row) for row in rows]
            entry[name] = Figure(
                spread(values, 3 if "padding" in name else 2),
                _paired(values, rows, base, get),
                _paired(values, rows, best, get),
            )
        sat = spread([v for v in (getters["saturation_rps"](r) for r in rows) if v])
        entry["saturation_of_limit"] = sat and round(sat.median / limit, 3)
        for share in DECILE_SHARES:
            if share in setup.shares:
                entry[f"deciles_at_{share:.0%}"] = arithmetic.median_deciles(
                    [_deciles(row, share) for row in rows]
                )
        out[label] = entry
    if BASELINE not in out:
        return out
    for label, entry in out.items():
        for share in DECILE_SHARES:
            key = f"deciles_at_{share:.0%}"
            if key not in entry:
                continue
            worst = arithmetic.worst_decile_gap(entry[key], out[BASELINE][key])
            theirs = {b.round: _deciles(b, share) for b in base}
            per_round = [
                gap["gap_ms"]
                for row in rounds[label]
                if (
                    gap := arithmetic.worst_decile_gap(
                        _deciles(row, share), theirs.get(row.round, [])
                    )
                )
                is not None
            ]
            entry[f"decile_gap_at_{share:.0%}"] = {
                "worst_of_medians": worst,
                "per_round_worst_ms": spread(per_round, 1),
            }
    return out


def _paired(
    values: list[float | None], rows: list[Round], reference: list[Round], get: Getter
) -> Spread | None:
    """Median and range of ``values / reference's figure`` from the same round (a round the
    reference has no figure for is left out)."""
    by_round = {r.round: get(r) for r in reference}
    same_round = [by_round.get(row.round) for row in rows]
    return spread(paired_ratios(values, same_round))


def _deciles(row: Round, share: float) -> list[dict[str, Any]]:
    found = row.at(share)
    return [] if found is None else list(found.by_length_decile)


Check = tuple[str, str, bool, str]
"""(target, system, met, measured)."""


def checks(setup: Setup, summary: dict[str, Any]) -> list[Check]:
    """The targets for the judged systems measured on one distribution: against no batching
    (when it ran) and against the best static configuration (when it ran)."""
    out: list[Check] = []
    judged = [s for s in JUDGED if s in summary]
    references: list[tuple[str, Callable[[Figure], Spread | None], float, str]] = [
        (BASELINE, lambda f: f.ratio_to_baseline, 1 - NOT_BELOW_TOLERANCE, "not below"),
        (
            BEST_STATIC,
            lambda f: f.ratio_to_best_static,
            OF_BEST_TARGET,
            f"at least {OF_BEST_TARGET:g}x",
        ),
    ]
    for reference, ratio_of, least, words in references:
        if reference not in summary:
            continue
        keys = [("goodput_rps", f"goodput (p99 <= {setup.slo_ms:g} ms)")] + [
            (f"slo_rps_at_{s:.0%}", f"at {s:.0%} load, requests/s answered within the SLO")
            for s in setup.shares
        ]
        for figure, what in keys:
            target = f"{what} {words} {reference}'s"
            for label in judged:
                r = ratio_of(summary[label][figure])
                value = summary[label][figure].value
                text = f"{value.median:.1f} req/s, " if value else ""
                met = r is not None and r.median >= least
                out.append((target, label, met, text + _ratio_text(r)))
    low = f"p50_at_{LOW_SHARE:.0%}"
    base_figure = summary.get(BASELINE, {}).get(low)
    base_p50 = None if base_figure is None else base_figure.value
    if base_p50 is not None:
        target = (
            f"at {LOW_SHARE:.0%} load, p50 within {BATCH_OF_ONE_MARGIN_MS:g} ms of {BASELINE}'s "
            f"({base_p50.median:.2f} ms)"
        )
        for label in judged:
            p50 = summary[label][low].value
            if p50 is None:
                out.append((target, label, False, "not measured"))
                continue
            excess = p50.median - base_p50.median
            out.append(
                (
                    target,
                    label,
                    excess <= BATCH_OF_ONE_MARGIN_MS,
                    f"p50 {p50.median:.2f} ms ({p50.low:.2f}-{p50.high:.2f}), {excess:+.2f} ms",
                )
            )
    return out


def _ratio_text(r: Spread | None) -> str:
    if r is None:
        return "no ratio (a system was not measured)"
    return f"{r.median:.2f}x ({r.low:.2f}-{r.high:.2f})"


def _median(fig: Spread | None, fmt: str = ".0f") -> str:
    return "-" if fig is None else format(fig.median, fmt)


def print_tables(setup: Setup, distribution: dict[str, Any], label_width: int = WIDTH) -> None:
    """One distribution's figures as tables a human can read (medians over rounds)."""
    summary, limit = distribution["summary"], distribution["model_limit_rps"]
    w = label_width

    def cell(entry: dict[str, Any], key: str, ratio: bool = False) -> str:
        fig = entry[key].ratio_to_baseline if ratio else entry[key].value
        if fig is None:
            return "-"
        if ratio:
            return f"{fig.median:.2f}x ({fig.low:.2f}-{fig.high:.2f})"
        return f"{fig.median:.0f} ({fig.low:.0f}-{fig.high:.0f})"

    print(
        f"\n=== {distribution['name']} ({distribution['lengths']}): model's limit {limit:.0f} "
        f"req/s; medians over rounds (range); ratios to {BASELINE}, paired by round ==="
    )
    print(
        f"{'system':<{w}} {'saturation req/s':<18} {'ratio':<20} {'of limit':<9}"
        f"{'goodput req/s':<16} {'ratio':<20} mean batch (saturation)"
    )
    for label, entry in summary.items():
        print(
            f"{label:<{w}} {cell(entry, 'saturation_rps'):<18} "
            f"{cell(entry, 'saturation_rps', True):<20} {entry['saturation_of_limit'] or 0:<9.0%}"
            f"{cell(entry, 'goodput_rps'):<16} {cell(entry, 'goodput_rps', True):<20} "
            f"{_median(entry['mean_batch_at_saturation'].value, '.1f')}"
        )

    shares, reference = setup.shares, distribution["loads"]
    rate = reference["reference_rps"]
    heads = " ".join(f"{f'{s:.0%} ({s * rate:.0f}/s)':>20}" for s in shares)
    print(
        f"\nLoads are shares of {reference['name']}, {rate:.1f} req/s. Requests/s answered within "
        f"{setup.slo_ms:g} ms (goodput at that load); ratios to {BASELINE}, then to "
        f"{BEST_STATIC} where it ran (medians of paired rounds):\n{'system':<{w}} {heads}"
    )
    for label, entry in summary.items():
        cells = []
        for s in shares:
            fig = entry[f"slo_rps_at_{s:.0%}"]
            ratios = [r for r in (fig.ratio_to_baseline, fig.ratio_to_best_static) if r]
            text = _median(fig.value, ".1f")
            cells.append(" ".join([text, *(_median(r, ".2f") + "x" for r in ratios)]))
        print(f"{label:<{w}} " + " ".join(f"{c:>20}" for c in cells))
    print(
        f"\np50 / p95 / p99 ms (-: among the requests unanswered {setup.drain_s:g} s after the "
        f"last arrival):\n{'system':<{w}} {heads}"
    )
    for label, entry in summary.items():
        cells = []
        for s in shares:
            figs = [entry[f"{q}_at_{s:.0%}"].value for q in ("p50", "p95", "p99")]
            cells.append("/".join(_median(f) for f in figs))
        print(f"{label:<{w}} " + " ".join(f"{c:>20}" for c in cells))
    print(f"\np50 and p99 as ratios to {BASELINE} (median of paired rounds):")
    print(f"{'system':<{w}} " + " ".join(f"{f'{s:.0%}':>20}" for s in shares))
    for label, entry in summary.items():
        cells = []
        for s in shares:
            r = [entry[f"{q}_at_{s:.0%}"].ratio_to_baseline for q in ("p50", "p99")]
            cells.append("-" if None in r else f"{_median(r[0], '.2f')} / {_median(r[1], '.2f')}")
        print(f"{label:<{w}} " + " ".join(f"{c:>20}" for c in cells))

    one = distribution["batch_of_one"]
    if LOW_SHARE in shares:
        measured = one["measured_ms"]
        # Only the demo model has a cost formula to compare with.
        formula = one.get("cost_model_ms")
        print(
            f"\nAt {LOW_SHARE:.0%} load: p50 against the cost of a batch of one at the median "
            f"length ({one['median_length']} tokens): measured at the model "
            f"{_median(measured, '.2f')} ms"
            + (f"; cost model {formula:.2f} ms." if formula is not None else ".")
        )
        print(
            "A lone request through each batcher (one at a time, nothing else in flight) "
            "is the batch of one plus the batcher's hop and any wait for company; the rest of "
            "the p50 is queueing behind batches that were running."
        )
        print(
            f"{'system':<{w}} {'p50 ms (range)':>20} {'- batch of one':>15} {'lone request':>13} "
            f"{'p50 - lone':>11}"
        )
        for label, entry in summary.items():
            p50, lone = entry[f"p50_at_{LOW_SHARE:.0%}"].value, entry["lone_ms"].value
            if p50 is None:
                print(f"{label:<{w}} {'-':>20}")
                continue
            excess = f"{p50.median - measured.median:+.2f}" if measured else "-"
            text = f"{p50.median:.2f} ({p50.low:.2f}-{p50.high:.2f})"
            alone = f"{lone.median:.2f}" if lone else "-"
            queued = f"{p50.median - lone.median:+.2f}" if lone else "-"
            print(f"{label:<{w}} {text:>20} {excess:>15} {alone:>13} {queued:>11}")

    for share in DECILE_SHARES:
        key = f"deciles_at_{share:.0%}"
        base: list[dict[str, Any]] = summary.get(BASELINE, {}).get(key) or next(
            (e[key] for e in summary.values() if e.get(key)), []
        )
        if not base:
            continue
        ranges = {d["decile"]: d["lengths"] for d in base}
        columns = sorted(ranges)
        print(
            f"\np99 ms by length decile at {share:.0%} load (median over rounds); last column: "
            f"the worst decile's p99 minus {BASELINE}'s"
        )
        print(
            f"{'system':<{w}} "
            + " ".join(f"{f'{ranges[d][0]}-{ranges[d][1]}':>8}" for d in columns)
            + "  worst vs baseline"
        )
        for label, entry in summary.items():
            mine = {d["decile"]: d["p99_ms"] for d in entry.get(key, [])}
            gap = entry.get(f"decile_gap_at_{share:.0%}", {}).get("worst_of_medians")
            worst = f"{gap['gap_ms']:+.1f} (d{gap['decile']})" if gap else "-"
            print(
                f"{label:<{w}} "
                + " ".join(f"{mine[d]:>8.0f}" if d in mine else f"{'-':>8}" for d in columns)
                + f"  {worst}"
            )

    points = [("saturation", "at_saturation")] + [(f"{s:.0%}", f"at_{s:.0%}") for s in shares]
    points.append(("whole round", "overall"))
    print(
        "\nPadding efficiency (useful / padded tokens) and mean batch size, from the model's "
        "counters:"
    )
    print(f"{'system':<{w}} " + " ".join(f"{p:>13}" for p, _ in points))
    for label, entry in summary.items():
        cells = []
        for _, key in points:
            eff, size = entry[f"padding_{key}"].value, entry[f"mean_batch_{key}"].value
            cells.append("-" if eff is None else f"{eff.median:.2f} ({_median(size, '.1f')})")
        print(f"{label:<{w}} " + " ".join(f"{c:>13}" for c in cells))


def print_checks(name: str, found: list[Check]) -> None:
    if not found:
        return
    print(f"\nTargets on {name}:")
    last = None
    for target, label, met, measured in found:
        if target != last:
            print(f"  {target}:")
            last = target
        print(f"    [{'met' if met else 'MISSED'}] {label:<{WIDTH}} {measured}")


async def distribution(
    setup: Setup, name: str, scenario: Scenario, model: str, systems: list[System]
) -> dict[str, Any]:
    """A length distribution's entry in the report, before any round: the model's limit at the
    max batch (the demo model's from its formula, a real model's measured at ``model``), what
    the loads are shares of, and the median length a lone request carries."""
    sample = scenario.workload.sample()
    [limit] = (await scenario.limits_rps(model, [setup.max_batch])).values()
    median = int(statistics.median_low(sample))
    entry: dict[str, Any] = {
        "name": name,
        "lengths": scenario.lengths,
        "model_limit_rps": round(limit, 1),
        "batch_of_one": {"median_length": median, "measured_ms_by_round": []},
        "rounds": {s.label: [] for s in systems},
    }
    how = "measured"
    if scenario.model == "demo":
        sent = scenario.cost.limit_rps(sample, setup.max_batch, seed=scenario.seed)
        entry["bodies_limit_rps"] = round(sent, 1)
        entry["batch_of_one"]["cost_model_ms"] = round(scenario.cost.batch_ms([median]), 3)
        how = f"Monte Carlo; {sent:.1f} req/s for the {scenario.workload.bodies} bodies sent"
    print(
        f"  {name} = {scenario.lengths}: model's limit at max batch {setup.max_batch} "
        f"{limit:.1f} req/s ({how}); median length {median}, longest sent {max(sample)}.",
        flush=True,
    )
    loads = Loads("the model's limit", limit, limit)
    if setup.loads_from == "no-batching":
        rps = await saturation_rps(setup.no_batching(), model, scenario, setup)
        loads = Loads(f"{BASELINE}'s saturation", rps, limit)
        print(f"  {BASELINE}'s saturation (wrk): {rps:.1f} req/s.", flush=True)
    entry["loads"] = asdict(loads)
    return entry


async def saturation_rps(system: System, model: str, scenario: Scenario, setup: Setup) -> float:
    """``system``'s throughput at saturation under ``scenario``'s lengths (wrk, as each round
    measures it), in a run of its own; the model is idle again when it returns."""
    async with batcher(system, model, scenario.parallel) as url:
        sat = await saturate(
            url, scenario.workload, setup.connections, setup.wrk_seconds, label=system.label
        )
        await idle(model + "/v1/stats")
    return sat.result.rps


async def run(setup: Setup, plots_dir: Path) -> dict[str, Any]:
    systems = setup.systems()
    notes = {s.label: why for s in systems if (why := unavailable(s)) is not None}
    runnable = [s for s in systems if s.label not in notes]
    scenarios = {lengths_name(parse(d)): setup.scenario_for(d) for d in setup.distributions}
    base = setup.scenario
    print(
        f"{base.describe()} Max batch {setup.max_batch}, max-wait {setup.max_wait_ms:g} ms, "
        f"p99 SLO {setup.slo_ms:g} ms; {setup.rounds} rounds of {len(runnable)} systems x "
        f"{len(scenarios)} length distributions, {setup.duration_s:g} s per run. Load average "
        f"{load_average():.2f} on {machine()['cpus']} CPUs. Estimated duration "
        f"{setup.estimate_s(len(runnable)) / 60:.0f} min.",
        flush=True,
    )
    for label, why in notes.items():
        print(f"  {label}: not measured: {why}", flush=True)
    dists: dict[str, dict[str, Any]] = {}
    per_round = 1 + len(setup.shares) + setup.goodput_probes
    total = setup.rounds * len(scenarios) * len(runnable) * per_round
    async with base.serve() as model:
        for name, scenario in scenarios.items():
            dists[name] = await distribution(setup, name, scenario, model, runnable)
        with bar(total, "make bench") as progress:
            for r in range(1, setup.rounds + 1):
                # Alternate the order between rounds so no system always runs first or last.
                order = runnable if r % 2 else list(reversed(runnable))
                for name, scenario in scenarios.items():
                    dist = dists[name]
                    one = dist["batch_of_one"]
                    payload = scenario.workload.text(one["median_length"])
                    one["measured_ms_by_round"].append(
                        round(await batch_of_one_ms(model, payload), 3)
                    )
                    for system in order:
                        if system.label in notes:
                            continue
                        try:
                            dist["rounds"][system.label].append(
                                await measure(
                                    system,
                                    model,
                                    setup,
                                    scenario,
                                    Loads(**dist["loads"]),
                                    r,
                                    progress,
                                    one["median_length"],
                                )
                            )
                        except StartError as exc:
                            notes[system.label] = f"did not start: {exc}"
                            print(f"  {system.label}: {notes[system.label]}", flush=True)
    every_check: list[dict[str, Any]] = []
    for name, dist in dists.items():
        rounds = {k: v for k, v in dist["rounds"].items() if v}
        dist["summary"] = aggregate(setup, rounds, dist["model_limit_rps"])
        one = dist["batch_of_one"]
        one["measured_ms"] = spread(one["measured_ms_by_round"])
        found = checks(setup, dist["summary"])
        dist["targets"] = [
            {"target": t, "system": s, "met": ok, "measured": m} for t, s, ok, m in found
        ]
        every_check += [{"lengths": name, **c} for c in dist["targets"]]
        print_tables(setup, dist)
    for name, dist in dists.items():
        print_checks(
            name, [(c["target"], c["system"], c["met"], c["measured"]) for c in dist["targets"]]
        )
    report = {
        "setup": asdict(setup),
        "machine": machine(),
        "systems": {s.label: {"kind": s.kind, "configuration": s.name} for s in systems},
        "notes": notes,
        "targets": every_check,
        "distributions": dists,
    }
    for why in notes.values():
        print(f"Note: {why}")
    written = plots.compare(report, plots_dir)
    print("Plots: " + ", ".join(str(p) for p in written))
    return report


async def run_switch(setup: Setup, switch: length_switch.Switch) -> dict[str, Any]:
    """``--length-switch``: every selected system through a run whose lengths change halfway
    (length_switch.py), ``setup.rounds`` times; the best static row runs ``--best-static
    switch=FLAGS`` when given."""
    systems = setup.systems("switch")
    notes = {s.label: why for s in systems if (why := unavailable(s)) is not None}
    runnable = [s for s in systems if s.label not in notes]
    calibration_s = setup.wrk_seconds + 5
    print(
        f"{setup.scenario.describe()} Lengths switch from {switch.before} to {switch.after} "
        f"after {switch.half_s:g} s; goodput in windows of {switch.window_s:g} s, p99 SLO "
        f"{setup.slo_ms:g} ms; {setup.rounds} rounds of {len(runnable)} systems. Estimated "
        f"duration {switch.estimate_s(setup.rounds, len(runnable), calibration_s) / 60:.0f} min.",
        flush=True,
    )
    for label, why in notes.items():
        print(f"  {label}: not measured: {why}", flush=True)
    rounds: dict[str, list[dict[str, Any]]] = {s.label: [] for s in runnable}
    async with setup.scenario.serve() as model:
        long = replace(setup.scenario, lengths=switch.after)
        reference = await saturation_rps(setup.no_batching(), model, long, setup)
        rate = switch.share * reference
        print(
            f"  {BASELINE}'s saturation on {switch.after}: {reference:.1f} req/s; the runs "
            f"send {rate:.1f} req/s ({switch.share:.0%}).",
            flush=True,
        )
        with bar(setup.rounds * len(runnable), "length switch") as progress:
            for r in range(1, setup.rounds + 1):
                for system in runnable if r % 2 else list(reversed(runnable)):
                    progress.set_postfix_str(f"round {r} {system.label}")
                    try:
                        rounds[system.label].append(
                            await length_switch.one_run(
                                system, model, setup.scenario, switch, rate, r, setup.slo_ms
                            )
                        )
                    except StartError as exc:
                        notes[system.label] = f"did not start: {exc}"
                    progress.update()
    summary = length_switch.summarize({k: v for k, v in rounds.items() if v}, BASELINE, BEST_STATIC)
    recovered = {
        label: length_switch.recovery_s(entry, switch.window_s) for label, entry in summary.items()
    }
    length_switch.print_windows(summary, switch, WIDTH)
    found: list[Check] = []
    if DEFAULTS in summary and BEST_STATIC in summary:
        took, limit_s = recovered[DEFAULTS], length_switch.RECOVERY_TARGET_S
        target = f"after the switch, back within 5% of {BEST_STATIC}'s goodput within {limit_s:g} s"
        measured = "not within the run" if took is None else f"after {took:g} s"
        found.append((target, DEFAULTS, took is not None and took <= limit_s, measured))
    print_checks("the length switch", found)
    for why in notes.values():
        print(f"Note: {why}")
    return {
        "setup": asdict(setup),
        "switch": {**asdict(switch), "reference_rps": reference, "rate_rps": round(rate, 2)},
        "machine": machine(),
        "systems": {s.label: {"kind": s.kind, "configuration": s.name} for s in systems},
        "notes": notes,
        "rounds": rounds,
        "summary": summary,
        "recovery_s": recovered,
        "targets": [{"target": t, "system": s, "met": ok, "measured": m} for t, s, ok, m in found],
    }


def _shares(text: str) -> tuple[float, ...]:
    try:
        shares = tuple(float(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r}: shares are numbers, e.g. 0.1,0.5,0.9"
        ) from None
    if not all(s > 0 for s in shares):
        raise argparse.ArgumentTypeError(f"{text!r}: shares must be above 0")
    return shares


def _distributions(text: str) -> tuple[str, ...]:
    try:
        return tuple(lengths_name(d) for d in parse_list(text))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _best_static(text: str) -> tuple[str, str]:
    """``[WHERE=]FLAGS`` -> (where, flags), where is "", a share as ``str(float)`` or
    "switch"; the flags are checked here, before anything starts."""
    where, sep, flags = text.partition("=")
    if not sep or where.startswith("-"):
        where, flags = "", text
    elif where != "switch":
        try:
            where = str(float(where))
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{text!r}: WHERE is a share such as 0.5, or switch"
            ) from None
    try:
        Batching.from_flags(flags, Batching())
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return where, flags


def add_arguments(parser: argparse.ArgumentParser) -> None:
    d = Setup()
    Scenario.add_arguments(
        parser,
        "compare",
        lengths=",".join(d.distributions),
        lengths_help="length distributions, comma-separated: preset names (lognormal, bimodal) "
        "or specs such as lognormal:3,0.7; each is measured in full",
    )
    parser.add_argument("--max-batch", type=int, default=d.max_batch, help="(%(default)s)")
    parser.add_argument("--max-wait-ms", type=float, default=d.max_wait_ms, help="(%(default)s)")
    parser.add_argument(
        "--max-batch-tokens",
        type=int,
        default=d.max_batch_tokens,
        help="token budget of the 'sidecar + tokens' system (%(default)s)",
    )
    parser.add_argument("--slo-ms", type=float, default=d.slo_ms, help="p99 SLO (%(default)s)")
    parser.add_argument(
        "--tei-max-batch-tokens",
        dest="tei_tokens",
        type=int,
        default=d.tei_tokens,
        help=f"token budget of the TEI row: {TEI_ROWS} x the model's longest input, "
        f"{TEI_MAX_LENGTH} tokens, as TEI's default is 32 x 512 (%(default)s)",
    )
    parser.add_argument(
        "--loads-from",
        choices=("limit", "no-batching"),
        help="what the loads are shares of: the model's limit at the max batch, or no "
        "batching's saturation, measured first (default: no-batching for --model encoder, "
        "else limit)",
    )
    parser.add_argument(
        "--shares",
        type=_shares,
        help="open-loop loads as shares of --loads-from (default: "
        f"{','.join(f'{x:g}' for x in LIMIT_SHARES)} of the limit, "
        f"{','.join(f'{x:g}' for x in SATURATION_SHARES)} of no batching's saturation)",
    )
    parser.add_argument(
        "--best-static",
        action="append",
        default=[],
        metavar="[WHERE=]FLAGS",
        type=_best_static,
        help="the best static configuration, as sidecar flags (e.g. '--batch-by length "
        "--max-batch-size 16 --max-wait-ms 0'), measured as the 'best static' row; WHERE: "
        "a share (0.5=FLAGS: at that load only) or 'switch' (the long half of "
        "--length-switch); repeatable",
    )
    parser.add_argument(
        "--duration-s",
        "--duration",
        dest="duration_s",
        type=float,
        default=d.duration_s,
        help="s per run; wrk's runs round it to whole seconds (%(default)s)",
    )
    parser.add_argument("--connections", type=int, default=d.connections, help="wrk connections")
    parser.add_argument("--rounds", type=int, default=d.rounds, help="(%(default)s)")
    parser.add_argument(
        "--goodput-probes", type=int, default=d.goodput_probes, help="(%(default)s)"
    )
    parser.add_argument(
        "--only",
        action="append",
        default=[],
        metavar="SYSTEM",
        help="measure only this system (repeatable; give 'no batching' too for ratios)",
    )
    w = length_switch.Switch()
    parser.add_argument(
        "--length-switch",
        action="store_true",
        help="instead of the loads: one run per system whose lengths change halfway",
    )
    parser.add_argument(
        "--switch-lengths",
        default=f"{w.before},{w.after}",
        help="BEFORE,AFTER length distributions of --length-switch (%(default)s)",
    )
    parser.add_argument(
        "--switch-share",
        type=float,
        default=w.share,
        help="its rate, as a share of no batching's saturation on AFTER (%(default)s)",
    )
    parser.add_argument(
        "--switch-half-s",
        type=float,
        default=w.half_s,
        help="seconds of arrivals before and after the switch (%(default)s)",
    )
    parser.add_argument(
        "--window-s", type=float, default=w.window_s, help="goodput windows (%(default)s)"
    )


def main(args: argparse.Namespace) -> int:
    try:
        distributions = _distributions(args.lengths)
    except argparse.ArgumentTypeError as exc:
        raise SystemExit(f"modelroll-bench compare: --lengths: {exc}") from None
    scenario = Scenario(
        fixed_ms=args.fixed_ms,
        per_token_ms=args.per_token_ms,
        parallel=args.parallel,
        seed=args.seed,
        model=args.model,
    )
    loads_from: LoadsFrom = args.loads_from or (
        "no-batching" if args.model == "encoder" else "limit"
    )
    shares = args.shares or (SATURATION_SHARES if loads_from == "no-batching" else LIMIT_SHARES)
    best_static = tuple(args.best_static)
    wheres = {where for where, _ in best_static}
    for where in wheres - {"", "switch"}:
        if float(where) not in shares:
            raise SystemExit(f"modelroll-bench compare: --best-static {where}=: not a load")
        if "" not in wheres:
            raise SystemExit(
                f"modelroll-bench compare: --best-static {where}=FLAGS needs a --best-static "
                "FLAGS too, for the saturation and goodput runs"
            )
    setup = Setup(
        scenario=scenario,
        distributions=distributions,
        max_batch=args.max_batch,
        max_wait_ms=args.max_wait_ms,
        max_batch_tokens=args.max_batch_tokens,
        tei_tokens=args.tei_tokens,
        loads_from=loads_from,
        shares=shares,
        slo_ms=args.slo_ms,
        duration_s=args.duration_s,
        connections=args.connections,
        rounds=args.rounds,
        goodput_probes=args.goodput_probes,
        only=tuple(args.only),
        best_static=best_static,
    )
    if args.length_switch:
        try:
            before, after = length_switch.parse_switch(args.switch_lengths)
        except ValueError as exc:
            raise SystemExit(f"modelroll-bench compare: --switch-lengths: {exc}") from None
        switch = length_switch.Switch(
            before, after, args.switch_share, args.switch_half_s, args.window_s
        )
        write(asyncio.run(run_switch(setup, switch)), args.out)
        return 0
    write(asyncio.run(run(setup, args.plots)), args.out)
    return 0
