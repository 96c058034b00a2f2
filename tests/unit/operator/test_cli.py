"""`modelroll-operator` flags as the Helm chart and a person pass them."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from modelroll_operator.cli import build_parser, parse_config
from modelroll_operator.config import DEFAULT_SIDECAR_IMAGE, SIDECAR_RESOURCES, OperatorConfig
from tests.support.flags import help_entries


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


def parsed(*argv: str, **environ: str) -> argparse.Namespace:
    return build_parser(environ).parse_args(argv)


@pytest.mark.parametrize(
    ("argv", "environ", "error"),
    [
        (["--drain-timeout-s=0"], {}, "--drain-timeout-s 0: invalid positive integer"),
        (["--workers", "abc"], {}, "--workers abc: invalid positive integer"),
        ([], {"MODELROLL_WORKERS": "abc"}, "MODELROLL_WORKERS=abc: invalid positive integer"),
        ([], {"MODELROLL_PRIORITY": "high"}, "MODELROLL_PRIORITY=high: invalid integer"),
        (
            ["--metrics-port=70000"],
            {},
            "--metrics-port 70000: invalid port number (0 to 65535)",
        ),
        (
            [],
            {"MODELROLL_LOG_FORMAT": "xml"},
            "MODELROLL_LOG_FORMAT=xml: must be one of json, plain, full",
        ),
        (
            [],
            {"MODELROLL_STANDALONE": "maybe"},
            "MODELROLL_STANDALONE=maybe: invalid boolean (use 1/0, true/false, yes/no or on/off)",
        ),
        (
            ["--analysis-url-prefix=prometheus.monitoring.svc:9090"],
            {},
            "--analysis-url-prefix prometheus.monitoring.svc:9090: "
            "prometheus.monitoring.svc:9090 is not an http(s) URL with a host",
        ),
        (
            [],
            {"MODELROLL_ANALYSIS_URL_PREFIX": "http://u:p@prometheus/"},
            "MODELROLL_ANALYSIS_URL_PREFIX=http://u:p@prometheus/: "
            "http://u:p@prometheus/ carries credentials",
        ),
        (
            [],
            {"MODELROLL_PEERING": "modelroll", "MODELROLL_STANDALONE": "1"},
            "MODELROLL_STANDALONE=1: not allowed with MODELROLL_PEERING=modelroll",
        ),
    ],
)
def test_a_bad_value_names_the_flag_or_variable_it_came_from(
    argv: list[str], environ: dict[str, str], error: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        parsed(*argv, **environ)
    assert exited.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == f"modelroll-operator: error: {error}"


def test_analyses_read_only_their_own_namespace_unless_the_flags_allow_more() -> None:
    assert (config().analysis_url_prefixes, config().analysis_gateway_namespaces) == ((), ())
    cfg = parse_config(
        parsed(
            "--analysis-url-prefix=http://prometheus.monitoring.svc:9090/",
            "--analysis-gateway-namespace=gateways",
            MODELROLL_ANALYSIS_GATEWAY_NAMESPACE="ignored",
        )
    )
    assert cfg.analysis_url_prefixes == ("http://prometheus.monitoring.svc:9090/",)
    assert cfg.analysis_gateway_namespaces == ("gateways",)
    from_env = parse_config(parsed(MODELROLL_ANALYSIS_GATEWAY_NAMESPACE="a,b"))
    assert from_env.analysis_gateway_namespaces == ("a", "b")


def test_metrics_are_served_next_to_the_liveness_probe_unless_turned_off() -> None:
    assert config().metrics_port == 8082
    assert config("--metrics-port=0").metrics_port == 0
    assert parse_config(parsed(MODELROLL_METRICS_PORT="9102")).metrics_port == 9102
    # A library user's configuration serves nothing unless asked.
    assert OperatorConfig().metrics_port == 0


def test_a_flag_replaces_its_variable() -> None:
    environ = {"MODELROLL_NAMESPACE": "c,d", "MODELROLL_WORKERS": "8"}
    assert parsed(**environ).namespace == ["c", "d"]
    args = parsed("-n", "a", "--namespace=b", "--workers=3", **environ)
    assert (args.namespace, args.workers) == (["a", "b"], 3)
    # A flag also sets aside the variable of the flag it excludes.
    args = parsed("--all-namespaces", **environ)
    assert (args.namespace, args.all_namespaces) == ([], True)
    assert parse_config(parsed("--peering=p", MODELROLL_STANDALONE="1")).peering == "p"


@pytest.mark.parametrize("on", ["1", "true", "YES", "on"])
def test_switches_have_working_variables(on: str) -> None:
    args = parsed(MODELROLL_STANDALONE=on, MODELROLL_ALL_NAMESPACES=on)
    assert (args.standalone, args.all_namespaces) == (True, True)
    assert parse_config(parsed(MODELROLL_STANDALONE=on)).peering is None
    assert parse_config(parsed("--standalone", MODELROLL_PEERING="p")).peering is None
    off = {"1": "0", "true": "false", "YES": "no", "on": "OFF"}[on]
    args = parsed("-n", "a", MODELROLL_STANDALONE=off, MODELROLL_ALL_NAMESPACES=off)
    assert (args.standalone, args.all_namespaces, args.namespace) == (False, False, ["a"])


DEFAULTS = {
    "--namespace": "all namespaces",
    "--all-namespaces": "off",
    "--sidecar-image": DEFAULT_SIDECAR_IMAGE,
    "--sidecar-resources": json.dumps(SIDECAR_RESOURCES, separators=(",", ":")),
    "--drain-timeout-s": "30",
    "--kubeconfig": "$KUBECONFIG, else ~/.kube/config, else the in-cluster service account",
    "--liveness": "http://0.0.0.0:8081/healthz",
    "--metrics-port": "8082",
    "--peering": "none: standalone",
    "--standalone": "off",
    "--priority": "a random number when peering, else 0",
    "--gateway-api": "off",
    "--pod-security": "baseline",
    "--scale-before-shift": "on",
    "--autoscaler": "none",
    "--prometheus-url": "none",
    "--analysis-url-prefix": "none: Services of the version's namespace only "
    "(<service>.<namespace>.svc)",
    "--analysis-gateway-namespace": "none: the version's own namespace only",
    "--workers": "4",
    "--log-format": "json",
    "--log-level": "INFO",
}


def test_help_shows_every_flags_default_and_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "1000")
    entries = help_entries(build_parser({"MODELROLL_WORKERS": "8"}).format_help())
    assert set(entries) == {*DEFAULTS, "--liveness-endpoint", "--no-scale-before-shift", "--help"}
    for flag, default in DEFAULTS.items():
        variable = "MODELROLL_" + flag[2:].replace("-", "_").upper()
        assert f"(default: {default}; env {variable})" in entries[flag]


def test_sidecar_resources_come_from_json_and_a_bad_value_names_the_flag(
    capsys: pytest.CaptureFixture[str],
) -> None:
    given = '{"requests": {"cpu": "250m"}, "limits": {"cpu": "250m", "memory": "256Mi"}}'
    config = parse_config(parsed(f"--sidecar-resources={given}"))
    assert config.sidecar_resources == json.loads(given)
    assert parse_config(parsed()).sidecar_resources == SIDECAR_RESOURCES
    with pytest.raises(SystemExit):
        parsed('--sidecar-resources={"cpu": "1"}')
    assert (
        "--sidecar-resources must be an object with requests and limits" in capsys.readouterr().err
    )
