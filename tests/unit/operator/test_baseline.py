"""Which version a canary is judged against: a baseline that serves nothing is none at all."""

from __future__ import annotations

from modelroll_operator.analysis.daemon import choose_baseline
from tests.support.specs import version

READY = {"conditions": [{"type": "Ready", "status": "True"}]}
NOT_READY = {"conditions": [{"type": "Ready", "status": "False"}]}


def test_a_named_baseline_that_is_not_ready_is_no_baseline() -> None:
    canary = version("canary-v2", weight=10, status=READY)
    stable = version("stable-v1", weight=90, status=NOT_READY)
    found, why = choose_baseline([canary, stable], "canary-v2", "stable-v1")
    assert found is None
    assert why == "the baseline stable-v1 is not Ready"
    ready = version("stable-v1", weight=90, status=READY)
    found, why = choose_baseline([canary, ready], "canary-v2", "stable-v1")
    assert found is not None
    assert (found.name, why) == ("stable-v1", "")


def test_without_a_name_the_highest_weight_ready_version_is_the_baseline() -> None:
    versions = [
        version("canary-v2", weight=10, status=READY),
        version("big-v1", weight=80, status=NOT_READY),
        version("small-v1", weight=10, status=READY),
    ]
    found, _ = choose_baseline(versions, "canary-v2", None)
    assert found is not None
    assert found.name == "small-v1"
