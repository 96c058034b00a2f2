"""Credentials as users' machines and pods hand them to a process, against the test cluster.

- ``exec_kubeconfig`` + ``credential_plugin``: a kubeconfig whose user is an exec credential
  plugin, as EKS (``aws eks get-token``), GKE, AKS and OIDC setups write them.
- ``PodIdentity``: what the kubelet gives a pod: the service account's token, CA and namespace
  under /var/run/secrets/kubernetes.io/serviceaccount, KUBERNETES_SERVICE_HOST/PORT, and no
  kubeconfig. The process runs in a private mount namespace (``unshare``) whose own tmpfs on
  /run holds just that directory, a symlink to the test's files (the kubelet's layout is
  symlinks too), so the host's /run is untouched and the test can rotate the token.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import yaml

from modelroll_common.kube import SERVICE_ACCOUNT_DIR
from modelroll_devcluster import Cluster

if TYPE_CHECKING:
    from modelroll_devcluster import Cluster


def exec_kubeconfig(cluster: Cluster, path: Path, plugin: Path) -> Path:
    """A kubeconfig for the cluster whose user is the exec credential plugin ``plugin``."""
    admin = yaml.safe_load(cluster.kubeconfig.read_text())
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": admin["clusters"],
        "users": [
            {
                "name": "exec-user",
                "user": {
                    "exec": {
                        "apiVersion": "client.authentication.k8s.io/v1",
                        "command": str(plugin),
                        "interactiveMode": "Never",
                    }
                },
            }
        ],
        "contexts": [
            {
                "name": "exec",
                "context": {"cluster": admin["clusters"][0]["name"], "user": "exec-user"},
            }
        ],
        "current-context": "exec",
    }
    path.write_text(yaml.safe_dump(config))
    return path


def credential_plugin(path: Path, token: str | None) -> Path:
    """An exec credential plugin: prints an ExecCredential with ``token``, or fails."""
    credential = {
        "apiVersion": "client.authentication.k8s.io/v1",
        "kind": "ExecCredential",
        "status": {"token": token},
    }
    body = (
        f"import json; print(json.dumps({credential!r}))"
        if token
        else "import sys; sys.exit('no credentials for you')"
    )
    path.write_text(f"#!{sys.executable}\n{body}\n")
    path.chmod(0o755)
    return path


@contextlib.contextmanager
def cluster_admin(cluster: Cluster, namespace: str) -> Iterator[str]:
    """A ServiceAccount in ``namespace`` bound to cluster-admin while the block runs: its name."""
    account = f"{namespace}-admin"
    cluster.kubectl("create", "serviceaccount", account, namespace=namespace)
    cluster.kubectl(
        "create",
        "clusterrolebinding",
        account,
        "--clusterrole=cluster-admin",
        f"--serviceaccount={namespace}:{account}",
    )
    try:
        yield account
    finally:
        cluster.kubectl("delete", "clusterrolebinding", account, check=False)


def cluster_ca(cluster: Cluster) -> bytes:
    """The PEM bundle that verifies the API server's certificate."""
    entry = cluster.kubectl_json("config", "view", "--raw", "--minify")["clusters"][0]["cluster"]
    if data := entry.get("certificate-authority-data"):
        return base64.b64decode(data)
    return Path(entry["certificate-authority"]).read_bytes()


def service_account_token(cluster: Cluster, namespace: str, account: str, bound_to: str) -> str:
    """A token of ``account`` that dies with the Secret ``bound_to`` (created here), so a test
    can revoke it at once, as deleting a pod revokes the token projected into it."""
    cluster.kubectl("create", "secret", "generic", bound_to, namespace=namespace)
    return cluster.kubectl(
        "create",
        "token",
        account,
        "--duration=1h",
        "--bound-object-kind=Secret",
        f"--bound-object-name={bound_to}",
        namespace=namespace,
    ).stdout.strip()


def token_accepted(cluster: Cluster, token: str) -> bool:
    """Whether the API server accepts ``token`` right now."""
    result = subprocess.run(
        [
            str(cluster.kubectl_path),
            "--kubeconfig=/dev/null",
            f"--server={cluster.server}",
            "--insecure-skip-tls-verify",
            f"--token={token}",
            "auth",
            "whoami",
        ],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    return result.returncode == 0


@dataclass
class PodIdentity:
    """The files and environment of a pod running as a service account (see the module doc)."""

    directory: Path
    """token, ca.crt and namespace: the pod's /var/run/secrets/kubernetes.io/serviceaccount."""
    server: str

    @classmethod
    def create(cls, cluster: Cluster, directory: Path, namespace: str, token: str) -> PodIdentity:
        directory.mkdir(parents=True)
        (directory / "ca.crt").write_bytes(cluster_ca(cluster))
        (directory / "namespace").write_text(namespace)
        identity = cls(directory, cluster.server)
        identity.write_token(token)
        return identity

    def write_token(self, token: str) -> None:
        """Replace the token file in one step, as the kubelet does when it rotates a token."""
        staged = self.directory / ".token.new"
        staged.write_text(token)
        os.replace(staged, self.directory / "token")

    def env(self, home: Path) -> dict[str, str | None]:
        """The environment a pod gets: the API server's address, no kubeconfig to find."""
        url = urlsplit(self.server)
        return {
            "KUBERNETES_SERVICE_HOST": url.hostname or "",
            "KUBERNETES_SERVICE_PORT": str(url.port or 443),
            "KUBECONFIG": None,
            "MODELROLL_KUBECONFIG": None,
            "HOME": str(home),
        }

    def prefix(self) -> list[str]:
        """The command that runs the rest of the command line with the directory mounted."""
        script = (
            "set -e; mount -t tmpfs -o size=1m,mode=0755 pod-run /run; "
            f'mkdir -p {SERVICE_ACCOUNT_DIR.parent}; ln -s "$0" {SERVICE_ACCOUNT_DIR}; exec "$@"'
        )
        namespaces = ["--mount", "--propagation=private"]
        if os.geteuid() != 0:
            namespaces = ["--user", "--map-root-user", *namespaces]
        return ["unshare", *namespaces, "--", "sh", "-c", script, str(self.directory)]


def service_account_kubeconfig(cluster: Cluster, namespace: str, account: str, path: Path) -> Path:
    """A kubeconfig that authenticates as a service account, with a token the API server made."""
    token = cluster.kubectl("create", "token", account, namespace=namespace).stdout.strip()
    raw = cluster.kubectl_json("config", "view", "--raw", "--minify")
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "sa",
        "contexts": [{"name": "sa", "context": {"cluster": "c", "user": "sa"}}],
        "clusters": [{"name": "c", "cluster": raw["clusters"][0]["cluster"]}],
        "users": [{"name": "sa", "user": {"token": token}}],
    }
    path.write_text(json.dumps(config))
    return path
