"""`modelroll-operator` flags as the Helm chart and a person pass them."""

from __future__ import annotations

from pathlib import Path

import pytest

from modelroll_operator.cli import build_parser, parse_config
from modelroll_operator.settings import OperatorConfig


def config(*argv: str) -> OperatorConfig:
    return parse_config(build_parser().parse_args(argv))


def test_the_defaults_run_standalone_with_the_released_sidecar() -> None:
    cfg = config()
    assert cfg.peering is None
    assert cfg.sidecar_image.startswith("ghcr.io/modelroll/modelroll-sidecar:")
    assert cfg.termination_grace_s > cfg.drain_timeout_s


def test_the_charts_flags_are_accepted() -> None:
    args = build_parser().parse_args(
        [
            "--sidecar-image=r/s:1",
            "--all-namespaces",
            "--standalone",
            "--liveness=http://0.0.0.0:8080/healthz",
        ]
    )
    cfg = parse_config(args)
    assert (cfg.sidecar_image, cfg.peering, args.liveness) == (
        "r/s:1",
        None,
        "http://0.0.0.0:8080/healthz",
    )


def test_peered_replicas_draw_different_priorities_unless_one_is_given() -> None:
    drawn = {config("--peering=modelroll").priority for _ in range(5)}
    assert len(drawn) > 1
    assert config("--peering=modelroll", "--priority=7").priority == 7


def test_environment_variables_stand_in_for_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MODELROLL_SIDECAR_IMAGE", "r/s:env")
    monkeypatch.setenv("MODELROLL_KUBECONFIG", "/tmp/kubeconfig")
    monkeypatch.setenv("MODELROLL_LOG_LEVEL", "debug")
    args = build_parser().parse_args([])
    cfg = parse_config(args)
    assert (cfg.sidecar_image, cfg.kubeconfig, args.log_level) == (
        "r/s:env",
        Path("/tmp/kubeconfig"),
        "DEBUG",
    )


def test_a_bad_value_names_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--drain-timeout-s=0"])
    assert "--drain-timeout-s: 0 is not a positive integer" in capsys.readouterr().err
