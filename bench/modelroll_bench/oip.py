"""``make bench-oip`` (``modelroll-bench oip``): a real Open Inference Protocol server, MLServer
with its scikit-learn runtime serving the digits random forest of ``models/mlserver/train.py``,
called by closed-loop clients, one request of one row each, in one run:

- directly (``POST /v2/models/digits/infer``);
- through the sidecar without batching (``--protocol openinference --max-batch-size 1``);
- through the sidecar with its default batching;
- through the gateway and that sidecar;

each with MLServer's own adaptive batching off and on (two MLServer processes, each with its own
sidecars and gateway). Throughput and p50/p95/p99 of every row, in rounds (the rows' order
rotating from round to round), as medians and ranges over rounds and as ratios to MLServer
called directly with its batching off, paired by round. Before them, the model's cost: one call
of 1 row and of N rows straight to MLServer (its batching off), and every path's answers to the
training script's samples against the model's own predictions.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import tempfile
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from modelroll_devcluster.mlserver import AdaptiveBatching, MLServer, samples, train
from modelroll_devcluster.processes import free_port

from .encoder import rotated
from .figures import Figure, LoadSummary
from .gateway import MODEL, gateway_to
from .gateway import Setup as GatewaySetup
from .loadgen import HEADERS, Body, closed_loop
from .metrics import Watch
from .runs import load_average, sequential_ms
from .servers import Check, serve_module
from .stats import Spread, paired_ratios, spread
from .suite import Suite, markdown

DIRECT, NO_BATCHING, SIDECAR, GATEWAY = "direct", "sidecar B=1", "sidecar", "gateway+sidecar"
PATHS = (DIRECT, NO_BATCHING, SIDECAR, GATEWAY)
"""How the clients reach MLServer; the sidecar rows need its ``--protocol openinference``."""
SERVER_BATCHING = ("off", "on")
"""MLServer's adaptive batching."""
BASELINE = f"{DIRECT}, MLServer batching off"
INFER = f"/v2/models/{MODEL}/infer"
"""A sidecar's and the gateway's infer path: the bench's model name, not MLServer's."""


def label(path: str, server_batching: str) -> str:
    return f"{path}, MLServer batching {server_batching}"


@dataclass(frozen=True)
class Setup:
    model: str = "digits"
    concurrency: int = 32
    """Closed-loop clients, each sending its next request when the last is answered."""
    duration_s: float = 8.0
    """Seconds counted per row and round, after ``warmup_s`` not counted."""
    warmup_s: float = 1.0
    rounds: int = 3
    paths: tuple[str, ...] = PATHS
    server_batching: tuple[str, ...] = SERVER_BATCHING
    mlserver_max_batch: int = 32
    mlserver_max_wait_ms: float = 10.0
    """MLServer's adaptive batching when on: the sidecar's default batch size and wait."""
    cost_rows: int = 32
    cost_calls: int = 20

    @property
    def systems(self) -> list[str]:
        return [label(p, b) for b in self.server_batching for p in self.paths]


@dataclass(frozen=True)
class Cost:
    """MLServer's time for one call (HTTP on loopback included), its batching off: a median of
    sequential calls of one row and of ``rows`` rows."""

    one_row_ms: float
    rows: int
    rows_ms: float

    @property
    def per_row_ms(self) -> float:
        return (self.rows_ms - self.one_row_ms) / (self.rows - 1)

    @property
    def per_call_ms(self) -> float:
        """The part of one call that does not grow with its rows."""
        return self.one_row_ms - self.per_row_ms


@dataclass(frozen=True)
class Run:
    """One row's closed loop in one round, and the machine's 1-minute load average before it."""

    round: int
    system: str
    load: LoadSummary
    load_average_1m: float
    mean_batch: float | None = None
    """The sidecar's rows a model call over the run (its ``/metrics``; None without a sidecar)."""


@dataclass(frozen=True)
class Measured:
    model: str
    """What MLServer served, in words."""
    cost: Cost
    answers: dict[str, bool]
    """By path: whether it answered every sample with the model's own prediction."""
    runs: list[Run] = field(default_factory=list)


@dataclass(frozen=True)
class SystemFigures:
    throughput_rps: Figure
    p50_ms: Figure
    p95_ms: Figure
    p99_ms: Figure
    errors: int
    mean_batch: Spread | None


@dataclass(frozen=True)
class Summary:
    model: str
    cost: Cost
    answers: dict[str, bool]
    systems: dict[str, SystemFigures]


def infer_body(settings: dict[str, Any], rows: Sequence[Any]) -> dict[str, Any]:
    """An inference request of ``rows`` of the model's one input tensor (its name and datatype
    from model-settings.json): a row that is a list is a row of numbers, anything else one
    element (a string of a BYTES tensor)."""
    [tensor] = settings["inputs"]
    width = len(rows[0]) if isinstance(rows[0], list) else 1
    data = [x for row in rows for x in (row if isinstance(row, list) else [row])]
    found = {"name": tensor["name"], "datatype": tensor["datatype"], "data": data}
    return {"inputs": [{**found, "shape": [len(rows), width]}]}


def oip_bodies(settings: dict[str, Any], rows: Sequence[Any]) -> Body:
    """Bodies of one row each, one per row of ``rows``, encoded once and cycled through."""
    encoded = [json.dumps(infer_body(settings, [row])).encode() for row in rows]
    return lambda i: encoded[i % len(encoded)]


def predictions(answer: dict[str, Any]) -> list[Any]:
    """The ``predict`` output tensor's data of an inference answer."""
    [found] = [o["data"] for o in answer["outputs"] if o["name"] == "predict"]
    return list(found)


async def answers_agree(url: str, settings: dict[str, Any], expected: dict[str, Any]) -> bool:
    """Whether ``url`` answers each sample row, sent alone, with the model's own prediction."""
    async with aiohttp.ClientSession() as http:
        for row, want in zip(expected["inputs"], expected["predict"], strict=True):
            body = json.dumps(infer_body(settings, [row]))
            async with http.post(url, data=body, headers=HEADERS) as resp:
                if resp.status != 200 or predictions(await resp.json()) != [want]:
                    return False
    return True


async def measure_cost(url: str, settings: dict[str, Any], rows: Sequence[Any], n: int) -> Cost:
    """One call of one row and one of ``n`` rows (the sample rows repeated), sequentially."""
    many = [rows[i % len(rows)] for i in range(n)]
    one_ms = await sequential_ms(url, infer_body(settings, rows[:1]), calls=20, warmup=3)
    many_ms = await sequential_ms(url, infer_body(settings, many), calls=20, warmup=3)
    return Cost(round(one_ms, 3), n, round(many_ms, 3))


def sidecar_args(port: int, upstream: str, served_as: str, batched: bool) -> list[str]:
    """The sidecar in front of MLServer: the bench's model name outside, MLServer's inside."""
    args = ["--protocol", "openinference", "--upstream", upstream, "--model", MODEL]
    args += ["--served-model-name", served_as, "--version", "v1", "--host", "127.0.0.1"]
    args += ["--port", str(port), "--max-queue-size", "4096"]
    return args + ([] if batched else ["--max-batch-size", "1"])


@contextlib.asynccontextmanager
async def mlserver(
    models: Path, workdir: Path, batching: AdaptiveBatching | None
) -> AsyncIterator[MLServer]:
    server = MLServer(models, workdir, batching)
    await asyncio.to_thread(server.start)
    try:
        yield server
    finally:
        await asyncio.to_thread(server.stop)


@dataclass(frozen=True)
class Endpoint:
    """Where a path's clients send (its infer URL), and the metrics of the sidecar on it."""

    infer: str
    sidecar_metrics: str | None = None


async def paths_to(
    stack: contextlib.AsyncExitStack, server: MLServer, setup: Setup
) -> dict[str, Endpoint]:
    """Every path of ``setup`` to ``server``, starting what it goes through."""
    found = {DIRECT: Endpoint(f"{server.url}/v2/models/{setup.model}/infer")}
    sidecars: dict[str, str] = {}
    for path, batched in ((NO_BATCHING, False), (SIDECAR, True)):
        if path in setup.paths or (batched and GATEWAY in setup.paths):
            port = free_port()
            args = sidecar_args(port, server.url, setup.model, batched)
            sidecar = await stack.enter_async_context(serve_module("modelroll_sidecar", args, port))
            sidecars[path] = sidecar.url
            found[path] = Endpoint(f"{sidecar.url}{INFER}", f"{sidecar.url}/metrics")
    if GATEWAY in setup.paths:
        gateway = await stack.enter_async_context(
            gateway_to(sidecars[SIDECAR], GatewaySetup(pin=False), "uvloop", None)
        )
        found[GATEWAY] = Endpoint(f"{gateway.url}{INFER}", found[SIDECAR].sidecar_metrics)
    return {path: endpoint for path, endpoint in found.items() if path in setup.paths}


MODEL_TEXT = {
    "digits": "a random forest of 50 trees on scikit-learn's 8x8 digits",
    "sentiment": "TF-IDF and logistic regression on short English reviews",
}


async def model_text(setup: Setup, server: MLServer, settings: dict[str, Any]) -> str:
    """The model and the server, in words, with the server's own name and version (``GET
    /v2``)."""
    async with aiohttp.ClientSession() as http, http.get(f"{server.url}/v2") as resp:
        meta = await resp.json()
    [tensor] = settings["inputs"]
    return (
        f"{setup.model}: {MODEL_TEXT.get(setup.model, setup.model)} (models/mlserver/train.py), "
        f"input {tensor['name']} {tensor['datatype']}, on {meta['name']} {meta['version']} "
        f"with mlserver-sklearn, {server.parallel_workers} inference worker"
    )


async def measure(setup: Setup) -> Measured:
    async with contextlib.AsyncExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="modelroll-bench-")))
        models = await asyncio.to_thread(train, tmp / "models")
        settings = json.loads((models / setup.model / "model-settings.json").read_text())
        expected = samples(models, setup.model)
        on = AdaptiveBatching(setup.mlserver_max_batch, setup.mlserver_max_wait_ms / 1000)
        endpoints: dict[str, Endpoint] = {}
        answers: dict[str, bool] = {}
        for server_batching in setup.server_batching:
            batching = on if server_batching == "on" else None
            server = await stack.enter_async_context(
                mlserver(models, tmp / f"mlserver-{server_batching}", batching)
            )
            for path, endpoint in (await paths_to(stack, server, setup)).items():
                system = label(path, server_batching)
                endpoints[system] = endpoint
                answers[system] = await answers_agree(endpoint.infer, settings, expected)
            if server_batching == "off" or "off" not in setup.server_batching:
                cost = await measure_cost(
                    f"{server.url}/v2/models/{setup.model}/infer",
                    settings,
                    expected["inputs"],
                    setup.cost_rows,
                )
                text = await model_text(setup, server, settings)
        print(
            f"Model: {text}. One call of 1 row {cost.one_row_ms:.2f} ms, of {cost.rows} rows "
            f"{cost.rows_ms:.2f} ms: {cost.per_call_ms:.2f} ms a call and "
            f"{cost.per_row_ms:.3f} ms a row.",
            flush=True,
        )
        body = oip_bodies(settings, expected["inputs"])
        runs: list[Run] = []
        for r in range(setup.rounds):
            for system in rotated(setup.systems, r):
                average = load_average()
                async with Watch(endpoints[system].sidecar_metrics) as watch:
                    result = await closed_loop(
                        endpoints[system].infer,
                        body,
                        setup.concurrency,
                        setup.duration_s,
                        label=system,
                        warmup_s=setup.warmup_s,
                    )
                mean = watch.delta.mean_batch if watch.delta else None
                runs.append(Run(r + 1, system, result.report(), round(average, 2), mean))
                print(f"  round {r + 1}  {_line(runs[-1])}", flush=True)
    return Measured(text, cost, answers, runs)


def _line(run: Run) -> str:
    load = run.load
    mean = "-" if run.mean_batch is None else f"{run.mean_batch:.1f}"
    return (
        f"{load.label:<40} {load.throughput_rps:8.1f} req/s  {load.latency.text()}  "
        f"sidecar's mean batch {mean}  errors {load.error_count}"
    )


def summarize(setup: Setup, measured: Measured) -> Summary:
    """Each system's medians and ranges over rounds, and its ratios to the baseline's figure of
    the same round."""

    def values(system: str, key: str) -> list[float | None]:
        by_round = {run.round: run.load for run in measured.runs if run.system == system}
        return [
            getattr(by_round[r], key) if r in by_round else None for r in range(1, setup.rounds + 1)
        ]

    def figure(system: str, key: str) -> Figure:
        mine, base = values(system, key), values(BASELINE, key)
        ratios = paired_ratios(mine, base) if BASELINE in setup.systems else []
        return Figure(spread(mine, 2), spread(ratios))

    systems = {
        system: SystemFigures(
            throughput_rps=figure(system, "throughput_rps"),
            p50_ms=figure(system, "p50_ms"),
            p95_ms=figure(system, "p95_ms"),
            p99_ms=figure(system, "p99_ms"),
            errors=sum(run.load.error_count for run in measured.runs if run.system == system),
            mean_batch=spread(run.mean_batch for run in measured.runs if run.system == system),
        )
        for system in setup.systems
    }
    return Summary(measured.model, measured.cost, measured.answers, systems)


def _cell(found: Figure, fmt: str = ".1f") -> str:
    value = found.value
    if value is None:
        return "-"
    text = format(value.median, fmt)
    if value.rounds > 1:
        text += f" ({format(value.low, fmt)}-{format(value.high, fmt)})"
    return text


def _ratio(found: Figure) -> str:
    ratio = found.ratio_to_baseline
    return "-" if ratio is None else f"{ratio.median:.2f}x"


def render(setup: Setup, summary: Summary) -> str:
    cost = summary.cost
    head = [
        "path",
        "MLServer batching",
        "req/s",
        "x direct",
        "p50 ms",
        "p95 ms",
        "p99 ms",
        "p99 x direct",
        "sidecar's mean batch",
        "errors",
    ]
    rows = []
    for system, figs in summary.systems.items():
        path, _, server_batching = system.partition(", MLServer batching ")
        rows.append(
            [
                path,
                server_batching,
                _cell(figs.throughput_rps),
                _ratio(figs.throughput_rps),
                _cell(figs.p50_ms),
                _cell(figs.p95_ms),
                _cell(figs.p99_ms),
                _ratio(figs.p99_ms),
                "-" if figs.mean_batch is None else f"{figs.mean_batch.median:.1f}",
                str(figs.errors),
            ]
        )
    return (
        f"Model: {summary.model}.\n"
        f"Its cost, straight to MLServer (batching off): 1 row {cost.one_row_ms:.2f} ms, "
        f"{cost.rows} rows {cost.rows_ms:.2f} ms: {cost.per_call_ms:.2f} ms a call + "
        f"{cost.per_row_ms:.3f} ms a row.\n"
        f"{setup.concurrency} closed-loop clients, one row a request, {setup.duration_s:g} s a row "
        f"after {setup.warmup_s:g} s not counted; medians (range) over {setup.rounds} round(s); "
        f"ratios to {BASELINE}, paired by round. MLServer's batching when on: "
        f"{setup.mlserver_max_batch} rows, {setup.mlserver_max_wait_ms:g} ms.\n\n"
        + markdown(head, rows)
    )


def checks(setup: Setup, summary: Summary) -> list[Check]:
    wrong = [system for system, ok in summary.answers.items() if not ok]
    failed = {s: f.errors for s, f in summary.systems.items() if f.errors}
    return [
        (
            "every path answers the model's own predictions",
            not wrong,
            "all agree" if not wrong else "wrong: " + ", ".join(wrong),
        ),
        (
            "no request fails",
            not failed,
            "none" if not failed else ", ".join(f"{s}: {n}" for s, n in failed.items()),
        ),
    ]


def _choices(allowed: Sequence[str]) -> Any:
    def parse(text: str) -> tuple[str, ...]:
        found = tuple(part.strip() for part in text.split(",") if part.strip())
        unknown = [part for part in found if part not in allowed]
        if unknown or not found:
            raise argparse.ArgumentTypeError(
                f"{text!r}: choose from {', '.join(allowed)} (comma-separated)"
            )
        return found

    return parse


class OipSuite(Suite[Setup, Measured, Summary]):
    name = "oip"
    help = "MLServer (Open Inference Protocol) directly, through the sidecar and the gateway"
    description = __doc__ or ""
    setup_type = Setup
    measured_type = Measured

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        d = Setup()
        parser.add_argument("--model", choices=tuple(MODEL_TEXT), default=d.model)
        parser.add_argument("--concurrency", type=int, default=d.concurrency, help="clients")
        parser.add_argument("--duration", type=float, default=d.duration_s, help="s per row")
        parser.add_argument("--warmup", type=float, default=d.warmup_s, help="s not counted")
        parser.add_argument("--rounds", type=int, default=d.rounds)
        parser.add_argument(
            "--paths",
            type=_choices(PATHS),
            default=d.paths,
            help=f"comma-separated, of {', '.join(PATHS)} (all)",
        )
        parser.add_argument(
            "--server-batching",
            type=_choices(SERVER_BATCHING),
            default=d.server_batching,
            help="MLServer's adaptive batching: off, on or off,on (off,on)",
        )
        parser.add_argument("--cost-rows", type=int, default=d.cost_rows)

    def setup(self, args: argparse.Namespace) -> Setup:
        if args.cost_rows < 2:
            raise SystemExit("--cost-rows must be at least 2")
        return Setup(
            model=args.model,
            concurrency=args.concurrency,
            duration_s=args.duration,
            warmup_s=args.warmup,
            rounds=args.rounds,
            paths=args.paths,
            server_batching=args.server_batching,
            cost_rows=args.cost_rows,
        )

    async def measure(self, setup: Setup) -> Measured:
        return await measure(setup)

    summarize = staticmethod(summarize)
    render = staticmethod(render)
    checks = staticmethod(checks)


SUITE = OipSuite()
