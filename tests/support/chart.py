"""The chart and what renders it: helm built by `make helm`, run with its cache, config and
data directories in a temporary folder (so the tests never read or write the user's helm
setup), and reading the rendered documents."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from modelroll_devcluster import default_bin_dir

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "modelroll"
EXAMPLES = REPO / "examples"
FULL_VALUES = EXAMPLES / "values-full.yaml"
MONITORING_CRDS = REPO / ".cache" / "monitoring-crds"
MONITORING_CRD_FILES = tuple(
    f"monitoring.coreos.com_{kind}.yaml"
    for kind in ("podmonitors", "servicemonitors", "prometheusrules")
)


Manifest = dict[str, Any]


@dataclass
class Helm:
    """helm from .bin/, with its own home directories."""

    path: Path
    env: dict[str, str]

    def run(
        self, *args: str, check: bool = True, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [str(self.path), *args],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
            env={**self.env, **(env or {})},
        )
        if check and result.returncode != 0:
            pytest.fail(
                f"helm {' '.join(args)} exited {result.returncode}:\n{result.stderr}{result.stdout}"
            )
        return result

    def template(
        self,
        *args: str,
        values: Sequence[Path] = (),
        release: str = "modelroll",
        namespace: str = "models",
    ) -> list[Manifest]:
        """`helm template` the chart; every rendered document, parsed."""
        argv = ["template", release, str(CHART), "--namespace", namespace]
        for path in values:
            argv += ["--values", str(path)]
        out = self.run(*argv, *args).stdout
        return [doc for doc in yaml.safe_load_all(out) if doc]


@pytest.fixture(scope="session")
def helm(tmp_path_factory: pytest.TempPathFactory, pytestconfig: pytest.Config) -> Helm:
    path = default_bin_dir(pytestconfig.rootpath) / "helm"
    if not (path.is_file() and os.access(path, os.X_OK)):
        pytest.fail(f"helm not found at {path}: build it with `make helm`", pytrace=False)
    home = tmp_path_factory.mktemp("helm-home")
    env = {
        **os.environ,
        "HELM_CACHE_HOME": str(home / "cache"),
        "HELM_CONFIG_HOME": str(home / "config"),
        "HELM_DATA_HOME": str(home / "data"),
    }
    return Helm(path, env)


def by_kind(docs: Sequence[Manifest], kind: str) -> list[Manifest]:
    return [d for d in docs if d["kind"] == kind]


def one(docs: Sequence[Manifest], kind: str, name_suffix: str = "") -> Manifest:
    """The single rendered object of `kind` whose name ends with `name_suffix`."""
    found = [d for d in by_kind(docs, kind) if d["metadata"]["name"].endswith(name_suffix)]
    assert len(found) == 1, f"expected one {kind} named *{name_suffix}, got {len(found)}"
    return found[0]


def commented_manifest(path: Path) -> Manifest:
    """The ModelVersion a file shows in its comments, not applied (examples/llm's vLLM version):
    the contiguous comment lines from `#   apiVersion:` on, each indented by `#   `."""
    lines = path.read_text().splitlines()
    start = lines.index("#   apiVersion: modelroll.io/v1alpha1")
    block = []
    for line in lines[start:]:
        if not line.startswith("#   "):
            break
        block.append(line[4:])
    doc: Manifest = yaml.safe_load("\n".join(block))
    return doc


def containers(docs: Sequence[Manifest]) -> Iterator[tuple[str, Manifest, Manifest]]:
    """(deployment name, pod spec, container) for every container the chart renders."""
    for deployment in by_kind(docs, "Deployment"):
        pod = deployment["spec"]["template"]["spec"]
        for container in pod["containers"]:
            yield deployment["metadata"]["name"], pod, container
