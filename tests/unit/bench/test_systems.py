"""The benchmarks' batcher configurations as sidecar flags."""

from __future__ import annotations

from modelroll_bench.systems import Batching, System


def flag(flags: list[str], name: str) -> str:
    return flags[flags.index(name) + 1]


def test_a_first_in_first_out_row_runs_the_sidecar_first_in_first_out() -> None:
    flags = Batching(batch_by="arrival", wait_policy="fixed").sidecar_flags()
    assert (flag(flags, "--batch-by"), flag(flags, "--wait-policy")) == ("arrival", "fixed")
    assert (flag(flags, "--max-batch-size"), flag(flags, "--max-wait-ms")) == ("32", "10")


def test_a_row_with_the_sidecars_defaults_passes_no_batching_flag() -> None:
    argv = System("defaults", "sidecar", Batching(), defaults=True).argv(1, "http://m", 1)
    batching = {"--batch-by", "--wait-policy", "--length-from", "--max-batch-size"}
    assert not batching & set(argv)
    assert not {"--max-wait-ms", "--max-batch-tokens"} & set(argv)
