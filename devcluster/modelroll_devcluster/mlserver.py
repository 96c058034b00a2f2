"""MLServer (Seldon's Open Inference Protocol server) on loopback, serving the scikit-learn
models of ``models/mlserver/train.py``.

``make mlserver`` makes its virtualenv (``.venv-mlserver``, hack/mlserver.mk); :func:`train`
runs the training script with that virtualenv's python into a model repository. An
:class:`MLServer` serves a trained repository on free ports (HTTP, gRPC, metrics), with
MLServer's adaptive batching on or off, as a :class:`Component` like every other process of the
devcluster: started in its own session, stopped with SIGTERM, then SIGKILL.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .controlplane import MissingBinaryError, repo_root
from .processes import ClusterError, Component, free_port

VENV = ".venv-mlserver"
TRAIN_SCRIPT = Path("models") / "mlserver" / "train.py"
MODELS = ("digits", "sentiment")
"""The models train.py writes, each a folder of the repository named for the model."""
READY_TIMEOUT = 60.0
"""Seconds MLServer may take to start its workers, load every model and answer ready (about
five on an idle machine of two cores)."""
TRAIN_TIMEOUT = 120.0


class MLServerError(ClusterError):
    """MLServer or its training script did not run; the message has the tail of its output."""


def venv_bin(root: Path | None = None) -> Path:
    """The bin directory of MLServer's virtualenv; raises MissingBinaryError naming
    `make mlserver` when it has not been made."""
    checkout = root or repo_root() or Path.cwd()
    bin_dir = checkout / VENV / "bin"
    if not (bin_dir / "mlserver").is_file():
        raise MissingBinaryError(
            f"MLServer is not installed: missing {bin_dir / 'mlserver'}. "
            "Make its virtualenv with `make mlserver`."
        )
    return bin_dir


def train(out: Path, root: Path | None = None) -> Path:
    """Train every model into the repository ``out`` (train.py, with MLServer's python)."""
    checkout = root or repo_root() or Path.cwd()
    argv = [str(venv_bin(checkout) / "python"), str(checkout / TRAIN_SCRIPT), str(out)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=TRAIN_TIMEOUT, check=False)
    if done.returncode != 0:
        raise MLServerError(f"{TRAIN_SCRIPT} exited with {done.returncode}:\n{done.stderr}")
    return out


def samples(models: Path, model: str) -> dict[str, Any]:
    """A trained model's samples.json: ``inputs`` (rows of its input tensor) and ``predict``
    (the model's own predictions for them, computed by scikit-learn as it was trained)."""
    record: dict[str, Any] = json.loads((models / model / "samples.json").read_text())
    return record


@dataclass(frozen=True)
class AdaptiveBatching:
    """MLServer's own batching of a model's requests: up to ``max_batch_size`` rows, waiting at
    most ``max_batch_time`` seconds for them (its model-settings.json fields)."""

    max_batch_size: int = 32
    max_batch_time: float = 0.005


@dataclass
class MLServer:
    """One ``mlserver start`` serving the trained repository ``models`` on 127.0.0.1.

    Its own repository (settings.json on free ports, each model's model-settings.json pointing
    at the trained model.joblib, with ``batching`` or none) and its log are written under
    ``workdir``. ``parallel_workers``: MLServer's inference processes (its default is 1; 0 runs
    inference in the server's own process). Start with :meth:`start` (it returns once the server
    and every model answer ready), stop with :meth:`stop`.
    """

    models: Path
    workdir: Path
    batching: AdaptiveBatching | None = None
    parallel_workers: int = 1
    name: str = "mlserver"
    ports: dict[str, int] = field(default_factory=dict)
    component: Component | None = field(default=None, init=False)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.ports['http_port']}"

    @property
    def log_path(self) -> Path:
        return self.workdir / f"{self.name}.log"

    def write_repository(self) -> Path:
        """The repository MLServer starts from, under ``workdir``."""
        repository = self.workdir / "repository"
        repository.mkdir(parents=True, exist_ok=True)
        for port in ("http_port", "grpc_port", "metrics_port"):
            self.ports.setdefault(port, free_port())
        settings = {
            "host": "127.0.0.1",
            **self.ports,
            "parallel_workers": self.parallel_workers,
            "metrics_dir": str(self.workdir / "metrics"),
            "load_models_at_startup": True,
        }
        (repository / "settings.json").write_text(json.dumps(settings, indent=2))
        for model in MODELS:
            (repository / model).mkdir(exist_ok=True)
            model_settings = self.model_settings(model)
            (repository / model / "model-settings.json").write_text(json.dumps(model_settings))
        return repository

    def model_settings(self, model: str) -> dict[str, Any]:
        """The trained model's model-settings.json, its file by absolute path, and batching."""
        trained = self.models / model
        model_settings: dict[str, Any] = json.loads((trained / "model-settings.json").read_text())
        model_settings["parameters"]["uri"] = str((trained / "model.joblib").resolve())
        batching = self.batching or AdaptiveBatching(max_batch_size=0, max_batch_time=0.0)
        model_settings["max_batch_size"] = batching.max_batch_size
        model_settings["max_batch_time"] = batching.max_batch_time
        return model_settings

    def start(self, timeout: float = READY_TIMEOUT) -> Component:
        """Start the server and wait until it and every model are ready; on failure it is
        stopped."""
        argv = [str(venv_bin() / "mlserver"), "start", str(self.write_repository())]
        self.component = Component(self.name, argv, self.log_path)
        self.component.start(die_with_parent=True)
        try:
            for path in ("/v2/health/ready", *(f"/v2/models/{m}/ready" for m in MODELS)):
                self.component.wait_ready(self.url + path, timeout, error=MLServerError)
        except BaseException:
            self.stop()
            raise
        return self.component

    def stop(self) -> None:
        """SIGTERM, then SIGKILL; then SIGKILL to what is left of its process group (its
        inference workers, should it have died before stopping them). Safe to call twice."""
        if self.component is not None and self.component.pid is not None:
            self.component.stop()
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.component.pid, signal.SIGKILL)
