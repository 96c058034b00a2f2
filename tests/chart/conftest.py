"""Fixtures for the chart checks: helm built by `make helm` (tests.support.chart)."""

from __future__ import annotations

from tests.support.chart import helm as helm
