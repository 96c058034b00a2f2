"""The whole modelroll stack as processes on loopback: one implementation for the e2e suite and
``make demo``.

The local control plane (or a cluster the caller already has), the ModelVersion CRD, and in one
namespace: per version a model server (a demo model by default, the real sentence encoder,
``modelroll-encoder``, or MLServer, one process for every Open Inference Protocol version) behind
its own batching sidecar, the operator serving that namespace, the gateway watching its
``modelroll-routes`` ConfigMap (its admin port apart, and trusting the pins of clients on
127.0.0.1, where the demo's and the tests' requests come from), and Prometheus scraping the
sidecars and the gateway's admin port every second. Versions run in external mode:
each ModelVersion's ``spec.endpoint`` is its sidecar's URL, and the operator creates no workload
for it.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Self

import yaml

from modelroll_common.settings import BY_ATTR, PROTOCOL

from .cluster import Cluster
from .controlplane import (
    BINARIES,
    ControlPlane,
    MissingBinaryError,
    default_bin_dir,
    find_binaries,
    repo_root,
)
from .llama import LlamaServer
from .mlserver import MLServer, train
from .processes import ClusterError, Component, free_port, tail
from .progress import Progress
from .prometheus import Prometheus, PrometheusAPI, static_job

MODEL = "sentiment"
API_VERSION = "modelroll.io/v1alpha1"
CRD_NAME = "modelversions.modelroll.io"
CONFIGMAP = "modelroll-routes"
LOOPBACK = "http://127.0.0.1"
"""Where the stack's gateway and Prometheus listen (any port): the operator's
--analysis-url-prefix, so that analyses may read them."""
#: Seconds a process of the stack may take to answer its readiness URL.
READY_TIMEOUT = 60.0

CRD_PROTOCOLS = dict(zip(PROTOCOL.words, PROTOCOL.values, strict=True))
"""spec.protocol's word for each of the sidecar's --protocol values."""

PrometheusMode = Literal["required", "optional", "off"]
Protocol = Literal["batch", "openai", "openinference"]
Engine = Literal["demo", "llama", "encoder", "mlserver"]
Variant = Literal["int8", "fp32"]


@dataclass(frozen=True)
class VersionSpec:
    """One version of the model: its weight, and how its demo model and sidecar behave."""

    name: str
    weight: int
    error_rate: float = 0.0
    """Share of items the demo model fails (each answered 422 by the sidecar)."""
    batch_error_rate: float = 0.0
    """Share of batches the demo model fails whole (a 500: the sidecar answers each request 502)."""
    fixed_ms: float = 5.0
    per_token_ms: float = 0.05
    max_batch_size: int = BY_ATTR["max_batch_size"].default
    max_wait_ms: int = BY_ATTR["max_wait_ms"].default
    protocol: Protocol = "batch"
    """``openai``: a chat LLM version, ``modelroll-demo-llm`` behind a ``--protocol openai``
    sidecar (spec.protocol OpenAI); its model is :attr:`model`, or the stack's. ``openinference``:
    engine ``mlserver`` behind a ``--protocol openinference`` sidecar (spec.protocol
    OpenInference)."""
    model: str | None = None
    """The model this version serves (None: the stack's)."""
    step_ms: float = 8.0
    """``openai``: the demo engine's fixed cost of a decode iteration (its TTFT follows it)."""
    max_in_flight: int | None = None
    """``openai``: the sidecar's ``--max-in-flight`` (None: its default)."""
    engine_args: tuple[str, ...] = ()
    """More flags for the model server (``modelroll-demo-model``, ``modelroll-encoder``,
    ``modelroll-demo-llm`` or ``llama-server``)."""
    sidecar_args: tuple[str, ...] = ()
    """More flags for the version's sidecar (``--max-body-bytes=128``)."""
    engine: Engine = "demo"
    """The model server behind the sidecar. ``batch``: ``demo`` is ``modelroll-demo-model``;
    ``encoder`` is ``modelroll-encoder`` (models/: all-MiniLM-L6-v2 sentence vectors, in
    :attr:`variant`, one intra-op thread), which answers strings only and ignores the demo model's
    costs and error rates. ``openai``: ``demo`` is ``modelroll-demo-llm``; ``llama`` is llama.cpp's
    ``llama-server`` with SmolLM2-135M-Instruct (modelroll_devcluster.llama; built by ``make
    llama-server llm-model``), which ignores the demo engine's settings. ``openinference``:
    ``mlserver`` is MLServer serving the scikit-learn models of models/mlserver/train.py
    (modelroll_devcluster.mlserver; ``make mlserver``), trained when the stack starts, the
    version's model being one of them (``digits``); one MLServer serves every such version, and
    ignores the demo model's settings."""
    variant: Variant = "int8"
    """``encoder``: ``int8``, the int8 ONNX export on onnxruntime; ``fp32``, the fp32 weights in
    numpy (``--variant``)."""
    slots: int = 1
    """``llama``: sequences the engine generates at once (``-np``)."""
    context: int = 2048
    """``llama``: the engine's context in tokens, shared by its slots (``-c``)."""

    def __post_init__(self) -> None:
        if self.engine == "llama" and self.protocol != "openai":
            raise ValueError(f"{self.name}: engine llama serves protocol openai only")
        if self.engine == "encoder" and self.protocol != "batch":
            raise ValueError(f"{self.name}: engine encoder serves protocol batch only")
        if (self.engine == "mlserver") != (self.protocol == "openinference"):
            raise ValueError(f"{self.name}: protocol openinference is engine mlserver's only")

    def describe(self) -> str:
        """What serves this version, as the stack's progress lines say it."""
        if self.engine == "llama":
            return "llama-server with SmolLM2-135M-Instruct"
        if self.engine == "encoder":
            build = {"int8": "int8 ONNX on onnxruntime", "fp32": "fp32 in numpy"}[self.variant]
            return f"all-MiniLM-L6-v2 {build} (modelroll-encoder)"
        if self.engine == "mlserver":
            return "MLServer's scikit-learn model"
        return f"a demo model failing {self.error_rate:.0%} of items"


#: The rollout of the story on stand-ins: stable-v1 and canary-v2 at 9:1, each a demo model, the
#: canary failing 20% of items.
ROLLOUT = (VersionSpec("stable-v1", 9), VersionSpec("canary-v2", 1, error_rate=0.2))

#: A limit in bytes set as if it were in KiB: ``--max-body-bytes=128`` for 128 KiB.
MISCONFIGURED_MAX_BODY_BYTES = 128

#: The rollout of ``make demo``, on the real sentence encoder: stable-v1 is the int8 build;
#: canary-v2 the fp32 build, its sidecar misconfigured with a request body limit of 128 bytes, so
#: that it refuses every longer sentence with 413.
ENCODER_ROLLOUT = (
    VersionSpec("stable-v1", 9, engine="encoder", variant="int8"),
    VersionSpec(
        "canary-v2",
        1,
        engine="encoder",
        variant="fp32",
        sidecar_args=(f"--max-body-bytes={MISCONFIGURED_MAX_BODY_BYTES}",),
    ),
)


class StackError(ClusterError):
    """A process of the stack did not start or answer; the message has the tail of its log."""


@dataclass
class Version:
    """A running version: its spec, its model server and its sidecar."""

    spec: VersionSpec
    model: Component
    model_url: str
    sidecar: Component
    sidecar_url: str


def venv_script(name: str) -> str:
    """A console script installed next to the running interpreter (the checkout's .venv)."""
    candidate = Path(sys.executable).parent / name
    return str(candidate) if candidate.exists() else name


def ensure_cluster_bins(progress: Progress, bin_dir: Path | None = None) -> Path:
    """The control-plane binaries' directory, building them (and Prometheus) with ``make
    cluster-bins prometheus`` first when they are missing (the first build compiles Kubernetes
    and Prometheus: several minutes)."""
    bin_dir = bin_dir or default_bin_dir()
    try:
        find_binaries(bin_dir, (*BINARIES, "prometheus"))
    except MissingBinaryError:
        root = repo_root()
        if root is None or not (root / "Makefile").is_file():
            raise
        progress.say(
            "The local control plane is not built yet: compiling kube-apiserver, "
            "kube-controller-manager, kubectl, etcd and Prometheus from Go modules (first run "
            "only; several minutes, more on 2 cores)."
        )
        progress.run(
            "Building the control plane and Prometheus (make cluster-bins prometheus)",
            ["make", "--no-print-directory", "cluster-bins", "prometheus"],
            cwd=root,
            # go prints each package it compiles: the progress count.
            env={"GOFLAGS": f"{os.environ.get('GOFLAGS', '')} -v".strip()},
            unit="packages compiled",
        )
        find_binaries(bin_dir)
    return bin_dir


class Stack:
    """Start with :meth:`start` (or ``with``), stop with :meth:`stop`: every process it started
    is stopped, the namespace it created is deleted, the control plane it started is stopped."""

    def __init__(
        self,
        run_dir: Path,
        *,
        cluster: Cluster | None = None,
        namespace: str | None = None,
        model: str = MODEL,
        versions: Sequence[VersionSpec] = ROLLOUT,
        prometheus: PrometheusMode = "required",
        progress: Progress | None = None,
        bin_dir: Path | None = None,
    ) -> None:
        self.run_dir = run_dir.resolve()
        self.log_dir = self.run_dir / "logs"
        self.given_cluster = cluster
        self.cluster: Cluster | None = cluster
        self.plane: ControlPlane | None = None
        self.namespace = namespace or "modelroll-demo"
        self._own_namespace = namespace is None
        self.model = model
        self.specs = list(versions)
        self.prometheus_mode = prometheus
        self.progress = progress or Progress(None)
        self.bin_dir = bin_dir
        self.versions: dict[str, Version] = {}
        self.operator: Component | None = None
        self.operator_liveness = ""
        self.gateway: Component | None = None
        self.gateway_url = ""
        self.gateway_admin_url = ""
        """The gateway's admin port: GET /metrics and GET /v1/routes."""
        self.prometheus: Prometheus | None = None
        self.mlserver: MLServer | None = None
        """The MLServer of the Open Inference Protocol versions, once one has started."""
        self._components: list[Component] = []

    # -- start and stop -----------------------------------------------------------------------

    def start(self) -> Self:
        """Bring everything up, in dependency order; on failure stop what did start."""
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        step = self.progress.step
        if self.cluster is None:
            bin_dir = ensure_cluster_bins(self.progress, self.bin_dir)
            with step("Starting the local control plane (etcd, kube-apiserver, controllers)"):
                self.plane = ControlPlane(self.run_dir / "cluster", bin_dir).start()
                self.cluster = Cluster.local(self.plane)
        with step("Installing the ModelVersion CRD"):
            self.install_crd()
            if self._own_namespace:
                self.cluster.create_namespace(self.namespace)
        for spec in self.specs:
            sidecar = "its own sidecar"
            if spec.sidecar_args:
                sidecar += f" ({' '.join(spec.sidecar_args)})"
            with step(f"Starting {spec.name}: {spec.describe()}, behind {sidecar}"):
                self.versions[spec.name] = self._start_version(spec)
        with step(f"Starting the operator (namespace {self.namespace})"):
            self.start_operator()
        with step(f"Starting the gateway (watching ConfigMap {self.namespace}/{CONFIGMAP})"):
            self._start_gateway()
        if self.prometheus_mode != "off":
            self._start_prometheus()

    def stop(self) -> None:
        """Stop everything this stack started, in reverse order. Safe to call twice."""
        if self.cluster is not None and self.plane is None:
            with contextlib.suppress(ClusterError, subprocess.SubprocessError):
                self._delete_versions(self.cluster)
        if self.prometheus is not None:
            self.prometheus.stop()
        for component in reversed(self._components):
            component.stop()
        if self.mlserver is not None:
            self.mlserver.stop()  # and whatever is left of its inference workers
        if self.plane is not None:
            self.plane.stop()  # the namespace goes with the control plane
        elif self.cluster is not None and self._own_namespace:
            with contextlib.suppress(ClusterError, subprocess.SubprocessError):
                self.cluster.delete_namespace(self.namespace)

    def _delete_versions(self, cluster: Cluster) -> None:
        """Leave no ModelVersion behind in a cluster that outlives the stack. Deleted while the
        operator runs, our finalizer goes as it should; without it (killed and not restarted),
        the finalizer is removed by hand so that the namespace can still be deleted."""
        if self.operator is not None and self.operator.running():
            cluster.kubectl(
                "delete",
                "modelversions",
                "--all",
                "--timeout=20s",
                namespace=self.namespace,
                check=False,
                timeout=30,
            )
        leftover = cluster.kubectl(
            "get", "modelversions", "-o", "name", namespace=self.namespace, check=False
        ).stdout.split()
        for name in leftover:
            cluster.kubectl(
                "patch",
                name,
                "--type=merge",
                "-p",
                '{"metadata":{"finalizers":null}}',
                namespace=self.namespace,
                check=False,
            )
            cluster.kubectl("delete", name, "--wait=false", namespace=self.namespace, check=False)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- the pieces ---------------------------------------------------------------------------

    def install_crd(self) -> None:
        """Apply crds/modelversion.yaml and wait until ModelVersions can be listed."""
        cluster = self._cluster()
        root = repo_root()
        if root is None:
            raise StackError("crds/modelversion.yaml not found: run from a modelroll checkout")
        crd = root / "crds" / "modelversion.yaml"
        cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(crd))
        cluster.wait_established(CRD_NAME)
        # Right after Established the API server may answer 429 for a moment.
        deadline = time.monotonic() + 30
        while cluster.kubectl("get", "modelversions", "-A", check=False).returncode != 0:
            if time.monotonic() > deadline:
                raise StackError("ModelVersions could not be listed 30 s after the CRD")
            time.sleep(0.2)

    def _spawn(self, name: str, argv: list[str], ready_url: str) -> Component:
        component = Component(name, argv, self.log_dir / f"{name}.log")
        component.start(die_with_parent=True)
        self._components.append(component)
        component.wait_ready(ready_url, READY_TIMEOUT, error=StackError)
        return component

    def model_of(self, spec: VersionSpec) -> str:
        return spec.model or self.model

    def _start_version(self, spec: VersionSpec) -> Version:
        model_port, sidecar_port = free_port(), free_port()
        model_url = f"http://127.0.0.1:{model_port}"
        sidecar_url = f"http://127.0.0.1:{sidecar_port}"
        model_name = self.model_of(spec)
        if spec.engine == "llama":
            model = self._start_llama(spec, model_port)
        elif spec.engine == "mlserver":
            model, model_url = self._start_mlserver()
        else:
            argv = self._model_argv(spec, model_port)
            model = self._spawn(f"model-{spec.name}", argv, f"{model_url}/readyz")
        flags = [f"--max-batch-size={spec.max_batch_size}", f"--max-wait-ms={spec.max_wait_ms}"]
        if spec.protocol != "batch":
            flags.append(f"--protocol={spec.protocol}")
        if spec.protocol == "openai" and spec.max_in_flight is not None:
            flags.append(f"--max-in-flight={spec.max_in_flight}")
        sidecar = self._spawn(
            f"sidecar-{spec.name}",
            [
                venv_script("modelroll-sidecar"),
                "--host=127.0.0.1",
                f"--port={sidecar_port}",
                f"--upstream={model_url}",
                f"--model={model_name}",
                f"--version={spec.name}",
                *flags,
                *spec.sidecar_args,
            ],
            f"{sidecar_url}/readyz",
        )
        return Version(spec, model, model_url, sidecar, sidecar_url)

    def _model_argv(self, spec: VersionSpec, port: int) -> list[str]:
        """The command line of the version's model server (a demo one, or the encoder)."""
        model_name = self.model_of(spec)
        if spec.engine == "encoder":
            return [
                venv_script("modelroll-encoder"),
                "--host=127.0.0.1",
                f"--port={port}",
                f"--variant={spec.variant}",
                "--intra-op-threads=1",
                *spec.engine_args,
            ]
        if spec.protocol == "openai":
            server = [
                venv_script("modelroll-demo-llm"),
                f"--served-model-name={model_name}",
                f"--step-ms={spec.step_ms}",
                *spec.engine_args,
            ]
        else:
            server = [
                venv_script("modelroll-demo-model"),
                f"--fixed-ms={spec.fixed_ms}",
                f"--per-token-ms={spec.per_token_ms}",
                f"--batch-error-rate={spec.batch_error_rate}",
                *spec.engine_args,
            ]
        flags = [f"--port={port}", f"--error-rate={spec.error_rate}", "--seed=7"]
        return [*server, "--host=127.0.0.1", *flags]

    def _start_llama(self, spec: VersionSpec, port: int) -> Component:
        """The version's llama-server (it waits for /health), stopped with the stack like every
        other process."""
        server = LlamaServer(
            self.model_of(spec),
            self.log_dir / f"model-{spec.name}.log",
            slots=spec.slots,
            context=spec.context,
            extra_args=spec.engine_args,
            bin_dir=self.bin_dir,
            name=f"model-{spec.name}",
            port=port,
        )
        component = server.start(READY_TIMEOUT)
        self._components.append(component)
        return component

    def _start_mlserver(self) -> tuple[Component, str]:
        """The stack's MLServer and its URL (started, its models trained first, on the first
        call; stopped with the stack)."""
        if self.mlserver is None:
            workdir = self.run_dir / "mlserver"
            self.mlserver = MLServer(train(workdir / "models"), workdir, name="model-mlserver")
            self._components.append(self.mlserver.start(READY_TIMEOUT))
        assert self.mlserver.component is not None
        return self.mlserver.component, self.mlserver.url

    def start_operator(self) -> Component:
        """Start (or start again) ``modelroll-operator`` for the namespace; wait for liveness."""
        if self.operator is not None and self.operator.running():
            raise StackError("the operator is already running")
        liveness = f"http://127.0.0.1:{free_port()}/healthz"
        argv = [
            venv_script("modelroll-operator"),
            f"--namespace={self.namespace}",
            f"--kubeconfig={self._cluster().kubeconfig}",
            f"--liveness={liveness}",
            "--metrics-port=0",
            "--log-format=full",
            # Everything here listens on loopback, outside any Service: the analyses read
            # the gateway and Prometheus there.
            f"--analysis-url-prefix={LOOPBACK}",
        ]
        if self.operator is not None:  # a restart: same log file, new process
            self._components.remove(self.operator)
        self.operator = self._spawn("operator", argv, liveness)
        self.operator_liveness = liveness
        return self.operator

    def kill_operator(self) -> None:
        """SIGKILL the operator, as a crash or an evicted pod would end it: no cleanup."""
        if self.operator is None or self.operator.process is None:
            raise StackError("the operator is not running")
        self.operator.process.send_signal(signal.SIGKILL)
        self.operator.process.wait(10)
        self.operator.stop()  # reaps it and closes its log

    def _start_gateway(self) -> None:
        port, admin_port = free_port(), free_port()
        self.gateway_url = f"http://127.0.0.1:{port}"
        self.gateway_admin_url = f"http://127.0.0.1:{admin_port}"
        self.gateway = self._spawn(
            "gateway",
            [
                venv_script("modelroll-gateway"),
                "--host=127.0.0.1",
                f"--port={port}",
                f"--admin-port={admin_port}",
                # Everything on this machine may pin: the demo's curl lines and the tests do.
                "--trusted-networks=127.0.0.1/32",
                f"--namespace={self.namespace}",
                f"--configmap={CONFIGMAP}",
                f"--kubeconfig={self._cluster().kubeconfig}",
            ],
            f"{self.gateway_url}/readyz",
        )

    def _start_prometheus(self) -> None:
        sidecars = [v.sidecar_url.removeprefix("http://") for v in self.versions.values()]
        gateway = self.gateway_admin_url.removeprefix("http://")
        server = Prometheus(
            self.run_dir / "prometheus",
            [
                static_job("modelroll-sidecars", sidecars, namespace=self.namespace),
                static_job("modelroll-gateway", [gateway], namespace=self.namespace),
            ],
        )
        try:
            with self.progress.step("Starting Prometheus (scraping the sidecars and gateway)"):
                self.prometheus = server.start()
        except MissingBinaryError as err:
            if self.prometheus_mode == "required":
                raise
            self.progress.say(f"    Prometheus is not running: {err}")

    # -- what callers do with it --------------------------------------------------------------

    def _cluster(self) -> Cluster:
        if self.cluster is None:
            raise StackError("the stack has not been started")
        return self.cluster

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 60.0
    ) -> subprocess.CompletedProcess[str]:
        """kubectl in the stack's namespace; raises KubectlError on failure if ``check``."""
        return self._cluster().kubectl(
            *args, namespace=self.namespace, input=input, check=check, timeout=timeout
        )

    def prometheus_api(self) -> PrometheusAPI:
        """The Prometheus scraping this stack; raises StackError when none runs."""
        if self.prometheus is None:
            raise StackError("Prometheus is not running in this stack")
        return self.prometheus

    def manifest(self, name: str, weight: int | None = None) -> dict[str, Any]:
        """The external-mode ModelVersion of a running version (its spec's weight by default)."""
        version = self.versions[name]
        spec: dict[str, Any] = {
            "model": self.model_of(version.spec),
            "weight": version.spec.weight if weight is None else weight,
            "endpoint": version.sidecar_url,
            "batching": {
                "maxBatchSize": version.spec.max_batch_size,
                "maxWaitMs": version.spec.max_wait_ms,
            },
        }
        if version.spec.protocol != "batch":
            spec["protocol"] = CRD_PROTOCOLS[version.spec.protocol]
        return {
            "apiVersion": API_VERSION,
            "kind": "ModelVersion",
            "metadata": {"name": name},
            "spec": spec,
        }

    def manifests_yaml(self) -> str:
        """Every version's ModelVersion as one multi-document YAML for ``kubectl apply -f -``."""
        return yaml.safe_dump_all([self.manifest(n) for n in self.versions], sort_keys=False)

    def plugin(self, *args: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
        """``kubectl modelroll <args>`` in the stack's namespace; raises on failure."""
        cluster = self._cluster()
        argv = [
            venv_script("kubectl-modelroll"),
            f"--kubeconfig={cluster.kubeconfig}",
            f"--namespace={self.namespace}",
            *args,
        ]
        result = subprocess.run(
            argv, capture_output=True, text=True, timeout=timeout, check=False, env=cluster.env
        )
        if result.returncode != 0:
            raise StackError(
                f"kubectl modelroll {' '.join(args)} exited {result.returncode}: "
                f"{result.stderr.strip()}"
            )
        return result

    def routes(self) -> dict[str, Any]:
        """The gateway's view of the routes (``GET /v1/routes``), by model."""
        doc = get_json(f"{self.gateway_admin_url}/v1/routes")
        return {m["model"]: m for m in doc["models"]}

    def configmap_data(self) -> dict[str, str]:
        """The routes ConfigMap's data ({} when it does not exist)."""
        result = self.kubectl("get", "configmap", CONFIGMAP, "-o", "json", check=False)
        if result.returncode != 0:
            return {}
        data: dict[str, str] = json.loads(result.stdout).get("data") or {}
        return data

    def log_tails(self) -> str:
        """The end of every process's log, for a failure message."""
        parts = [f"--- {c.name} ({c.log_path})\n{tail(c.log_path, 15)}" for c in self._components]
        return "\n".join(parts)


def get_json(url: str, timeout: float = 5.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as resp:  # noqa: S310 (loopback URL)
        return json.load(resp)
