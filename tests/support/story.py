"""The rollout story the e2e and node tiers tell: model ``sentiment``, versions stable-v1 and
canary-v2, windows of traffic and what they show, and the fast canary analysis settings."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from modelroll_devcluster.pytest_plugin import Figures
from modelroll_devcluster.traffic import Response, Traffic, rounds, whole_rounds
from tests.support.stack import Rollout

MODEL = "sentiment"


STABLE, CANARY = "stable-v1", "canary-v2"


WINDOW = 10


def gateway_weights(rollout: Rollout) -> dict[str, int]:
    """{version: weight} of the model as the gateway routes it right now."""
    model = rollout.routes().get(MODEL) or {"versions": []}
    return {v["name"]: v["weight"] for v in model["versions"]}


def failed(responses: Sequence[Response]) -> list[Response]:
    """Everything but a 200, or a 422 from canary-v2 (an item its model was made to fail)."""
    return [r for r in responses if not (r.status == 200 or (r.status, r.version) == (422, CANARY))]


def windows_after(traffic: Traffic, started: float) -> list[Counter[str]]:
    """Per whole round sent at or after ``started``: which versions answered it."""
    return rounds(whole_rounds(traffic.since(started), WINDOW))


def only_to(traffic: Traffic, version: str, after: float) -> int:
    """Assert that every whole round sent since ``after`` went to ``version`` alone; how many."""
    windows = windows_after(traffic, after)
    assert windows, f"no whole round since {after}"
    others = [w for w in windows if w != Counter({version: WINDOW})]
    assert not others, f"{len(others)} of {len(windows)} rounds not all {version}: {others[:5]}"
    return len(windows)


def last_answer(traffic: Traffic, version: str, after: float) -> tuple[float, int]:
    """Seconds from ``after`` until ``version`` answered its last request sent since then
    (0 when none was), and how many such requests it answered."""
    late = [r for r in traffic.since(after) if r.version == version]
    return max((r.done - after for r in late), default=0.0), len(late)


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms"


def assert_nothing_failed(figures: Figures, name: str, everything: Sequence[Response]) -> None:
    """Report how many of ``everything`` failed (canary-v2's injected item errors aside) as the
    figure ``name``, and fail the test if any did."""
    bad = failed(everything)
    item_errors = sum(1 for r in everything if r.status == 422)
    figures.add(
        name,
        f"{len(bad)} of {len(everything)} (besides canary-v2's injected item errors: "
        f"{item_errors} answered 422)",
    )
    assert not bad, describe(bad)


def describe(responses: Sequence[Response]) -> str:
    codes = Counter((r.version or "-", r.status) for r in responses)
    return ", ".join(f"{v} {s}: {n}" for (v, s), n in sorted(codes.items()))


FAST = {"intervalSeconds": 1, "warmupSeconds": 2, "minSeconds": 4, "minRequests": 20}
"""Quick steps for tests; the 20%-error test keeps the defaults (interval 3 s, warm-up 5 s)."""
