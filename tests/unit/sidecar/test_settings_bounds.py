"""The sidecar takes every value of spec.batching and spec.sidecar that the CRD and the
operator allow, and refuses the values below their minimum: the three places that know these
settings (the CRD, the operator's spec.BATCHING_SETTINGS and SIDECAR_SETTINGS, the sidecar's
SidecarConfig) agree on the bounds, not only on the defaults (tests/unit/operator/
test_crd_schema.py holds the CRD to the operator's tables)."""

from __future__ import annotations

from typing import Any

import pytest

from modelroll_operator.spec import BATCHING_SETTINGS, SIDECAR_SETTINGS, Setting
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
    with pytest.raises(ValueError, match=setting.flag):
        config(setting, setting.low - 1)
