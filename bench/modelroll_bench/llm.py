"""``make bench-llm``: continuous against static batching for chat LLMs, and the TTFT that the
sidecar and the gateway add, in one run.

1. Scheduling. Two ``modelroll-demo-llm`` engines with the same cost model, output lengths and
   seed, one ``--scheduler continuous`` (sequences join and leave at every iteration), one
   ``--scheduler static`` (a batch runs until its longest sequence ends, the finished ones still
   charged). Streaming chat completions, the same prompts in the same order to both:
   - saturation: a closed loop of 2 x max-seqs streams; output tokens per second from the
     engine's own counters over the window (for static, from the start of a batch to the start
     of a later one, so a partly counted batch does not bias it);
   - Poisson arrivals at shares of the continuous engine's saturation rate, the two schedulers
     alternating at each rate (same arrival seed), so drift on the machine hits both: output
     tokens per second, TTFT and end-to-end p50/p95/p99, and the ratios continuous / static.
   The early-finish effect is the engine's own count: of the sequence slots it charged
   (``slot_steps``), the share that produced no token (``1 - tokens / slot_steps``): zero for
   continuous batching, the capacity static batching spends on sequences that already ended.
2. Overhead. One engine (cheap iterations, short outputs, so its own TTFT is steady), called
   five ways in the same Poisson run, the paths interleaved request by request so they share the
   engine's state: directly; through the sidecar (``--protocol openai``); through the gateway
   (``--routes-file``) and the sidecar; and through one and two bare proxies (:mod:`.llm_proxy`:
   aiohttp on uvloop, one pooled client session, the answer streamed back chunk by chunk, and
   nothing else). Added TTFT = a path's p50 (p99) minus the direct p50 (p99) of the same round;
   the median over rounds is judged against the target: gateway + sidecar <= 1 ms at p50.

   Why the bare proxies: every process on the path costs a wake-up, whatever its code does. On
   a 2-vCPU VM a plain aiohttp request/response round trip between two processes took 0.46 ms
   back to back, but 1.1 ms after 10 ms of idleness and 3.5 ms after 50 ms (an idle vCPU waking
   up); at this part's rates a request often finds a process idle, so a hop's floor there is
   well above what its code costs. The bare proxies pay that floor with the same event loop and
   libraries, so the same round's sidecar - bare proxy (one hop each) and gateway + sidecar -
   bare proxy x2 (two hops each) are what modelroll's own code costs beyond it: reported beside
   the added TTFT, for information, not judged. The proxies mirror the topology under test: the
   inner one (to the engine) serves both "bare proxy" and the second hop of "bare proxy x2", as
   the sidecar serves both the sidecar path and the gateway's, so each process gets the share of
   the arrivals its counterpart gets (sidecar and inner proxy 2/5, gateway and outer proxy 1/5).
   The default rate, 100 req/s over the five paths, keeps each path at the 20 req/s it had when
   60 req/s went over three.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import aiohttp

from modelroll_devcluster.processes import free_port

from . import llm_report
from .gateway import MODEL, gateway_to
from .gateway import Setup as GatewaySetup
from .llm_counters import EngineWork, Snapshot, edge, read_stats, until_idle
from .llm_load import (
    StreamSummary,
    by_path,
    chat_bodies,
    closed_streams,
    fixed,
    interleave,
    open_streams,
    prompts,
    summarize,
)
from .llm_report import (
    Overhead,
    OverheadRound,
    OverheadSummary,
    PathMedians,
    RateRow,
    Ratio,
    Saturation,
    SchedulerRun,
    Scheduling,
)
from .loadgen import Body
from .runs import load_average
from .servers import Check, Server, serve_module
from .stats import Spread, spread
from .suite import Suite

SCHEDULERS = ("continuous", "static")
PARTS = ("scheduling", "overhead")
CHAT = "/v1/chat/completions"
DIRECT, SIDECAR, GATEWAY = "direct", "sidecar", "gateway+sidecar"
BARE, BARE2 = "bare proxy", "bare proxy x2"
PATHS = (DIRECT, BARE, SIDECAR, BARE2, GATEWAY)
"""The overhead part's paths, by hops: none, one (bare, then modelroll's), two (likewise)."""
CEILINGS = {SIDECAR: BARE, GATEWAY: BARE2}
"""Each modelroll path's bare counterpart: a bare proxy for every process it crosses."""


@dataclass(frozen=True)
class EngineSetup:
    """The demo engine's cost model and output lengths: ``modelroll-demo-llm``'s flags."""

    step_ms: float = 8.0
    step_ms_per_seq: float = 0.25
    prefill_ms_per_token: float = 0.02
    max_seqs: int = 64
    kv_tokens: int = 65536
    output_mu: float = 4.0
    output_sigma: float = 0.8
    seed: int = 1

    def args(self, scheduler: str, port: int) -> list[str]:
        return [
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--scheduler",
            scheduler,
            "--step-ms",
            str(self.step_ms),
            "--step-ms-per-seq",
            str(self.step_ms_per_seq),
            "--prefill-ms-per-token",
            str(self.prefill_ms_per_token),
            "--max-seqs",
            str(self.max_seqs),
            "--kv-tokens",
            str(self.kv_tokens),
            "--output-mu",
            str(self.output_mu),
            "--output-sigma",
            str(self.output_sigma),
            "--seed",
            str(self.seed),
        ]

    def iteration_ms(self, sequences: int) -> float:
        """An iteration's cost with ``sequences`` in the batch, prompts aside."""
        return self.step_ms + self.step_ms_per_seq * sequences

    @property
    def ceiling_tps(self) -> float:
        """Output tokens per second with every slot of every iteration producing one: what no
        scheduler can beat (prompt processing aside)."""
        return self.max_seqs * 1000 / self.iteration_ms(self.max_seqs)

    def describe(self) -> str:
        return (
            f"iteration {self.step_ms:g} ms + {self.step_ms_per_seq:g} ms/sequence + "
            f"{self.prefill_ms_per_token:g} ms/prompt token, at most {self.max_seqs} sequences; "
            f"outputs lognormal({self.output_mu:g}, {self.output_sigma:g}), seed {self.seed}"
        )


@dataclass(frozen=True)
class Setup:
    engine: EngineSetup = field(default_factory=EngineSetup)
    max_tokens: int = 256
    """Each request's ``max_tokens``: the cap on its lognormal output length."""
    prompt_words: int = 32
    prompts: int = 2000
    """Distinct prompts, sent in the same order to every engine and cycled."""
    shares: tuple[float, ...] = (0.2, 0.4, 0.6, 0.8)
    """Open-loop arrival rates, as shares of the continuous engine's saturation rate."""
    duration_s: float = 20.0
    """Arrivals per open-loop run."""
    drain_s: float = 15.0
    """After the arrivals, how long streams may take to finish before they are cut."""
    saturation_s: float = 30.0
    warmup_s: float = 5.0
    """Closed loop before the saturation window opens (the batch fills, the queue forms)."""
    streams: int = 0
    """Concurrent streams at saturation; 0: twice the engine's max sequences."""
    overhead_engine: EngineSetup = field(
        default_factory=lambda: EngineSetup(
            step_ms=2.0, step_ms_per_seq=0.02, prefill_ms_per_token=0.0
        )
    )
    overhead_max_tokens: int = 16
    overhead_rate: float = 100.0
    """Requests per second over the five paths together (20 each)."""
    overhead_s: float = 10.0
    overhead_rounds: int = 7
    parts: tuple[str, ...] = PARTS
    seed: int = 1
    """Seeds the arrivals (the engines' output lengths have their own seed)."""

    @property
    def concurrency(self) -> int:
        return self.streams or 2 * self.engine.max_seqs


QUICK = Setup(
    max_tokens=64,
    shares=(0.3, 0.8),
    duration_s=1.5,
    drain_s=1.0,
    saturation_s=1.5,
    warmup_s=0.5,
    overhead_s=2.0,
    overhead_rounds=2,
)
"""``--quick``: every step once, briefly (static batches end within 64 tokens); a smoke run
whose figures are not to be trusted."""


# -- part 1: scheduling -----------------------------------------------------------------------


def select_rates(saturation_rps: float, shares: Sequence[float]) -> list[float]:
    """Arrival rates at ``shares`` of a saturation rate, to 0.1 req/s, ascending, without
    repeats and without rates that round to nothing."""
    return sorted({r for s in shares if (r := round(s * saturation_rps, 1)) > 0})


async def saturation(
    http: aiohttp.ClientSession, engine: Server, scheduler: str, body: Body, setup: Setup
) -> Saturation:
    """A closed loop of ``setup.concurrency`` streams; the engine's counters over the window,
    and the requests that started and ended within it."""
    cost = setup.engine
    batch_s = 2 * setup.max_tokens * cost.iteration_ms(cost.max_seqs) / 1000  # two full batches

    async def window() -> tuple[Snapshot, Snapshot]:
        await asyncio.sleep(setup.warmup_s)
        first = await edge(http, engine.url, scheduler, cost.max_seqs, batch_s)
        await asyncio.sleep(setup.saturation_s)
        last = await edge(http, engine.url, scheduler, cost.max_seqs, batch_s)
        return first, last

    url = engine.url + CHAT
    (first, last), samples = await closed_streams(url, body, setup.concurrency, window())
    inside = [s for s in samples if s.started_at >= first.at and s.ended_at <= last.at]
    clients = summarize(inside, last.at - first.at)  # tokens/s: the engine's counters
    await until_idle(http, engine.url)
    work = EngineWork.between(first, last)
    return Saturation(scheduler, setup.concurrency, work.summary(), clients)


async def open_run(
    http: aiohttp.ClientSession,
    engine: Server,
    scheduler: str,
    body: Body,
    rate: float,
    seed: int,
    setup: Setup,
    capacity: float,
) -> SchedulerRun:
    """Poisson arrivals at ``rate`` from an idle engine: the clients' figures, and the engine's
    counters from the first arrival to the cut (or the last answer)."""
    await until_idle(http, engine.url)
    load = load_average()
    before = await read_stats(http, engine.url)
    run = await open_streams(
        fixed(scheduler, engine.url + CHAT),
        body,
        rate,
        setup.duration_s,
        seed=seed,
        drain_s=setup.drain_s,
        label=scheduler,
    )
    after = await read_stats(http, engine.url)
    work = EngineWork.between(before, after)
    return SchedulerRun(run.summary(), work.summary(), round(load, 2), rate > capacity)


async def scheduling(setup: Setup) -> Scheduling:
    """Part 1: both engines at saturation, then at each rate one after the other (continuous
    first at even rates, static first at odd ones), with the same arrivals and prompts."""
    body = chat_bodies(prompts(setup.prompts, setup.prompt_words), MODEL, setup.max_tokens)
    async with contextlib.AsyncExitStack() as stack:
        engines: dict[str, Server] = {}
        for scheduler in SCHEDULERS:
            port = free_port()
            engines[scheduler] = await stack.enter_async_context(
                serve_module("modelroll_standins.llm", setup.engine.args(scheduler, port), port)
            )
        http = await stack.enter_async_context(aiohttp.ClientSession())
        saturated: dict[str, Saturation] = {}
        for scheduler in SCHEDULERS:
            print(f"  saturation, {scheduler}: {setup.concurrency} streams ...", flush=True)
            saturated[scheduler] = await saturation(
                http, engines[scheduler], scheduler, body, setup
            )
            print(llm_report.saturation_line(saturated[scheduler]), flush=True)
        capacity = saturated["continuous"].engine.requests_per_s or 0.0
        rates = select_rates(capacity, setup.shares)
        runs: list[RateRow] = []
        for k, rate in enumerate(rates):
            order = SCHEDULERS if k % 2 == 0 else SCHEDULERS[::-1]
            found: dict[str, SchedulerRun] = {}
            for scheduler in order:
                own = saturated[scheduler].engine.requests_per_s or 0.0
                result = await open_run(
                    http, engines[scheduler], scheduler, body, rate, setup.seed + k, setup, own
                )
                found[scheduler] = result
                print(llm_report.open_line(rate, result.clients, result.engine), flush=True)
            runs.append(RateRow(rate, round(rate / capacity, 3), found))
    return Scheduling(saturated, capacity, round(setup.engine.ceiling_tps, 1), runs)


# -- part 2: overhead -------------------------------------------------------------------------


def difference(rows: Sequence[OverheadRound], key: str, path: str, base: str) -> Spread | None:
    """``path``'s ``key`` minus ``base``'s ``key`` round by round, over the rounds where both
    have it (a path whose every stream failed has none): median and range (None for none)."""
    pairs = [(row.paths[path].value(key), row.paths[base].value(key)) for row in rows]
    return spread([round(a - b, 3) for a, b in pairs if a is not None and b is not None])


def added(rows: Sequence[OverheadRound], key: str) -> dict[str, Spread | None]:
    """Per path, ``key`` minus the direct path's ``key`` of the same round."""
    return {path: difference(rows, key, path, DIRECT) for path in PATHS if path != DIRECT}


def beyond_bare(rows: Sequence[OverheadRound], key: str) -> dict[str, Spread | None]:
    """Per modelroll path, ``key`` minus its bare counterpart's (:data:`CEILINGS`) of the same
    round: what its own code adds beyond as many bare aiohttp hops."""
    return {path: difference(rows, key, path, bare) for path, bare in CEILINGS.items()}


def medians(rows: Sequence[StreamSummary]) -> PathMedians:
    """One path's TTFT figures (and e2e p50), each the median over the rounds that have it."""

    def median(key: str) -> float | None:
        found = spread(row.value(key) for row in rows)
        return found.median if found else None

    return PathMedians(*(median(key) for key in llm_report.OVERHEAD_KEYS))


def summarize_overhead(found: Overhead) -> OverheadSummary:
    """The overhead part's rounds, summarized per path and judged round by round."""
    keys = ("ttft_p50_ms", "ttft_p99_ms")
    rows = found.rounds
    failed = {p: sum(row.paths[p].failed + row.paths[p].cut for row in rows) for p in PATHS}
    return OverheadSummary(
        max_tokens=found.max_tokens,
        rate_rps=found.rate_rps,
        rounds=len(rows),
        ceilings=dict(CEILINGS),
        median={p: medians([row.paths[p] for row in rows]) for p in PATHS},
        added={key: added(rows, key) for key in keys},
        beyond_bare={key: beyond_bare(rows, key) for key in keys},
        failed=sum(failed.values()),
        failed_by_path=failed,
    )


Engine = Callable[[], contextlib.AbstractAsyncContextManager[Server]]
"""Starts an engine for the overhead part, and stops it when the block ends."""


async def overhead(
    setup: Setup, engine_of: Engine | None = None, body: Body | None = None
) -> Overhead:
    """Part 2: one engine (by default the demo engine of ``setup.overhead_engine``), reached
    directly, through the sidecar, through the gateway and the sidecar, and through one and two
    bare proxies, in the same rounds of interleaved Poisson arrivals (after an uncounted
    warm-up)."""
    cost = setup.overhead_engine
    words, tokens = setup.prompt_words, setup.overhead_max_tokens
    body = body or chat_bodies(prompts(setup.prompts, words), MODEL, tokens)
    rows: list[OverheadRound] = []
    async with contextlib.AsyncExitStack() as stack:
        eport, sport, pport, qport = free_port(), free_port(), free_port(), free_port()
        engine = await stack.enter_async_context(
            engine_of()
            if engine_of is not None
            else serve_module("modelroll_standins.llm", cost.args("continuous", eport), eport)
        )
        sidecar_args = ["--protocol", "openai", "--upstream", engine.url, "--model", MODEL]
        sidecar_args += ["--version", "v1", "--host", "127.0.0.1", "--port", str(sport)]
        sidecar = await stack.enter_async_context(
            serve_module("modelroll_sidecar", sidecar_args, sport)
        )
        gateway = await stack.enter_async_context(
            gateway_to(sidecar.url, GatewaySetup(pin=False), "uvloop", None)
        )
        inner = await stack.enter_async_context(bare_proxy(engine.url, pport))
        outer = await stack.enter_async_context(bare_proxy(inner.url, qport))
        urls = {
            DIRECT: engine.url,
            SIDECAR: sidecar.url,
            GATEWAY: gateway.url,
            BARE: inner.url,
            BARE2: outer.url,
        }
        paths = [(p, urls[p] + CHAT) for p in PATHS]
        warmup = min(2.0, setup.overhead_s / 2)  # every process's first requests, uncounted
        await open_streams(interleave(paths, 0), body, setup.overhead_rate, warmup, seed=0)
        for r in range(setup.overhead_rounds):
            run = await open_streams(
                interleave(paths, r + 1),
                body,
                setup.overhead_rate,
                setup.overhead_s,
                seed=r + 1,
                drain_s=10.0,
            )
            found = by_path(run.samples)
            paths_found = {p: summarize(found.get(p, []), run.elapsed_s) for p in PATHS}
            rows.append(OverheadRound(paths_found, round(load_average(), 2)))
            print(llm_report.overhead_line(r + 1, rows[-1], PATHS), flush=True)
    return Overhead(tokens, setup.overhead_rate, rows)


def bare_proxy(upstream: str, port: int) -> contextlib.AbstractAsyncContextManager[Server]:
    """A bare streaming proxy (:mod:`.llm_proxy`) on ``port`` in front of ``upstream``."""
    args = ["--host", "127.0.0.1", "--port", str(port), "--upstream", upstream]
    return serve_module("modelroll_bench.llm_proxy", args, port)


# -- the run ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Measured:
    """The parts run, as measured (None for a part left out)."""

    scheduling: Scheduling | None = None
    overhead: Overhead | None = None


@dataclass(frozen=True)
class Summary:
    """Part 1 with continuous over static at saturation and at each rate; part 2 per path."""

    scheduling: Scheduling | None
    saturation_ratio: dict[str, Ratio]
    continuous_over_static: list[dict[str, Ratio]]
    overhead: OverheadSummary | None


async def measure(setup: Setup) -> Measured:
    found_scheduling = found_overhead = None
    if "scheduling" in setup.parts:
        print(f"Scheduling: demo LLM, {setup.engine.describe()}; max_tokens {setup.max_tokens}")
        found_scheduling = await scheduling(setup)
    if "overhead" in setup.parts:
        print(
            f"Overhead: {setup.overhead_rate:g} req/s over {', '.join(PATHS)}, "
            f"{setup.overhead_rounds} rounds of {setup.overhead_s:g} s",
            flush=True,
        )
        found_overhead = await overhead(setup)
    return Measured(found_scheduling, found_overhead)


def summarize_run(setup: Setup, measured: Measured) -> Summary:
    found = measured.scheduling
    return Summary(
        scheduling=found,
        saturation_ratio=found.saturation_ratio() if found else {},
        continuous_over_static=[
            llm_report.ratios(row.runs["continuous"].clients, row.runs["static"].clients)
            for row in (found.rates if found else [])
        ],
        overhead=summarize_overhead(measured.overhead) if measured.overhead else None,
    )


def render(setup: Setup, summary: Summary) -> str:
    parts: list[str] = []
    if summary.scheduling is not None:
        parts.append(
            llm_report.scheduling_table(summary.scheduling, setup.duration_s, setup.drain_s)
        )
    if summary.overhead is not None:
        parts.append(llm_report.overhead_table(summary.overhead))
        parts += [
            f"  For information (no target): {what}: {measured}"
            for what, measured in llm_report.informational(summary.overhead)
        ]
    return "\n".join(parts)


def floats(text: str) -> tuple[float, ...]:
    """``--shares``' type: comma-separated positive numbers."""
    try:
        values = tuple(float(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: numbers, e.g. 0.2,0.5,0.8") from None
    if not all(v > 0 for v in values):
        raise argparse.ArgumentTypeError(f"{text!r}: every value must be above 0")
    return values


def parts_of(known: Sequence[str]) -> Callable[[str], tuple[str, ...]]:
    """``--parts``' type: a comma-separated choice among ``known``."""

    def parse(text: str) -> tuple[str, ...]:
        parts = tuple(text.split(","))
        if not parts or any(p not in known for p in parts):
            raise argparse.ArgumentTypeError(f"{text!r}: comma-separated, of {', '.join(known)}")
        return parts

    return parse


Flags = dict[str, tuple[str, Any, str]]
"""Setup fields settable from the command line: flag, type, help."""


def add_flags(parser: argparse.ArgumentParser, flags: Flags, defaults: object) -> None:
    """One option per setup field of ``flags``, its help showing ``defaults``' value."""
    for name, (flag, kind, text) in flags.items():
        default = getattr(defaults, name)
        shown = ",".join(map(str, default)) if isinstance(default, tuple) else default
        parser.add_argument(flag, dest=name, type=kind, help=f"{text} ({shown})")


def given(args: argparse.Namespace, flags: Flags) -> dict[str, Any]:
    """The setup fields of ``flags`` given on the command line."""
    return {name: getattr(args, name) for name in flags if getattr(args, name) is not None}


FLAGS: Flags = {
    "max_tokens": ("--max-tokens", int, "each request's max_tokens"),
    "shares": ("--shares", floats, "open-loop rates as shares of continuous saturation"),
    "duration_s": ("--duration", float, "s of arrivals per open-loop run"),
    "drain_s": ("--drain", float, "s after the arrivals before streams are cut"),
    "saturation_s": ("--saturation-seconds", float, "s of the saturation window"),
    "warmup_s": ("--warmup", float, "s of closed loop before the saturation window"),
    "streams": ("--streams", int, "streams at saturation (0: 2 x max-seqs)"),
    "overhead_rate": ("--overhead-rate", float, "req/s over the five overhead paths"),
    "overhead_s": ("--overhead-seconds", float, "s per overhead round"),
    "overhead_rounds": ("--overhead-rounds", int, "overhead rounds"),
    "parts": ("--parts", parts_of(PARTS), "comma-separated: scheduling, overhead"),
    "seed": ("--seed", int, "seeds the arrivals"),
}
"""Setup fields settable from the command line: flag, type, help. Unset, they take the
default of the setup chosen (--quick or not)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_flags(parser, FLAGS, Setup())
    e = EngineSetup()
    for name in ("step_ms", "step_ms_per_seq", "max_seqs", "output_mu", "output_sigma"):
        kind = int if name == "max_seqs" else float
        parser.add_argument(
            "--" + name.replace("_", "-"),
            dest=f"engine_{name}",
            type=kind,
            help=f"the scheduling engines' --{name.replace('_', '-')} ({getattr(e, name)})",
        )
    q = QUICK
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"a smoke run of about 30 s, figures not to be trusted: max_tokens {q.max_tokens}, "
        f"{q.saturation_s:g} s at saturation, {q.duration_s:g} s per rate, "
        f"{q.overhead_rounds} overhead rounds of {q.overhead_s:g} s (flags given still apply)",
    )


def setup_from(args: argparse.Namespace) -> Setup:
    base = QUICK if args.quick else Setup()
    engine = {
        name.removeprefix("engine_"): value
        for name, value in vars(args).items()
        if name.startswith("engine_") and value is not None
    }
    return replace(base, engine=replace(base.engine, **engine), **given(args, FLAGS))


def checks(setup: Setup, summary: Summary) -> list[Check]:
    """The TTFT target of :func:`.llm_report.checks`."""
    return llm_report.checks(summary.overhead)


class LlmSuite(Suite[Setup, Measured, Summary]):
    name = "llm"
    help = "chat LLM: continuous vs static scheduling; TTFT the sidecar and gateway add"
    description = __doc__ or ""
    setup_type = Setup
    measured_type = Measured

    add_arguments = staticmethod(add_arguments)
    setup = staticmethod(setup_from)
    measure = staticmethod(measure)
    summarize = staticmethod(summarize_run)
    render = staticmethod(render)
    checks = staticmethod(checks)


SUITE = LlmSuite()
