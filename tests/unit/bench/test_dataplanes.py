"""What each data plane adds over calling the backends directly, taken round by round from
rounds made up here (nothing here is timed)."""

from __future__ import annotations

from typing import Any

from modelroll_bench.dataplanes import hop_summary
from modelroll_bench.stats import Spread


def arm(p50: float | None, rps: float, errors: int = 0) -> dict[str, Any]:
    failed = {"502": errors} if errors else {}
    return {"p50_ms": p50, "p95_ms": 2.0, "p99_ms": 3.0, "errors": failed, "rps": rps}


def round_of(direct: float, gateway: float, traefik: float, errors: int = 0) -> dict[str, Any]:
    return {
        "direct": {**arm(1.0, direct), "wrk_failures": 0},
        "gateway": {**arm(1.5, gateway, errors), "wrk_failures": 1},
        "traefik": {**arm(None, traefik), "wrk_failures": 0},
    }


def test_each_plane_is_paired_with_direct_calls_of_the_same_round() -> None:
    summary = hop_summary([round_of(1000, 500, 600, errors=2), round_of(2000, 800, 1200)])
    gateway, traefik = summary.planes["gateway"], summary.planes["traefik"]
    assert gateway.of_direct.by_round == [0.5, 0.4]
    assert gateway.added_p50_ms == Spread(median=0.5, low=0.5, high=0.5, rounds=2)
    assert gateway.errors == 2 + 2  # failed requests in the open loop, and wrk's
    assert traefik.added_p50_ms is None  # no round had a p50 through Traefik
    assert summary.traefik_of_gateway.by_round == [1.2, 1.5]
    assert summary.direct_rps == Spread(median=1500, low=1000, high=2000, rounds=2)
