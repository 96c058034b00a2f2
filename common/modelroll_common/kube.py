"""The API connection kubectl would make, through the official Kubernetes client.

Kubeconfig contexts, client certificates, tokens, exec and auth-provider plugins come from the
client's kubeconfig loader; without a kubeconfig, the in-cluster service account, whose token
file the client re-reads (at most a minute after the kubelet rotates it).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import NamedTuple

import yaml
from kubernetes import client as k8s
from kubernetes import config as k8s_config

__all__ = ["SERVICE_ACCOUNT_DIR", "Connection", "KubeConfigError", "connect", "exec_command"]

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
"""Where a pod's service-account token, CA and namespace are mounted."""
NO_CREDENTIALS = (
    "no credentials: pass --kubeconfig, set KUBECONFIG, or run in a pod with a service account"
)


class KubeConfigError(Exception):
    """No usable credentials: the message says which and why."""


class Connection(NamedTuple):
    client: k8s.ApiClient
    namespace: str
    """The namespace the credentials point at: the context's, else the service account's."""


def kubeconfig_files(kubeconfig: Path | None = None) -> list[Path]:
    """The kubeconfig files kubectl would read: ``kubeconfig``, else $KUBECONFIG's, else
    ~/.kube/config; only those that exist."""
    if kubeconfig is not None:
        return [kubeconfig]
    listed = os.environ.get("KUBECONFIG") or "~/.kube/config"
    found = (Path(item).expanduser() for item in listed.split(os.pathsep) if item)
    return [path for path in found if path.exists()]


def connect(
    kubeconfig: Path | None = None, context: str | None = None, *, retries: bool | None = None
) -> Connection:
    """A client with the credentials kubectl would use: ``kubeconfig`` (else $KUBECONFIG, else
    ~/.kube/config) and ``context``; without any kubeconfig file, the in-cluster service account.
    ``retries=False``: a failed connection raises at once (for callers with a backoff of their
    own), instead of urllib3's three immediate retries.
    """
    configuration = k8s.Configuration()
    configuration.retries = retries
    if not kubeconfig_files(kubeconfig) and context is None:
        try:
            k8s_config.load_incluster_config(  # type: ignore[no-untyped-call]
                client_configuration=configuration
            )
        except k8s_config.ConfigException as exc:
            raise KubeConfigError(f"{NO_CREDENTIALS} ({exc})") from exc
        namespace_file = SERVICE_ACCOUNT_DIR / "namespace"
        namespace = namespace_file.read_text().strip() if namespace_file.exists() else "default"
        return Connection(k8s.ApiClient(configuration), namespace)
    path = str(kubeconfig) if kubeconfig else None
    try:
        k8s_config.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=path, context=context, client_configuration=configuration
        )
    except k8s_config.ConfigException as exc:
        raise KubeConfigError(f"cannot use the kubeconfig: {exc}") from exc
    contexts, active = k8s_config.list_kube_config_contexts(  # type: ignore[no-untyped-call]
        config_file=path
    )
    chosen = next((c for c in contexts if c["name"] == context), active) if context else active
    settings = (chosen or {}).get("context", {})
    command = exec_command(path, settings.get("user"))
    if command and not configuration.api_key:
        # The client logs the plugin's own error (exit status, stderr) and carries on without.
        raise KubeConfigError(f"the kubeconfig's exec credential plugin {command!r} gave no token")
    return Connection(k8s.ApiClient(configuration), str(settings.get("namespace") or "default"))


def exec_command(path: str | None, user: str | None) -> str | None:
    """The command of ``user``'s exec credential plugin in the (first) kubeconfig file."""
    first = (path or os.environ.get("KUBECONFIG") or "~/.kube/config").split(os.pathsep)[0]
    try:
        doc = yaml.safe_load(Path(first).expanduser().read_text()) or {}
    except (OSError, yaml.YAMLError):
        return None
    for entry in doc.get("users") or []:
        if entry.get("name") == user and (plugin := (entry.get("user") or {}).get("exec")):
            return str(plugin.get("command"))
    return None
