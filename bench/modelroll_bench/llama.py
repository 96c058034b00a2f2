"""``make bench-llama``: the real LLM engine, llama-server serving SmolLM2-135M-Instruct (Q4_1),
in one run.

1. Slots. Two llama-server processes with the same model, threads and context per slot, one
   with ``-np 1`` (one sequence at a time: every other request waits for it to end) and one with
   ``-np N`` (continuous batching: up to N sequences share each decode step, joining and leaving
   at any step). The same chat prompts, in the same order, greedy (``temperature`` 0), so both
   generate the same answers:
   - saturation: a closed loop of 2 x N streams on each; output tokens per second received by
     the clients within the window, and the engine's own mean busy slots per decode step;
   - Poisson arrivals at shares of the N-slot engine's saturation rate, the two engines taking
     turns at each rate (the same arrivals), in rounds; ratios N slots / one slot round by round,
     then the median over rounds.
2. Overhead. The N-slot engine reached directly, through the sidecar, through the gateway and
   the sidecar, and through one and two bare aiohttp proxies, interleaved request by request in
   the same Poisson rounds (:func:`.llm.overhead`); what each path adds to TTFT. Every request
   is the same prompt, which llama-server keeps cached, at a rate the engine serves with little
   queueing, so its own TTFT (about one decode step) is steady enough to show milliseconds.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path

from modelroll_devcluster.llama import MODEL_FILE, LlamaServer, llama_metrics

from . import llm, llm_report
from .gateway import MODEL
from .llm_load import StreamSummary, chat_bodies, closed_streams, fixed, open_streams, summarize
from .llm_report import Overhead, OverheadSummary, Ratio
from .loadgen import Body
from .runs import load_average
from .servers import Check, Server
from .stats import Spread, spread
from .suite import Suite

PARTS = ("slots", "overhead")
GREEDY = {"temperature": 0.0, "seed": 1}
"""Every request's sampling: the same prompt gets the same answer from both engines."""

TASKS = (
    "Explain {} to a child in two sentences.",
    "Write a short poem about {}.",
    "List three facts about {}.",
    "What is {} used for?",
    "Describe {} in one paragraph.",
)
TOPICS = (
    "the moon",
    "rain",
    "bread",
    "a bicycle",
    "the ocean",
    "a library",
    "coffee",
    "winter",
    "a volcano",
    "music",
    "a bridge",
    "honey bees",
    "the internet",
    "a lighthouse",
    "chess",
    "glass",
    "a forest",
    "the heart",
    "electricity",
    "a river",
    "paper",
    "the wind",
    "salt",
    "a clock",
    "snow",
    "maps",
    "a garden",
    "thunder",
    "soap",
    "the stars",
)


def chat_prompts(seed: int) -> list[str]:
    """Every task about every topic (150 prompts), in a seeded order."""
    found = [task.format(topic) for task in TASKS for topic in TOPICS]
    random.Random(seed).shuffle(found)
    return found


@dataclass(frozen=True)
class Setup:
    slots: int = 4
    """The continuous engine's ``-np``; the other has one."""
    context_per_slot: int = 512
    """Tokens of context each slot gets (``-c`` is this times the slots)."""
    threads: int = 1
    max_tokens: int = 64
    shares: tuple[float, ...] = (0.25, 0.5, 0.8)
    """Open-loop arrival rates, as shares of the N-slot engine's saturation rate."""
    duration_s: float = 90.0
    drain_s: float = 60.0
    saturation_s: float = 30.0
    warmup_s: float = 5.0
    rounds: int = 2
    overhead_rate: float = 5.0
    """Requests per second over the five overhead paths together."""
    overhead_s: float = 20.0
    overhead_rounds: int = 7
    overhead_max_tokens: int = 4
    parts: tuple[str, ...] = PARTS
    seed: int = 1

    def context(self, slots: int) -> int:
        return self.context_per_slot * slots


QUICK = Setup(
    max_tokens=16,
    shares=(0.5,),
    duration_s=3.0,
    drain_s=10.0,
    saturation_s=3.0,
    warmup_s=1.0,
    rounds=1,
    overhead_s=3.0,
    overhead_rounds=1,
)
"""``--quick``: every step once, briefly; a smoke run whose figures are not to be trusted."""


@contextlib.asynccontextmanager
async def llama_engine(slots: int, setup: Setup, logs: Path) -> AsyncIterator[Server]:
    """llama-server with ``slots`` slots on a free port until the block ends."""
    server = LlamaServer(
        MODEL,
        logs / f"llama-{slots}.log",
        slots=slots,
        context=setup.context(slots),
        threads=setup.threads,
        name=f"llama-server-np{slots}",
    )
    component = await asyncio.to_thread(server.start)
    try:
        yield Server(server.url, component.pid or 0)
    finally:
        await asyncio.to_thread(server.stop)


async def busy_slots(engine: Server) -> dict[str, float]:
    """The engine's decode steps and the sequences they carried, from its /metrics."""
    found = await asyncio.to_thread(llama_metrics, engine.url)
    return {
        "decodes": found.get("n_decode_total", 0.0),
        "predicted": found.get("tokens_predicted_total", 0.0),
    }


@dataclass(frozen=True)
class SlotsSaturation:
    """One engine at saturation: output tokens received per second, requests answered per
    second within the window, tokens per decode step, and the TTFT p50 of the requests inside."""

    slots: int
    streams: int
    output_tps: float | None
    requests_per_s: float
    tokens_per_decode: float | None
    ttft_p50_ms: float | None
    failed: int
    errors: dict[str, int]


@dataclass(frozen=True)
class SlotsRun:
    """One engine's Poisson run at one rate."""

    clients: StreamSummary
    load_average_1m: float
    above_saturation: bool


@dataclass(frozen=True)
class SlotsRate:
    """Both engines at one rate in one round, by label (``1 slot``, ``N slots``)."""

    rate_rps: float
    share: float
    runs: dict[str, SlotsRun]

    def ratio(self, slots: int) -> dict[str, Ratio]:
        """N slots over one slot, by figure."""
        return llm_report.ratios(self.runs[label(slots)].clients, self.runs[label(1)].clients)


@dataclass(frozen=True)
class Slots:
    """Part 1 as measured: each engine at saturation, then the rates, round by round."""

    saturation: dict[str, SlotsSaturation]
    capacity_rps: float
    rounds: list[list[SlotsRate]]


@dataclass(frozen=True)
class Measured:
    """The parts run, as measured (None for a part left out)."""

    slots: Slots | None = None
    overhead: Overhead | None = None


@dataclass(frozen=True)
class MedianRatio:
    """At one rate, each figure's N slots / one slot ratio: the median over the rounds that
    have it exactly, and the range."""

    rate_rps: float
    figures: dict[str, Spread | None]


@dataclass(frozen=True)
class Summary:
    slots: Slots | None
    saturation_ratio: float | None
    """N slots over one, output tokens per second at saturation."""
    median_ratio: list[MedianRatio]
    overhead: OverheadSummary | None


async def saturation(engine: Server, slots: int, body: Body, setup: Setup) -> SlotsSaturation:
    """A closed loop of 2 x the N-slot engine's slots: output tokens received per second and
    requests answered per second within the window, and tokens per decode step."""
    streams = 2 * setup.slots
    start = time.perf_counter() + setup.warmup_s
    window = (start, start + setup.saturation_s)

    async def measure() -> tuple[dict[str, float], dict[str, float]]:
        await asyncio.sleep(setup.warmup_s)
        before = await busy_slots(engine)
        await asyncio.sleep(setup.saturation_s)
        return before, await busy_slots(engine)

    url = engine.url + llm.CHAT
    (before, after), samples = await closed_streams(url, body, streams, measure(), window)
    inside = [s for s in samples if s.started_at >= window[0] and s.ended_at <= window[1]]
    clients = summarize(samples, setup.saturation_s, setup.saturation_s)
    decodes = after["decodes"] - before["decodes"]
    predicted = after["predicted"] - before["predicted"]
    return SlotsSaturation(
        slots=slots,
        streams=streams,
        output_tps=clients.output_tps,
        requests_per_s=round(len(inside) / setup.saturation_s, 2),
        tokens_per_decode=round(predicted / decodes, 2) if decodes else None,
        ttft_p50_ms=summarize(inside, setup.saturation_s).ttft_p50_ms,
        failed=clients.failed,
        errors=clients.errors,
    )


def open_line(rate: float, row: StreamSummary) -> str:
    ttft, e2e = llm_report.latencies(row, "ttft"), llm_report.latencies(row, "e2e")
    return (
        f"    {rate:6.2f} req/s {row.label:<8} {llm_report.figure(row, 'output_tps')} "
        f"tokens/s, TTFT {ttft} ms, e2e {e2e} ms, ok {row.ok}/{row.requests}, "
        f"cut {row.cut}, failed {row.failed}"
    )


def label(slots: int) -> str:
    return f"{slots} slot" + ("s" if slots != 1 else "")


async def compare_slots(setup: Setup, body: Body, logs: Path) -> Slots:
    """Part 1: each engine at saturation, then in each round every rate on both engines, one
    after the other (the order turning with the rate and the round), on the same arrivals."""
    counts = (1, setup.slots)
    async with contextlib.AsyncExitStack() as stack:
        engines = {n: await stack.enter_async_context(llama_engine(n, setup, logs)) for n in counts}
        saturated: dict[int, SlotsSaturation] = {}
        for n in counts:
            print(f"  saturation, {label(n)}: {2 * setup.slots} streams ...", flush=True)
            saturated[n] = await saturation(engines[n], n, body, setup)
            print(f"    {saturated[n]}", flush=True)
        capacity = saturated[setup.slots].requests_per_s
        rates = llm.select_rates(capacity, setup.shares)
        rounds: list[list[SlotsRate]] = []
        for r in range(setup.rounds):
            rows = []
            for k, rate in enumerate(rates):
                order = counts if (k + r) % 2 == 0 else counts[::-1]
                found: dict[str, SlotsRun] = {}
                for n in order:
                    run = await open_streams(
                        fixed(label(n), engines[n].url + llm.CHAT),
                        body,
                        rate,
                        setup.duration_s,
                        seed=setup.seed + 100 * r + k,
                        drain_s=setup.drain_s,
                        label=label(n),
                    )
                    clients = run.summary()
                    above = rate > saturated[n].requests_per_s
                    found[label(n)] = SlotsRun(clients, round(load_average(), 2), above)
                    print(open_line(rate, clients), flush=True)
                rows.append(SlotsRate(rate, round(rate / capacity, 3), found))
            rounds.append(rows)
    return Slots({label(n): found for n, found in saturated.items()}, capacity, rounds)


RATIO_FIGURES = ("output_tps", "ttft_p50_ms", "ttft_p99_ms", "e2e_p50_ms", "e2e_p99_ms")


def median_ratios(rounds: Sequence[Sequence[SlotsRate]], slots: int) -> list[MedianRatio]:
    """Per rate, each figure's N slots / one slot ratio: median over the rounds that have it
    (exact ratios only), and the range."""
    out = []
    by_round = [[row.ratio(slots) for row in rows] for rows in rounds]
    for k, first in enumerate(rounds[0] if rounds else []):
        figures: dict[str, Spread | None] = {}
        for key in RATIO_FIGURES:
            values = [
                found.ratio
                for ratios in by_round
                if (found := ratios[k].get(key)) and found.relation == "=" and found.ratio
            ]
            figures[key] = spread(values)
        out.append(MedianRatio(first.rate_rps, figures))
    return out


def model(setup: Setup) -> str:
    return f"SmolLM2-135M-Instruct ({MODEL_FILE}) on llama-server, {setup.threads} threads"


async def measure(setup: Setup) -> Measured:
    found_slots = found_overhead = None
    body = chat_bodies(chat_prompts(setup.seed), MODEL, setup.max_tokens, GREEDY)
    with tempfile.TemporaryDirectory(prefix="modelroll-bench-llama-") as tmp:
        logs = Path(tmp)
        if "slots" in setup.parts:
            print(f"Slots: one against {setup.slots}, max_tokens {setup.max_tokens}", flush=True)
            found_slots = await compare_slots(setup, body, logs)
        if "overhead" in setup.parts:
            print(
                f"Overhead: {setup.overhead_rate:g} req/s over {', '.join(llm.PATHS)}, "
                f"{setup.overhead_rounds} rounds of {setup.overhead_s:g} s",
                flush=True,
            )
            paths = replace(
                llm.Setup(),
                overhead_rate=setup.overhead_rate,
                overhead_s=setup.overhead_s,
                overhead_rounds=setup.overhead_rounds,
                overhead_max_tokens=setup.overhead_max_tokens,
            )
            prompt = chat_prompts(setup.seed)[:1]  # cached after its first time: a steady TTFT
            short = chat_bodies(prompt, MODEL, setup.overhead_max_tokens, GREEDY)
            found_overhead = await llm.overhead(
                paths, partial(llama_engine, setup.slots, setup, logs), short
            )
    return Measured(found_slots, found_overhead)


def summarize_run(setup: Setup, measured: Measured) -> Summary:
    found = measured.slots
    saturation_ratio = None
    if found is not None:
        many, one = found.saturation[label(setup.slots)], found.saturation[label(1)]
        if many.output_tps and one.output_tps:
            saturation_ratio = round(many.output_tps / one.output_tps, 3)
    return Summary(
        slots=found,
        saturation_ratio=saturation_ratio,
        median_ratio=median_ratios(found.rounds, setup.slots) if found else [],
        overhead=llm.summarize_overhead(measured.overhead) if measured.overhead else None,
    )


def render(setup: Setup, summary: Summary) -> str:
    lines = [f"\nModel: {model(setup)}"]
    if summary.slots is not None:
        lines.append("Saturation (closed loop):")
        for name, row in summary.slots.saturation.items():
            lines.append(
                f"  {name:<8} {row.output_tps} tokens/s, {row.requests_per_s} req/s, "
                f"{row.tokens_per_decode} tokens per decode step, "
                f"TTFT p50 {row.ttft_p50_ms} ms"
            )
        lines.append(f"  tokens/s, N slots / one: {summary.saturation_ratio}")
        lines.append("Poisson arrivals, N slots / one slot, median (range) over rounds:")
        for ratio in summary.median_ratio:
            cells = ", ".join(
                f"{key} {_spread(found)}" for key, found in ratio.figures.items() if found
            )
            lines.append(f"  {ratio.rate_rps:g} req/s: {cells}")
    if summary.overhead is not None:
        lines.append(llm_report.overhead_table(summary.overhead))
    return "\n".join(lines)


def _spread(found: Spread) -> str:
    return f"{found.median:.2f}x ({found.low:.2f}..{found.high:.2f})"


def checks(setup: Setup, summary: Summary) -> list[Check]:
    """Continuous batching serves more at saturation than one slot; and the TTFT target of
    :func:`.llm_report.checks`, on the real engine."""
    found: list[Check] = []
    if summary.slots is not None:
        ratio = summary.saturation_ratio
        found.append(
            (
                f"{setup.slots} slots serve more output tokens/s than one at saturation",
                ratio is not None and ratio > 1,
                f"{ratio}x",
            )
        )
    return found + llm_report.checks(summary.overhead)


FLAGS: llm.Flags = {
    "slots": ("--slots", int, "the continuous engine's slots (-np)"),
    "max_tokens": ("--max-tokens", int, "each request's max_tokens"),
    "shares": ("--shares", llm.floats, "open-loop rates as shares of N-slot saturation"),
    "duration_s": ("--duration", float, "s of arrivals per open-loop run"),
    "drain_s": ("--drain", float, "s after the arrivals before streams are cut"),
    "saturation_s": ("--saturation-seconds", float, "s of the saturation window"),
    "rounds": ("--rounds", int, "rounds of the open-loop rates"),
    "overhead_rate": ("--overhead-rate", float, "req/s over the five overhead paths"),
    "overhead_s": ("--overhead-seconds", float, "s per overhead round"),
    "overhead_rounds": ("--overhead-rounds", int, "overhead rounds"),
    "parts": ("--parts", llm.parts_of(PARTS), "comma-separated: slots, overhead"),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    llm.add_flags(parser, FLAGS, Setup())
    parser.add_argument(
        "--quick", action="store_true", help="a smoke run of about a minute, figures not to trust"
    )


def setup_from(args: argparse.Namespace) -> Setup:
    base = QUICK if args.quick else Setup()
    return replace(base, **llm.given(args, FLAGS))


class LlamaSuite(Suite[Setup, Measured, Summary]):
    name = "llama"
    help = "llama-server with SmolLM2: N slots against one; TTFT the hops add"
    description = __doc__ or ""
    setup_type = Setup
    measured_type = Measured

    add_arguments = staticmethod(add_arguments)
    setup = staticmethod(setup_from)
    measure = staticmethod(measure)
    summarize = staticmethod(summarize_run)
    render = staticmethod(render)
    checks = staticmethod(checks)


SUITE = LlamaSuite()
