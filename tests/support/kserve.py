"""KServe's own Python model server (``make kserve`` makes its virtualenv) serving the trained
digits model through a team's ``kserve.Model``, and KServe's REST client, for the tests that try
them against modelroll's sidecar and gateway."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from modelroll_devcluster import kserve
from modelroll_devcluster.controlplane import MissingBinaryError
from tests.support.mlserver import serving


@contextlib.contextmanager
def kserve_server(models: Path, workdir: Path) -> Iterator[kserve.KServe]:
    """KServe's model server serving the digits model trained under ``models``, on a free
    port, ready; stopped at the end. Fails the test, naming `make kserve`, when KServe's
    virtualenv is missing."""
    with serving(kserve.KServe(models, workdir)) as server:
        yield server


def rest_infer(url: str, model: str, rows: list[list[float]]) -> dict[str, Any]:
    """KServe's ``InferenceRESTClient`` calling ``url``'s ``/v2/models/{model}/infer`` with
    ``rows`` of pixels: the response it read. Fails the test, naming `make kserve`, when KServe's
    virtualenv is missing."""
    try:
        return kserve.rest_infer(url, model, rows)
    except MissingBinaryError as exc:
        pytest.fail(str(exc))
