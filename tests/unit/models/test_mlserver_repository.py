"""The repository MLServer starts from: its free ports, the trained models by absolute path, and
its adaptive batching on or off; and the make target named when its virtualenv is missing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from modelroll_devcluster.controlplane import MissingBinaryError
from modelroll_devcluster.mlserver import MODELS, AdaptiveBatching, MLServer, venv_bin


@pytest.fixture
def trained(tmp_path: Path) -> Path:
    """A repository as train.py writes it (settings only; MLServer is not started)."""
    for model in MODELS:
        (tmp_path / "trained" / model).mkdir(parents=True)
        settings = {"name": model, "parameters": {"uri": "./model.joblib", "version": "v1"}}
        (tmp_path / "trained" / model / "model-settings.json").write_text(json.dumps(settings))
    return tmp_path / "trained"


def written(server: MLServer, model: str) -> dict[str, object]:
    repository = server.write_repository()
    settings: dict[str, object] = json.loads(
        (repository / model / "model-settings.json").read_text()
    )
    return settings


def test_servers_listen_on_loopback_on_three_distinct_ports(trained: Path, tmp_path: Path) -> None:
    repository = MLServer(trained, tmp_path / "a").write_repository()
    settings = json.loads((repository / "settings.json").read_text())
    assert settings["host"] == "127.0.0.1"
    ports = [settings[name] for name in ("http_port", "grpc_port", "metrics_port")]
    assert len(set(ports)) == 3
    assert MLServer(trained, tmp_path / "a", ports=dict(settings)).url.endswith(f":{ports[0]}")


def test_each_model_loads_its_trained_file_by_absolute_path(trained: Path, tmp_path: Path) -> None:
    settings = written(MLServer(trained, tmp_path / "a"), "digits")
    assert settings["parameters"] == {
        "uri": str((trained / "digits" / "model.joblib").resolve()),
        "version": "v1",
    }


def test_adaptive_batching_is_off_unless_asked(trained: Path, tmp_path: Path) -> None:
    off = written(MLServer(trained, tmp_path / "off"), "sentiment")
    on = written(MLServer(trained, tmp_path / "on", AdaptiveBatching(8, 0.01)), "sentiment")
    assert (off["max_batch_size"], off["max_batch_time"]) == (0, 0.0)
    assert (on["max_batch_size"], on["max_batch_time"]) == (8, 0.01)


def test_a_missing_virtualenv_names_the_make_target(tmp_path: Path) -> None:
    with pytest.raises(MissingBinaryError, match="`make mlserver`"):
        venv_bin(tmp_path)
