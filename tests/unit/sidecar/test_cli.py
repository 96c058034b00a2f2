"""`modelroll-sidecar` flags and their MODELROLL_* variables (bad values: test_bad_input.py)."""

from __future__ import annotations

from dataclasses import fields

import pytest

from modelroll_sidecar.config import SidecarConfig, build_parser, flag, parse_args
from tests.support.flags import help_entries


@pytest.mark.parametrize(
    ("argv", "environ", "error"),
    [
        (
            [],
            {"MODELROLL_MAX_BATCH_SIZE": "0"},
            "MODELROLL_MAX_BATCH_SIZE=0: --max-batch-size must be within 1..4096, got 0",
        ),
        (
            ["--max-wait-ms=10"],
            {"MODELROLL_TIMEOUT_MS": "5"},
            "MODELROLL_TIMEOUT_MS=5: --max-wait-ms (10) must not exceed --timeout-ms (5)",
        ),
        (
            [],
            {"MODELROLL_UPSTREAM": "localhost:8080"},
            "MODELROLL_UPSTREAM=localhost:8080: --upstream must be an http(s) URL, "
            "got 'localhost:8080'",
        ),
        ([], {"MODELROLL_PORT": "http"}, "MODELROLL_PORT=http: invalid integer"),
        ([], {"MODELROLL_MAX_WAIT_MS": "nan"}, "MODELROLL_MAX_WAIT_MS=nan: invalid number"),
        (["--max-wait-ms=-1"], {}, "--max-wait-ms must be within 0..60000, got -1"),
        (
            [],
            {"MODELROLL_MAX_CONCURRENT_BATCHES": "65"},
            "MODELROLL_MAX_CONCURRENT_BATCHES=65: --max-concurrent-batches must be within 1..64, "
            "got 65",
        ),
        (["--timeout-ms", "inf"], {}, "--timeout-ms inf: invalid number"),
    ],
)
def test_an_invalid_setting_names_the_variable_it_came_from(
    argv: list[str], environ: dict[str, str], error: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        parse_args(argv, environ=environ)

    assert exited.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == f"modelroll-sidecar: error: {error}"


def test_a_flag_replaces_an_invalid_variable() -> None:
    environ = {"MODELROLL_MAX_BATCH_SIZE": "0", "MODELROLL_MAX_WAIT_MS": "nan"}
    config = parse_args(["--max-batch-size=8", "--max-wait-ms=2"], environ=environ)
    assert (config.max_batch_size, config.max_wait_ms) == (8, 2.0)
    with pytest.raises(SystemExit):
        parse_args(["--max-batch-size=8"], environ=environ)


def test_help_shows_every_flags_default_and_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "1000")
    entries = help_entries(build_parser({"MODELROLL_PORT": "9"}).format_help())
    defaults = SidecarConfig()
    assert set(entries) == {"--help", *(flag(field.name) for field in fields(defaults))}
    for field in fields(defaults):
        default = getattr(defaults, field.name)
        shown = f"(default: {default}; env MODELROLL_{field.name.upper()})"
        assert shown in entries[flag(field.name)]


def test_max_wait_zero_is_a_legal_setting() -> None:
    assert parse_args(["--max-wait-ms=0"], environ={}).max_wait_ms == 0
