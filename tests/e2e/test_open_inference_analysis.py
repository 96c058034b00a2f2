"""An Open Inference Protocol model canaried on the whole local stack: versions of MLServer's
scikit-learn digits model (one MLServer process, behind each version's own ``--protocol
openinference`` sidecar), the official Triton client (``tritonclient.http.aio``) sending through
the gateway. The operator judges the canaries on the gateway's per-version metrics, as it does
every other version's: a canary whose sidecar refuses the larger request bodies is rolled back,
the next one, deployed right, is promoted, and the clients get MLServer's predictions throughout.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
import tritonclient.http as triton
import tritonclient.http.aio as triton_aio
import yaml
from aiohttp import ClientError
from tritonclient.utils import InferenceServerException

from modelroll_devcluster.mlserver import samples
from modelroll_devcluster.stack import Stack, VersionSpec
from modelroll_devcluster.traffic import BackgroundLoad
from tests.support.stack import (
    StartLocal,
    analysis_of,
    canary_manifest,
    eventually,
    gateway_metric,
    wait_condition_of,
)
from tests.support.story import FAST

pytestmark = pytest.mark.e2e

MODEL = "digits"
"""The modelroll model, named as MLServer names it: the sidecars call MLServer's digits."""
STABLE, BAD, GOOD = "stable-v1", "canary-v2", "canary-v3"
LIMIT = 800
"""The bad canary's --max-body-bytes: tritonclient's JSON request of 1 or 2 rows of 64 pixels
is under it (380 and 656 bytes), of 3 rows over it (929): a third of the clients' requests."""
REFUSED = f"request body is larger than {LIMIT} bytes"


def digits_version(name: str, weight: int = 0, *sidecar_args: str) -> VersionSpec:
    """A version of the digits model: MLServer's, behind its own sidecar with these flags."""
    return VersionSpec(
        name,
        weight,
        protocol="openinference",
        engine="mlserver",
        model=MODEL,
        sidecar_args=sidecar_args,
    )


@dataclass(frozen=True)
class Answer:
    """One inference through the gateway. ``sent`` is ``time.monotonic()`` seconds."""

    sent: float
    rows: int
    expected: tuple[int, ...]
    """scikit-learn's own predictions for the rows sent (samples.json)."""
    predicted: tuple[int, ...] = ()
    version: str = ""
    """The answer's ``model_version`` ('' for an error)."""
    error: str = ""
    """The client's exception ('' for an answer)."""


class Clients(BackgroundLoad[Answer]):
    """Rounds of ``window`` concurrent ``infer`` calls of the digits model through the gateway,
    ``rounds_per_second``: call ``i`` sends 1 + i % 3 rows of the trained model's samples (a
    cycle prime to the window, so a version at a fixed place in the rounds gets every size)."""

    def __init__(
        self, gateway: str, sampled: dict[str, Any], window: int = 10, rounds_per_second: float = 5
    ) -> None:
        super().__init__(timeout=10.0)
        self.url = gateway.removeprefix("http://")
        self.pixels = np.asarray(sampled["inputs"], dtype=np.float32)
        self.predict = [int(p) for p in sampled["predict"]]
        self.window = window
        self.period = 1.0 / rounds_per_second

    async def _run(self) -> None:
        # mypy reads the class as the sync client's, which the module also star-imports
        client = triton_aio.InferenceServerClient(  # type: ignore[call-arg]
            self.url, conn_limit=self.window, conn_timeout=self.timeout
        )
        try:
            i = 0
            while not self._stop.is_set():
                started = time.monotonic()
                calls = (self._call(client, i + k) for k in range(self.window))
                self.records.extend(await asyncio.gather(*calls))
                i += self.window
                await asyncio.sleep(max(0.0, self.period - (time.monotonic() - started)))
        finally:
            await client.close()

    async def _call(self, client: triton_aio.InferenceServerClient, i: int) -> Answer:
        rows, first = 1 + i % 3, i % (len(self.pixels) - 2)
        pixels = self.pixels[first : first + rows]
        tensor = triton.InferInput("pixels", list(pixels.shape), "FP32")
        tensor.set_data_from_numpy(pixels, binary_data=False)  # MLServer reads JSON tensors
        expected = tuple(self.predict[first : first + rows])
        sent = time.monotonic()
        try:
            result = await client.infer(MODEL, [tensor])
        except (InferenceServerException, ClientError, TimeoutError) as exc:
            return Answer(sent, rows, expected, error=f"{type(exc).__name__}: {exc}")
        predicted = tuple(int(d) for d in result.as_numpy("predict").ravel())
        return Answer(sent, rows, expected, predicted, result.get_response()["model_version"])


def weights(stack: Stack) -> dict[str, int]:
    model = stack.routes().get(MODEL) or {"versions": []}
    return {v["name"]: v["weight"] for v in model["versions"]}


def failed(stack: Stack, version: str) -> float:
    """The version's requests the gateway counted with a status other than 200."""
    counted = "modelroll_gateway_requests_total"
    every = gateway_metric(stack, counted, model=MODEL, version=version)
    return every - gateway_metric(stack, counted, model=MODEL, version=version, code="200")


def test_a_canary_refusing_larger_bodies_is_rolled_back_and_a_right_one_promoted(
    local_stacks: StartLocal,
) -> None:
    """canary-v2's sidecar refuses bodies over 800 bytes (413), which its errors check counts;
    canary-v3, deployed right, is judged by the default checks (errors and latency)."""
    stack = local_stacks(
        (
            digits_version(STABLE, 100),
            digits_version(BAD, 0, f"--max-body-bytes={LIMIT}"),
            digits_version(GOOD),
        )
    )
    stack.kubectl("apply", "-f", "-", input=yaml.safe_dump(stack.manifest(STABLE)))
    eventually(lambda: weights(stack) == {STABLE: 100}, "stable-v1 routed", 30)
    assert stack.mlserver is not None
    bad = {**FAST, "steps": [{"weight": 10}]}
    bad["checks"] = {"errors": {"codes": ["5xx", "422", "429", "413"]}}
    with Clients(stack.gateway_url, samples(stack.mlserver.models, MODEL)) as clients:
        stack.kubectl("apply", "-f", "-", input=canary_manifest(stack, BAD, bad))
        wait_condition_of(stack, BAD, "RolledBack", 60)
        eventually(lambda: weights(stack) == {STABLE: 100, BAD: 0}, "the rollback's routes", 5)
        rolled_back = time.monotonic()
        good = {**FAST, "steps": [{"weight": 50}]}
        stack.kubectl("apply", "-f", "-", input=canary_manifest(stack, GOOD, good))
        wait_condition_of(stack, GOOD, "Promoted", 60)
        promoted = {STABLE: 0, BAD: 0, GOOD: 100}
        eventually(lambda: weights(stack) == promoted, "the promotion's routes", 5)

    state = analysis_of(stack, BAD)
    assert (state["phase"], state["reason"]) == ("RolledBack", "CanaryWorse")
    errors = next(c for c in state["checks"] if c["name"] == "errors")
    assert errors["verdict"] == "Fail"
    assert analysis_of(stack, GOOD)["phase"] == "Promoted"

    answered = [a for a in clients.records if not a.error]
    by_version = {v: [a for a in answered if a.version == v] for v in (STABLE, BAD, GOOD)}
    assert all(by_version.values()), {v: len(a) for v, a in by_version.items()}
    assert all(a.predicted == a.expected for a in answered), "not MLServer's predictions"
    refused = [a for a in clients.records if a.error]
    assert refused, "canary-v2 refused nothing"
    assert all(REFUSED in a.error and a.rows == 3 for a in refused), refused[:3]
    assert failed(stack, STABLE) == 0, "the baseline failed requests"
    assert failed(stack, GOOD) == 0
    assert not [a for a in by_version[BAD] if a.sent > rolled_back]
    assert all(not a.error for a in clients.since(rolled_back))
