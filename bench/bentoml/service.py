"""BentoML's adaptive batcher in front of a model that speaks modelroll's batch protocol, for the
batcher comparison: one service, one worker, its batchable API at ``POST /v1/infer``; each batch
BentoML's dispatcher forms goes to the model's ``POST /v1/batch``.

A request is the sidecar's ``{"payload": p}``; BentoML batches a list parameter, so one payload
counts as a list of one and the answer is that list's one output, ``[o]``. BentoML's
``max_latency_ms`` is not a wait: it is the latency its dispatcher aims every request at, and a
request it predicts will miss it is refused with 503, so the comparison gives it the benchmark's
SLO. A model error fails the whole batch (500 to each of its requests).

Runs in its own virtualenv (``make bentoml``): BentoML pins its own web stack.
Run: python service.py PORT UPSTREAM MAX_BATCH MAX_LATENCY_MS
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated, Any

import aiohttp
import bentoml
from pydantic import BeforeValidator

UPSTREAM = os.environ.get("MODELROLL_BENTOML_UPSTREAM", "http://127.0.0.1:8080")
MAX_BATCH = int(os.environ.get("MODELROLL_BENTOML_MAX_BATCH", "32"))
MAX_LATENCY_MS = int(os.environ.get("MODELROLL_BENTOML_MAX_LATENCY_MS", "60000"))
MAX_CONCURRENCY = 4096
"""Requests the service holds at once, like the sidecar's queue in the comparison."""


def _as_list(value: Any) -> list[Any]:
    """One request's payload as the list of one that BentoML's batching concatenates."""
    return value if isinstance(value, list) else [value]


Payloads = Annotated[list[Any], BeforeValidator(_as_list)]


class ModelError(bentoml.exceptions.BentoMLException):
    """The model refused or failed a batch."""


@bentoml.service(workers=1, traffic={"timeout": 120, "max_concurrency": MAX_CONCURRENCY})
class Batcher:
    def __init__(self) -> None:
        self.http: aiohttp.ClientSession | None = None

    @bentoml.api(
        route="/v1/infer",
        batchable=True,
        max_batch_size=MAX_BATCH,
        max_latency_ms=MAX_LATENCY_MS,
    )
    async def infer(self, payload: Payloads) -> list[Any]:
        if self.http is None:
            self.http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60))
        async with self.http.post(UPSTREAM + "/v1/batch", json={"inputs": payload}) as resp:
            body = await resp.json(content_type=None)
        if resp.status != 200 or any(body.get("errors") or []):
            raise ModelError(f"the model answered {resp.status}: {body}")
        outputs: list[Any] = body["outputs"]
        return outputs


def main(argv: list[str]) -> int:
    """Serve this file's service with ``bentoml serve`` on 127.0.0.1:PORT."""
    port, upstream, max_batch, max_latency_ms = argv
    env = {
        **os.environ,
        "MODELROLL_BENTOML_UPSTREAM": upstream,
        "MODELROLL_BENTOML_MAX_BATCH": max_batch,
        "MODELROLL_BENTOML_MAX_LATENCY_MS": str(round(float(max_latency_ms))),
    }
    here = Path(__file__).resolve().parent
    cli = str(Path(sys.executable).parent / "bentoml")
    serve = [cli, "serve", "service:Batcher", "--working-dir", str(here)]
    # Exec, so the SIGTERM that stops the benchmark's server reaches bentoml serve itself.
    os.execve(cli, [*serve, "--host", "127.0.0.1", "--port", port], env)  # noqa: S606


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
