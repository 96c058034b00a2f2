"""`modelroll_common.flags`: every flag also has a MODELROLL_* variable, and the flag wins."""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from modelroll_common.flags import EnvArgumentParser, positive_float, positive_int, show_default
from tests.support.flags import help_entries


def parser(environ: Mapping[str, str]) -> EnvArgumentParser:
    p = EnvArgumentParser(prog="prog", environ=environ)
    p.add_argument("--workers", type=positive_int, default=4, help="workers")
    p.add_argument("--timeout", type=positive_float, default=2.5, help="seconds")
    p.add_argument("--level", type=str.upper, choices=["INFO", "DEBUG"], default="INFO")
    p.add_argument("--config", type=Path, help="a file")
    scope = p.add_mutually_exclusive_group()
    show_default(scope.add_argument("-n", "--namespace", action="append", default=[]), "all")
    scope.add_argument("-A", "--all-namespaces", action="store_true")
    return p


def parse(*argv: str, **environ: str) -> argparse.Namespace:
    return parser(environ).parse_args(argv)


def refusal(
    capsys: pytest.CaptureFixture[str], argv: Sequence[str], environ: Mapping[str, str]
) -> str:
    """The error line of a parse that must exit 2."""
    with pytest.raises(SystemExit) as exited:
        parser(environ).parse_args(argv)
    assert exited.value.code == 2
    return capsys.readouterr().err.strip().splitlines()[-1]


def test_every_flag_is_read_from_its_variable_when_not_given() -> None:
    args = parse(
        MODELROLL_WORKERS="8",
        MODELROLL_TIMEOUT="0.5",
        MODELROLL_LEVEL="debug",
        MODELROLL_CONFIG="/etc/x",
        MODELROLL_NAMESPACE="a, b,,",
    )
    assert (args.workers, args.timeout, args.level, args.config, args.namespace) == (
        8,
        0.5,
        "DEBUG",
        Path("/etc/x"),
        ["a", "b"],
    )
    assert parse().workers == 4


def test_a_flag_replaces_its_variable_and_never_adds_to_it() -> None:
    environ = {"MODELROLL_NAMESPACE": "c,d", "MODELROLL_WORKERS": "8", "MODELROLL_TIMEOUT": "x"}
    args = parse("-n", "a", "--namespace=b", "--workers=3", "--timeout=1", **environ)
    assert (args.namespace, args.workers, args.timeout) == (["a", "b"], 3, 1.0)
    # Of two mutually exclusive flags, the one given sets the other's variable aside.
    assert parse("-A", MODELROLL_NAMESPACE="c").namespace == []
    args = parse("-n", "a", MODELROLL_ALL_NAMESPACES="1")
    assert (args.namespace, args.all_namespaces) == (["a"], False)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        *[("1", True), ("TRUE", True), ("yes", True), ("On", True)],
        *[("0", False), ("false", False), ("No", False), ("OFF", False)],
    ],
)
def test_a_boolean_flag_has_a_working_variable(value: str, expected: bool) -> None:
    assert parse(MODELROLL_ALL_NAMESPACES=value).all_namespaces is expected


@pytest.mark.parametrize("value", ["", "2", "y", "enabled", "truth"])
def test_a_bad_boolean_variable_is_refused_by_name(
    value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    error = refusal(capsys, [], {"MODELROLL_ALL_NAMESPACES": value})
    assert error == (
        f"prog: error: MODELROLL_ALL_NAMESPACES={value}: "
        "invalid boolean (use 1/0, true/false, yes/no or on/off)"
    )


@pytest.mark.parametrize(
    ("argv", "environ", "error"),
    [
        (["--workers", "abc"], {}, "--workers abc: invalid positive integer"),
        (["--workers=0"], {}, "--workers 0: invalid positive integer"),
        ([], {"MODELROLL_WORKERS": "abc"}, "MODELROLL_WORKERS=abc: invalid positive integer"),
        ([], {"MODELROLL_TIMEOUT": "nan"}, "MODELROLL_TIMEOUT=nan: invalid positive number"),
        ([], {"MODELROLL_TIMEOUT": "-1"}, "MODELROLL_TIMEOUT=-1: invalid positive number"),
        ([], {"MODELROLL_LEVEL": "loud"}, "MODELROLL_LEVEL=loud: must be one of INFO, DEBUG"),
        (["--level=loud"], {}, "--level loud: must be one of INFO, DEBUG"),
        (
            [],
            {"MODELROLL_NAMESPACE": "a", "MODELROLL_ALL_NAMESPACES": "yes"},
            "MODELROLL_ALL_NAMESPACES=yes: not allowed with MODELROLL_NAMESPACE=a",
        ),
    ],
)
def test_a_bad_value_is_refused_naming_where_it_came_from(
    argv: list[str], environ: dict[str, str], error: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert refusal(capsys, argv, environ) == f"prog: error: {error}"


def test_a_problem_found_after_parsing_names_the_variable_its_value_came_from(
    capsys: pytest.CaptureFixture[str],
) -> None:
    p = parser({"MODELROLL_WORKERS": "9"})
    p.parse_args(["--timeout=9"])
    with pytest.raises(SystemExit):
        p.reject("--workers (9) must be less than --timeout (9)")
    err = capsys.readouterr().err
    assert "error: MODELROLL_WORKERS=9: --workers (9) must be less than --timeout (9)" in err


def test_help_shows_each_flags_default_and_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "1000")
    entries = help_entries(parser({"MODELROLL_WORKERS": "8"}).format_help())
    assert "workers (default: 4; env MODELROLL_WORKERS)" in entries["--workers"]
    assert "(default: 2.5; env MODELROLL_TIMEOUT)" in entries["--timeout"]
    assert "(default: INFO; env MODELROLL_LEVEL)" in entries["--level"]
    assert "a file (default: none; env MODELROLL_CONFIG)" in entries["--config"]
    assert "(default: all; env MODELROLL_NAMESPACE)" in entries["--namespace"]
    assert "(default: off; env MODELROLL_ALL_NAMESPACES)" in entries["--all-namespaces"]
    assert "MODELROLL_HELP" not in entries["--help"]
