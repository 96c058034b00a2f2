"""``modelroll-bench``: load runs, the batcher comparison, the batching sweep, rollback latency,
chat LLM scheduling and overhead.

modelroll-bench run URL --mode open --rate 200 --lengths lognormal:3,0.7
modelroll-bench limit --lengths lognormal:3,0.7 --fixed-ms 10 --per-token-ms 0.02
modelroll-bench compare            (make bench)
modelroll-bench sweep --slo-ms 150 (make bench-sweep)
modelroll-bench sidecar            (make bench-sidecar)
modelroll-bench gateway            (make bench-gateway)
modelroll-bench rollback           (make bench-rollback)
modelroll-bench dataplanes         (make bench-dataplanes)
modelroll-bench analysis           (make bench-analysis)
modelroll-bench llm                (make bench-llm)
modelroll-bench encoder            (make bench-encoder)
modelroll-bench llama              (make bench-llama)
modelroll-bench oip                (make bench-oip)
modelroll-bench simulate           (make bench-simulate)
modelroll-bench gpu --device cpu   (bench/gpu/run.sh; make bench-gpu-cpu)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from . import (
    analysis,
    compare,
    dataplanes,
    encoder,
    gateway,
    gpu,
    lengths,
    llama,
    llm,
    oip,
    promote,
    rollback,
    sidecar,
    simulate,
    sweep,
)
from .results import to_json
from .runs import Scenario, Workload, bar, closed_run, machine, open_report, saturate
from .suite import register


def _lengths(text: str) -> lengths.Lengths:
    try:
        return lengths.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _positive(text: str) -> float:
    value = float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text} is not a positive number")
    return value


async def _run(args: argparse.Namespace) -> dict[str, Any]:
    workload = Workload(args.lengths, bodies=args.bodies, seed=args.seed)
    url = args.url.rstrip("/")
    if args.mode == "wrk":
        print(f"wrk: {args.concurrency} connections for {args.duration:g} s", file=sys.stderr)
        found = await saturate(
            url, workload, args.concurrency, round(args.duration), stats_url=args.metrics_url
        )
        return {**to_json(found.result), "batching": to_json(found.batching)}
    with bar(args.duration, f"{args.mode} loop", unit="s") as progress:

        def advance(fraction: float) -> None:
            progress.update(max(0.0, min(args.duration, fraction * args.duration) - progress.n))

        if args.mode == "open":
            opened = await open_report(
                url,
                workload,
                args.rate,
                args.duration,
                seed=args.seed,
                stats_url=args.metrics_url,
                progress=advance,
            )
            result = opened.row()
        else:
            result = await closed_run(
                url,
                workload,
                args.concurrency,
                args.duration,
                stats_url=args.metrics_url,
                progress=advance,
            )
        advance(1.0)
    return result


def cmd_run(args: argparse.Namespace) -> int:
    if args.mode == "open" and args.rate is None:
        raise SystemExit("modelroll-bench run: --mode open needs --rate")
    result = asyncio.run(_run(args))
    report = {
        "mode": args.mode,
        "url": args.url,
        "lengths": args.lengths.spec,
        "machine": machine(),
        "result": result,
    }
    text = json.dumps(report, indent=2)
    print(text)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
    return 0


def cmd_limit(args: argparse.Namespace) -> int:
    cost = lengths.CostModel(args.fixed_ms, args.per_token_ms, args.parallel)
    sent = Workload(args.lengths, bodies=args.bodies, seed=args.seed).sample()
    print(
        f"{args.lengths.spec}: limit = parallel x max batch / E[cost of a full batch], "
        f"{args.trials} batches drawn (seed {args.seed}); last column: batches drawn from the "
        f"{len(sent)} bodies the benchmarks send (longest {max(sent)})"
    )
    for size in args.max_batch:
        limit = cost.limit_rps(args.lengths, size, trials=args.trials, seed=args.seed)
        mean_ms = cost.parallel * size / limit * 1000
        of_sent = cost.limit_rps(sent, size, trials=args.trials, seed=args.seed)
        print(
            f"max batch {size:>4}: E[cost] {mean_ms:8.2f} ms -> limit {limit:8.1f} req/s "
            f"(bodies sent: {of_sent:8.1f} req/s)"
        )
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="modelroll-bench",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="one load run against a server's POST /v1/infer")
    run.add_argument("url", help="base URL of a sidecar (or anything serving /v1/infer)")
    run.add_argument(
        "--mode",
        choices=["open", "closed", "wrk"],
        default="open",
        help="open: Poisson arrivals at --rate; closed: --concurrency clients back "
        "to back; wrk: saturation with --concurrency connections",
    )
    run.add_argument("--rate", type=_positive, help="arrivals per second (open)")
    run.add_argument("--concurrency", type=int, default=32, help="clients or connections (32)")
    run.add_argument("--duration", type=_positive, default=10.0, help="seconds (10)")
    run.add_argument(
        "--lengths",
        type=_lengths,
        default=lengths.parse("fixed:16"),
        help="fixed:N | uniform:LO,HI | lognormal:MU,SIGMA[,MAX] | "
        "bimodal:SHORT,LONG,P_LONG (fixed:16)",
    )
    run.add_argument("--bodies", type=int, default=2000, help="distinct request bodies (2000)")
    run.add_argument("--seed", type=int, default=1, help="seeds the lengths and the arrivals")
    run.add_argument(
        "--metrics-url",
        help="sidecar /metrics (or demo model /v1/stats) for the "
        "mean batch size, e.g. http://127.0.0.1:8000/metrics",
    )
    run.add_argument("--out", type=Path, help="also write the JSON result here")
    run.set_defaults(func=cmd_run)

    limit = sub.add_parser("limit", help="the demo model's limit for a length distribution")
    d = Scenario()
    limit.add_argument("--lengths", type=_lengths, default=lengths.parse(d.lengths))
    limit.add_argument("--fixed-ms", type=float, default=d.fixed_ms)
    limit.add_argument("--per-token-ms", type=float, default=d.per_token_ms)
    limit.add_argument("--parallel", type=int, default=d.parallel)
    limit.add_argument("--max-batch", type=int, nargs="+", default=[1, 4, 8, 16, 32, 64])
    limit.add_argument("--trials", type=int, default=20_000, help="batches drawn (20000)")
    limit.add_argument("--bodies", type=int, default=Workload.bodies, help="bodies sent (2000)")
    limit.add_argument("--seed", type=int, default=d.seed)
    limit.set_defaults(func=cmd_limit)

    for name, module, summary in (
        ("compare", compare, "make bench: every batcher, as ratios"),
        ("rollback", rollback, "time from a weight patch to the last routed request"),
        ("dataplanes", dataplanes, "the gateway beside Traefik: the hop's cost, rollbacks"),
        ("encoder", encoder, "the sidecar in front of the real sentence encoder, as ratios"),
        ("simulate", simulate, "the batcher on a cost surface in virtual time; best static config"),
    ):
        command = sub.add_parser(name, help=summary, description=module.__doc__)
        module.add_arguments(command)
        command.set_defaults(func=module.main)
    on_gpu = sub.add_parser(
        "gpu",
        help="the sidecar's defaults on a GPU encoder at equal p95 (bench/gpu/run.sh)",
        description=gpu.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    gpu.add_arguments(on_gpu)
    on_gpu.set_defaults(func=gpu.cmd)
    for suite in (
        sidecar.SUITE,
        gateway.SUITE,
        sweep.SUITE,
        analysis.SUITE,
        llm.SUITE,
        llama.SUITE,
        promote.SUITE,
        oip.SUITE,
    ):
        register(sub, suite)
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    sys.exit(args.func(args))
