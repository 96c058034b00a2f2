"""``make demo`` (sidecar stage): a demo model and a sidecar as real processes, a burst of
concurrent requests, and how the sidecar batched them. ``--once`` runs one round and exits."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


@contextlib.asynccontextmanager
async def process(args: list[str], ready_url: str) -> AsyncIterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(  # noqa: ASYNC220 (spawning does not block; waiting is polled)
        [sys.executable, "-m", *args], stderr=subprocess.DEVNULL
    )
    try:
        async with aiohttp.ClientSession() as session:
            for _ in range(200):
                with contextlib.suppress(aiohttp.ClientError):
                    async with session.get(ready_url) as resp:
                        if resp.status == 200:
                            break
                if proc.poll() is not None:
                    raise SystemExit(f"{args[0]} exited with {proc.returncode}")
                await asyncio.sleep(0.05)
            else:
                raise SystemExit(f"{args[0]} was not ready at {ready_url}")
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


async def close_reasons(session: aiohttp.ClientSession, base: str) -> dict[str, float]:
    async with session.get(base + "/metrics") as resp:
        text = await resp.text()
    return {
        s.labels["reason"]: s.value
        for family in text_string_to_metric_families(text)
        if family.name == "modelroll_batches"
        for s in family.samples
        if s.name == "modelroll_batches_total"
    }


async def one_round(session: aiohttp.ClientSession, sidecar: str, model: str, burst: int) -> None:
    async def call(i: int) -> tuple[int, float]:
        words = " ".join(["token"] * (1 + i % 24))  # lengths vary: padding is what costs
        started = time.monotonic()
        async with session.post(sidecar + "/v1/infer", json={"payload": words}) as resp:
            await resp.read()
            return resp.status, time.monotonic() - started

    async with session.get(model + "/v1/stats") as resp:
        before: dict[str, Any] = await resp.json()
    reasons_before = await close_reasons(session, sidecar)
    started = time.monotonic()
    results = await asyncio.gather(*(call(i) for i in range(burst)))
    elapsed = time.monotonic() - started
    # A few lone requests: now the max-wait timer, not the size, closes each batch.
    for i in range(3):
        results.append(await call(i))
    async with session.get(model + "/v1/stats") as resp:
        after: dict[str, Any] = await resp.json()
    reasons = await close_reasons(session, sidecar)

    sizes = after["batch_sizes"][len(before["batch_sizes"]) :]
    latencies = [lat for _, lat in results[:burst]]
    statuses = Counter(status for status, _ in results)
    print(f"\n{burst} concurrent requests, then 3 one at a time:")
    print(f"  answered:      {dict(sorted(statuses.items()))} (HTTP status: count)")
    print(f"  model calls:   {len(sizes)} batches for {sum(sizes)} requests")
    print(f"  batch sizes:   {sizes}")
    closed = {r: int(reasons[r] - reasons_before.get(r, 0)) for r in reasons}
    print(f"  closed by:     {closed}")
    print(
        f"  burst latency: p50 {percentile(latencies, 0.5) * 1000:.1f} ms, "
        f"p95 {percentile(latencies, 0.95) * 1000:.1f} ms, "
        f"p99 {percentile(latencies, 0.99) * 1000:.1f} ms; {burst / elapsed:.0f} req/s"
    )


async def run(once: bool, burst: int) -> None:
    model_port, sidecar_port = free_port(), free_port()
    model = f"http://127.0.0.1:{model_port}"
    sidecar = f"http://127.0.0.1:{sidecar_port}"
    model_args = ["--port", str(model_port), "--fixed-ms", "20", "--per-token-ms", "0.05"]
    sidecar_args = [
        *("--port", str(sidecar_port), "--upstream", model, "--model", "sentiment"),
        *("--version", "demo", "--max-batch-size", "16", "--max-wait-ms", "10"),
    ]
    print("Demo model: each batch costs 20 ms + 0.05 ms x batch size x longest length.")
    print("Sidecar: a batch closes at 16 requests or when its oldest has waited 10 ms.")
    async with (
        process(["modelroll_sidecar.demo_model", *model_args], model + "/readyz"),
        process(["modelroll_sidecar", *sidecar_args], sidecar + "/readyz"),
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session,
    ):
        print(f"Model at {model}, sidecar at {sidecar}")
        while True:
            await one_round(session, sidecar, model, burst)
            if once:
                return
            print("(Ctrl-C to stop)")
            await asyncio.sleep(3)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="make demo", description=__doc__)
    parser.add_argument("--once", action="store_true", help="run one round and exit")
    parser.add_argument("--burst", type=int, default=200, help="concurrent requests per round")
    args = parser.parse_args(argv)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(run(args.once, args.burst))


if __name__ == "__main__":
    main()
