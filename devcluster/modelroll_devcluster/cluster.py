"""A handle on a Kubernetes cluster for tests and scripts: its kubeconfig, kubectl, namespaces.

The cluster is either the local control plane this package started (:class:`ControlPlane`) or an
existing one named by a kubeconfig (``MODELROLL_KUBECONFIG``, e.g. a kind cluster).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from .controlplane import ControlPlane, MissingBinaryError, default_bin_dir
from .processes import ClusterError

if TYPE_CHECKING:
    from .node import Node

#: Seconds a namespace may take to be really gone after its deletion.
NAMESPACE_DELETE_TIMEOUT = 60.0


class KubectlError(ClusterError):
    """kubectl exited non-zero; the message carries its arguments and stderr."""

    def __init__(self, args: list[str], result: subprocess.CompletedProcess[str]) -> None:
        self.returncode = result.returncode
        self.stdout = result.stdout
        self.stderr = result.stderr
        super().__init__(
            f"kubectl {' '.join(args)} exited {result.returncode}: {result.stderr.strip()}"
        )


def namespace_name(hint: str) -> str:
    """A unique DNS-1123 namespace name that starts with a slug of ``hint``."""
    slug = re.sub(r"[^a-z0-9]+", "-", hint.lower()).strip("-")[:40].strip("-") or "test"
    return f"t-{slug}-{secrets.token_hex(3)}"


def find_kubectl(bin_dir: Path | None = None) -> Path:
    """``$MODELROLL_KUBECTL``, else kubectl in ``bin_dir`` (default .bin/), else on PATH."""
    if env := os.environ.get("MODELROLL_KUBECTL"):
        return Path(env)
    candidate = (bin_dir or default_bin_dir()) / "kubectl"
    if candidate.is_file():
        return candidate
    if on_path := shutil.which("kubectl"):
        return Path(on_path)
    raise MissingBinaryError(
        f"kubectl not found in {candidate.parent} nor on PATH: run `make cluster-bins`"
    )


@dataclass
class Cluster:
    """A reachable cluster.

    ``kubeconfig`` is an admin kubeconfig; ``server`` the API server URL; ``plane`` the local
    control plane behind it, or None when the cluster was given by ``MODELROLL_KUBECONFIG``;
    ``node`` the local node that runs its pods, if it has one.
    """

    kubeconfig: Path
    server: str
    kubectl_path: Path
    plane: ControlPlane | None = None
    node: Node | None = None

    @classmethod
    def local(cls, plane: ControlPlane, node: Node | None = None) -> Cluster:
        """The cluster served by a started :class:`ControlPlane` (and node)."""
        return cls(plane.kubeconfig, plane.server, find_kubectl(plane.bin_dir), plane, node)

    @classmethod
    def existing(cls, kubeconfig: Path, bin_dir: Path | None = None) -> Cluster:
        """A cluster named by the current context of ``kubeconfig``."""
        config: dict[str, Any] = yaml.safe_load(kubeconfig.read_text())
        context_name = config.get("current-context")
        contexts = {c["name"]: c["context"] for c in config.get("contexts", [])}
        clusters = {c["name"]: c["cluster"] for c in config.get("clusters", [])}
        try:
            server: str = clusters[contexts[context_name]["cluster"]]["server"]
        except KeyError as err:
            raise ClusterError(
                f"{kubeconfig}: no server for current context {context_name!r}"
            ) from err
        return cls(kubeconfig.resolve(), server, find_kubectl(bin_dir))

    @property
    def is_local(self) -> bool:
        """Whether this package runs the control plane (so it can, e.g., restart the API server)."""
        return self.plane is not None

    @property
    def env(self) -> dict[str, str]:
        """``os.environ`` plus ``KUBECONFIG`` for this cluster: pass it to subprocesses."""
        return {**os.environ, "KUBECONFIG": str(self.kubeconfig)}

    def kubectl(
        self,
        *args: str,
        namespace: str | None = None,
        input: str | None = None,
        check: bool = True,
        timeout: float = 60.0,
    ) -> subprocess.CompletedProcess[str]:
        """Run kubectl against this cluster; a failure raises :class:`KubectlError` if ``check``."""
        argv = [f"--kubeconfig={self.kubeconfig}"]
        if namespace:
            argv.append(f"--namespace={namespace}")
        argv.extend(args)
        # A command that waits (`kubectl wait --timeout=120s`) gets its own wait and then some.
        timeout = max(timeout, _wait_seconds(args) + 30)
        result = subprocess.run(
            [str(self.kubectl_path), *argv],
            input=input,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            env=self.env,
        )
        if check and result.returncode != 0:
            raise KubectlError(list(args), result)
        return result

    def kubectl_json(self, *args: str, namespace: str | None = None) -> Any:
        """``kubectl <args> -o json``, parsed."""
        return json.loads(self.kubectl(*args, "-o", "json", namespace=namespace).stdout)

    def apply(self, manifest: str | Mapping[str, Any], namespace: str | None = None) -> None:
        """``kubectl apply`` a YAML document (or a dict)."""
        text = manifest if isinstance(manifest, str) else yaml.safe_dump(dict(manifest))
        self.kubectl("apply", "-f", "-", namespace=namespace, input=text)

    def exists(self, *args: str, namespace: str | None = None) -> bool:
        """Whether ``kubectl get <args>`` finds the object (False on NotFound)."""
        result = self.kubectl("get", *args, "-o", "name", namespace=namespace, check=False)
        if result.returncode == 0:
            return True
        if "NotFound" in result.stderr or "not found" in result.stderr:
            return False
        raise KubectlError(["get", *args], result)

    def wait_gone(self, *args: str, namespace: str | None = None, timeout: float = 30.0) -> None:
        """Poll until ``kubectl get <args>`` reports NotFound; raise ClusterError on timeout."""
        deadline = time.monotonic() + timeout
        while self.exists(*args, namespace=namespace):
            if time.monotonic() > deadline:
                raise ClusterError(f"{' '.join(args)} still exists after {timeout:.0f}s")
            time.sleep(0.2)

    def wait_established(self, *crds: str, timeout: float = 60.0) -> None:
        """``kubectl wait --for=condition=Established`` on the named CRDs. Right after a CRD is
        created it has no conditions yet, and kubectl wait then fails at once (".status.conditions
        accessor error") rather than waiting: that is retried until ``timeout``."""
        deadline = time.monotonic() + timeout
        args = ["wait", "--for=condition=Established", f"--timeout={timeout:g}s"]
        args += [f"crd/{name}" for name in crds]
        while True:
            result = self.kubectl(*args, check=False, timeout=timeout + 30)
            if result.returncode == 0:
                return
            if "accessor error" not in result.stderr or time.monotonic() > deadline:
                raise KubectlError(args, result)
            time.sleep(0.2)

    def create_namespace(self, name: str) -> str:
        """Create namespace ``name`` (labelled ``modelroll.io/test=true``) and return its name."""
        self.apply(
            {
                "apiVersion": "v1",
                "kind": "Namespace",
                "metadata": {"name": name, "labels": {"modelroll.io/test": "true"}},
            }
        )
        return name

    def delete_namespace(self, name: str, timeout: float = NAMESPACE_DELETE_TIMEOUT) -> None:
        """Delete a namespace and wait until it is really gone, not just Terminating."""
        self.kubectl("delete", "namespace", name, "--wait=false", "--ignore-not-found")
        try:
            self.wait_gone("namespace", name, timeout=timeout)
        except ClusterError as err:
            status = self.kubectl("get", "namespace", name, "-o", "jsonpath={.status}", check=False)
            raise ClusterError(
                f"namespace {name} is still there {timeout:.0f}s after deletion "
                f"(is kube-controller-manager running?): {status.stdout or status.stderr}"
            ) from err

    def restart_apiserver(self) -> None:
        """Restart kube-apiserver over the same etcd (local control plane only)."""
        if self.plane is None:
            raise ClusterError("cannot restart the API server of a cluster given by a kubeconfig")
        self.plane.restart_apiserver()


def _wait_seconds(args: tuple[str, ...]) -> float:
    """The seconds a ``--timeout=<n>s`` or ``--timeout=<n>m`` among ``args`` asks for, else 0."""
    for arg in args:
        if arg.startswith("--timeout="):
            value = arg.removeprefix("--timeout=")
            scale = {"s": 1, "m": 60}.get(value[-1:], 0)
            with contextlib.suppress(ValueError):
                return float(value[:-1]) * scale
    return 0.0
