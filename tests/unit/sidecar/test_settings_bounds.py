"""The sidecar takes every value of spec.batching and spec.sidecar that the CRD and the
operator allow, and refuses the values below their minimum or above their maximum: the three
places that know these settings (the CRD, the operator's spec, the sidecar's SidecarConfig)
agree on the bounds of modelroll_common.settings, not only on the defaults
(tests/unit/operator/test_crd_schema.py holds the CRD to the table)."""

from __future__ import annotations

import re
from typing import Any

import pytest

from modelroll_common.settings import BATCHING_SETTINGS, SIDECAR_SETTINGS, Setting
from modelroll_sidecar.config import SidecarConfig, parse_args

SETTINGS = (*BATCHING_SETTINGS, *SIDECAR_SETTINGS)

# maxWaitMs may not exceed timeoutMs (a CEL rule in the CRD, and the sidecar's own check), so
# each value is tried beside max-wait 0 and the longest deadline the CRD allows.
BESIDE = {"max_wait_ms": 0, "timeout_ms": next(s.high for s in SETTINGS if s.attr == "timeout_ms")}


def config(setting: Setting, value: int) -> SidecarConfig:
    given: dict[str, Any] = {**BESIDE, setting.attr: value}
    return SidecarConfig(**given)


@pytest.mark.parametrize("setting", SETTINGS, ids=lambda s: s.key)
def test_the_sidecar_takes_the_lowest_and_highest_value_the_crd_allows(setting: Setting) -> None:
    for value in (setting.low, setting.high):
        assert getattr(config(setting, value), setting.attr) == value
        # The flag the operator writes parses too.
        flags = [f"--{k.replace('_', '-')}={v}" for k, v in BESIDE.items()]
        flags.append(f"{setting.flag}={value}")  # the last of a repeated flag wins
        assert getattr(parse_args(flags, environ={}), setting.attr) == value


@pytest.mark.parametrize("setting", SETTINGS, ids=lambda s: s.key)
def test_the_sidecar_refuses_a_value_below_the_crds_minimum_naming_its_flag(
    setting: Setting,
) -> None:
    problem = f"{setting.flag} must be within {setting.low}..{setting.high}, got {setting.low - 1}"
    with pytest.raises(ValueError, match=f"^{re.escape(problem)}$"):
        config(setting, setting.low - 1)


@pytest.mark.parametrize("setting", SETTINGS, ids=lambda s: s.key)
def test_the_sidecar_refuses_a_value_above_the_crds_maximum_naming_its_flag(
    setting: Setting, capsys: pytest.CaptureFixture[str]
) -> None:
    value = setting.high + 1
    problem = f"{setting.flag} must be within {setting.low}..{setting.high}, got {value}"
    with pytest.raises(ValueError, match=f"^{re.escape(problem)}$"):
        config(setting, value)
    # The flag given at start: the sidecar exits 2 with the same message.
    with pytest.raises(SystemExit) as exited:
        parse_args([f"{setting.flag}={value}"], environ={})
    assert exited.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == f"modelroll-sidecar: error: {problem}"
