"""The benchmarks' batcher configurations as sidecar flags."""

from __future__ import annotations

from modelroll_bench.systems import Batching
from modelroll_sidecar.config import SidecarConfig


def test_a_first_in_first_out_row_runs_the_sidecar_first_in_first_out() -> None:
    flags = Batching(batch_by="arrival", wait_policy="fixed").sidecar_flags()
    default = SidecarConfig()
    assert ("--batch-by" in flags) == (default.batch_by != "arrival")
    assert ("--wait-policy" in flags) == (default.wait_policy != "fixed")
    if "--batch-by" in flags:
        assert flags[flags.index("--batch-by") + 1] == "arrival"


def test_a_row_with_the_sidecars_defaults_passes_no_flag() -> None:
    default = SidecarConfig()
    same = Batching(
        batch_by=default.batch_by, wait_policy=default.wait_policy, length_from=default.length_from
    )
    assert same.sidecar_flags() == []
