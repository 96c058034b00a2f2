"""Fixtures shared by every test tier: real child processes (helpers in tests.support.processes)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import pytest

from modelroll_devcluster.kserve import KServe
from modelroll_devcluster.mlserver import AdaptiveBatching, MLServer
from modelroll_devcluster.processes import environment
from tests.support.kserve import kserve_server
from tests.support.mlserver import mlserver as serve_mlserver
from tests.support.mlserver import trained_models
from tests.support.processes import VENV_BIN, Proc, Spawn, start_proc, wait_http
from tests.support.triton_clients import OpenClient, clients


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Spawn]:
    """Start a console script from .venv as a real process; every one is stopped at teardown.

    ``spawn(name, *args, ready=url)`` waits until ``url`` answers 200 (pass ``ready_status`` for
    another code, or ``ready=None`` not to wait). ``env`` adds variables (None removes one);
    ``prefix`` is a command that runs the script (e.g. in other namespaces).
    """
    procs: list[Proc] = []

    def start(
        command: str,
        *args: str,
        ready: str | None = None,
        ready_status: int = 200,
        env: Mapping[str, str | None] | None = None,
        prefix: Sequence[str] = (),
    ) -> Proc:
        argv = [*prefix, str(VENV_BIN / command), *args]
        log_path = tmp_path / f"{command}-{len(procs)}.log"
        proc = start_proc(command, argv, log_path, env=environment(env or {}), url=ready or "")
        procs.append(proc)
        if ready is not None:
            wait_http(ready, proc, status=ready_status)
        return proc

    yield start
    for proc in reversed(procs):
        proc.stop()


@pytest.fixture(scope="session")
def mlserver_models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The scikit-learn models of models/mlserver/train.py, trained once per test process."""
    return trained_models(tmp_path_factory.mktemp("mlserver-models"))


@pytest.fixture(scope="session")
def mlserver(mlserver_models: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[MLServer]:
    """A real MLServer serving the trained models, its adaptive batching off (one per process)."""
    with serve_mlserver(mlserver_models, tmp_path_factory.mktemp("mlserver")) as server:
        yield server


@pytest.fixture(scope="session")
def mlserver_batching(
    mlserver_models: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[MLServer]:
    """A real MLServer serving the trained models with its adaptive batching on (32 rows, 5 ms)."""
    workdir = tmp_path_factory.mktemp("mlserver-batching")
    with serve_mlserver(mlserver_models, workdir, AdaptiveBatching()) as server:
        yield server


@pytest.fixture(scope="session")
def kserve(mlserver_models: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[KServe]:
    """KServe's own model server serving the trained digits model as ``digits`` (one per
    process)."""
    with kserve_server(mlserver_models, tmp_path_factory.mktemp("kserve")) as server:
        yield server


@pytest.fixture
def open_client() -> Iterator[OpenClient]:
    """``open_client(url)``: an official Triton HTTP client of ``url`` (host:port), closed in
    the test's thread when the test ends."""
    with clients() as open_one:
        yield open_one
