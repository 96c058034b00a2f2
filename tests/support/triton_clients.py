"""The official Triton HTTP client (``tritonclient.http``) as an application calls a model
server of the Open Inference Protocol (MLServer, KServe) or a sidecar in front of one: the digits
model's predictions, several clients at once, and the batches a sidecar formed of their
requests."""

from __future__ import annotations

import contextlib
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import tritonclient.http as triton

CLIENTS = 6
ROUNDS = 4


JSON = {"Content-Type": "application/json"}
"""The header KServe's model server needs to read a request as JSON; tritonclient sends no
Content-Type of its own."""


def digits(
    url: str, model: str, pixels: np.ndarray, headers: dict[str, str] | None = None
) -> list[int]:
    """The digits model's ``predict`` for rows of 64 ``pixels``, sent to ``url`` (host:port)
    with ``headers``."""
    tensor = triton.InferInput("pixels", list(pixels.shape), "FP32")
    tensor.set_data_from_numpy(pixels, binary_data=False)
    with triton.InferenceServerClient(url=url) as client:
        result = client.infer(model, [tensor], headers=headers)
    return [int(digit) for digit in result.as_numpy("predict").ravel()]


OpenClient = Callable[[str], triton.InferenceServerClient]
"""``open_client(url)``: a client of ``url`` (host:port), closed when its test ends."""


@contextlib.contextmanager
def clients() -> Iterator[OpenClient]:
    """Clients opened in this thread, each closed in it when the block ends. A client must be
    closed in the thread that used it: left to the garbage collector, its ``__del__`` closes it
    in whatever thread collects it, where gevent, which it is built on, refuses (the hub
    belongs to one thread), and its sockets are left open."""
    with contextlib.ExitStack() as stack:

        def open_client(url: str) -> triton.InferenceServerClient:
            client = triton.InferenceServerClient(url=url)
            stack.callback(client.close)
            return client

        yield open_client


def each_client(ask: Callable[[int, int], Any]) -> list[list[Any]]:
    """``ask(client, round)`` for CLIENTS clients at once, ROUNDS times each: their answers."""

    def rounds(client: int) -> list[Any]:
        return [ask(client, n) for n in range(ROUNDS)]

    with ThreadPoolExecutor(CLIENTS) as pool:
        return list(pool.map(rounds, range(CLIENTS)))


def batch_sizes(url: str) -> tuple[float, float]:
    """The sidecar's batches and the requests they held."""
    with urllib.request.urlopen(f"http://{url}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    found = {}
    for line in text.splitlines():
        for name in ("modelroll_batch_size_count", "modelroll_batch_size_sum"):
            if line.startswith(name + "{"):
                found[name] = float(line.rsplit(" ", 1)[1])
    return found["modelroll_batch_size_count"], found["modelroll_batch_size_sum"]
