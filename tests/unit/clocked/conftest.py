"""Tests whose event loop runs on virtual time (``modelroll_common.virtual_time``): they assert
exact loop times of timers, deadlines and model calls, and take milliseconds of real time."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from modelroll_common.virtual_time import VirtualTimeLoop


def pytest_asyncio_loop_factories(
    config: pytest.Config, item: pytest.Item
) -> Mapping[str, type[VirtualTimeLoop]]:
    """pytest-asyncio's hook: every test here gets a VirtualTimeLoop."""
    return {"virtual-time": VirtualTimeLoop}
