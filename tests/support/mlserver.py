"""MLServer serving the trained scikit-learn models, for the tests that need a real Open
Inference Protocol server (``make mlserver`` makes its virtualenv), and sidecars in front of it
or of another such server (KServe's)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Protocol, TypeVar

import pytest

from modelroll_devcluster.mlserver import AdaptiveBatching, MLServer, train
from modelroll_devcluster.processes import ClusterError
from tests.support.processes import Spawn, free_port


def trained_models(out: Path) -> Path:
    """Every model of models/mlserver/train.py trained into ``out``; fails the test, naming
    `make mlserver`, when MLServer's virtualenv is missing."""
    try:
        return train(out)
    except ClusterError as exc:
        pytest.fail(str(exc))


class ModelServer(Protocol):
    """A real Open Inference Protocol server on loopback (MLServer, KServe)."""

    @property
    def url(self) -> str: ...

    def start(self) -> object: ...

    def stop(self) -> None: ...


Server = TypeVar("Server", bound=ModelServer)


@contextlib.contextmanager
def serving(server: Server) -> Iterator[Server]:
    """``server`` started and ready, stopped at the end; a server that does not start (or whose
    virtualenv is missing: the message names its make target) fails the test."""
    try:
        server.start()
    except ClusterError as exc:
        pytest.fail(str(exc))
    try:
        yield server
    finally:
        server.stop()


@contextlib.contextmanager
def mlserver(
    models: Path, workdir: Path, batching: AdaptiveBatching | None = None
) -> Iterator[MLServer]:
    """A real ``mlserver start`` serving ``models`` (:func:`trained_models`) on free ports,
    ready, with MLServer's adaptive batching as ``batching`` (None: off); stopped at the end."""
    with serving(MLServer(models, workdir, batching)) as server:
        yield server


def sidecar(spawn: Spawn, server: ModelServer, model: str, served: str, version: str = "v1") -> str:
    """A sidecar process (``--protocol openinference``) of ``version`` of ``model`` in front of
    ``server``'s ``served``, ready; its host:port."""
    port = free_port()
    spawn(
        "modelroll-sidecar",
        f"--port={port}",
        f"--upstream={server.url}",
        "--protocol=openinference",
        f"--model={model}",
        f"--version={version}",
        f"--served-model-name={served}",
        "--wait-policy=fixed",
        "--max-wait-ms=50",
        ready=f"http://127.0.0.1:{port}/readyz",
    )
    return f"127.0.0.1:{port}"
