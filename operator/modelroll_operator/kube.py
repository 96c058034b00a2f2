"""The API calls the operator and the plugin make beyond kopf's own: get, create, patch, apply.

They go through the official Kubernetes Python client, with the credentials kubectl would use
(kubeconfig contexts, client certificates, tokens, exec and auth-provider plugins, else the
in-cluster service account, whose rotated token the client re-reads). The client is
synchronous: the operator's calls run in worker threads (``asyncio.to_thread``) so that kopf's
event loop never waits on the network.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import urllib3
import yaml
from kubernetes import client as k8s
from kubernetes import config as k8s_config

from .spec import FIELD_MANAGER, GROUP, PLURAL, VERSION

__all__ = ["Api", "KubeApiError", "KubeConfigError", "connect", "mv_path"]

REQUEST_TIMEOUT = 30.0
SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
#: What a failed call raises besides KubeApiError: the API server could not be reached.
UNREACHABLE = (urllib3.exceptions.HTTPError, OSError)


class KubeConfigError(Exception):
    """No usable credentials: the message says which and why."""


class KubeApiError(Exception):
    """The API server answered with an error status."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message


def connect(
    kubeconfig: Path | None = None, context: str | None = None
) -> tuple[k8s.ApiClient, str]:
    """An API client with the credentials kubectl would use, and the namespace they point at:
    ``kubeconfig`` (else $KUBECONFIG, else ~/.kube/config) and ``context``, else the in-cluster
    service account."""
    configuration = k8s.Configuration()
    path = str(kubeconfig) if kubeconfig else None
    try:
        k8s_config.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=path, context=context, client_configuration=configuration
        )
    except k8s_config.ConfigException as exc:
        if kubeconfig is not None or context is not None or not SERVICE_ACCOUNT_NAMESPACE.exists():
            raise KubeConfigError(f"cannot use the kubeconfig: {exc}") from exc
        k8s_config.load_incluster_config(  # type: ignore[no-untyped-call]
            client_configuration=configuration
        )
        return k8s.ApiClient(configuration), SERVICE_ACCOUNT_NAMESPACE.read_text().strip()
    contexts, active = k8s_config.list_kube_config_contexts(  # type: ignore[no-untyped-call]
        config_file=path
    )
    chosen = next((c for c in contexts if c["name"] == context), active) if context else active
    settings = (chosen or {}).get("context", {})
    command = exec_command(path, settings.get("user"))
    if command and not configuration.api_key:
        # The client logs the plugin's own error (exit status, stderr) and carries on without.
        raise KubeConfigError(f"the kubeconfig's exec credential plugin {command!r} gave no token")
    return k8s.ApiClient(configuration), str(settings.get("namespace") or "default")


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


def mv_path(namespace: str | None, name: str | None = None, sub: str | None = None) -> str:
    """The REST path of ModelVersions (all namespaces when ``namespace`` is None)."""
    path = f"/apis/{GROUP}/{VERSION}"
    path += f"/namespaces/{namespace}/{PLURAL}" if namespace else f"/{PLURAL}"
    if name:
        path += f"/{name}"
    if sub:
        path += f"/{sub}"
    return path


def core_path(namespace: str, plural: str, name: str | None = None) -> str:
    return f"/api/v1/namespaces/{namespace}/{plural}" + (f"/{name}" if name else "")


def apps_path(namespace: str, plural: str, name: str | None = None) -> str:
    return f"/apis/apps/v1/namespaces/{namespace}/{plural}" + (f"/{name}" if name else "")


class Api:
    """Raw REST calls by path through the official client, each in a worker thread."""

    def __init__(self, client: k8s.ApiClient) -> None:
        self.client = client

    async def send(
        self,
        method: str,
        path: str,
        body: Mapping[str, Any] | None = None,
        *,
        content_type: str = "application/json",
        params: Mapping[str, str] | None = None,
    ) -> dict[str, Any]:
        """One request; a status >= 400 raises KubeApiError with the server's message."""
        return await asyncio.to_thread(self.call, method, path, body, content_type, params)

    def call(
        self,
        method: str,
        path: str,
        body: Mapping[str, Any] | None = None,
        content_type: str = "application/json",
        params: Mapping[str, str] | None = None,
    ) -> dict[str, Any]:
        """:meth:`send`, blocking (for the plugin, a command-line tool)."""
        headers = {"Accept": "application/json", "Content-Type": content_type}
        request = self.client.param_serialize(
            method,
            path,
            query_params=list((params or {}).items()),
            header_params=headers,
            body=dict(body) if body is not None else None,
            auth_settings=["BearerToken"],  # the token, exec plugin's or service account's
        )
        response = self.client.call_api(*request, _request_timeout=REQUEST_TIMEOUT)
        text: bytes = response.read()  # type: ignore[no-untyped-call]
        try:
            decoded = json.loads(text) if text else {}
        except ValueError:
            decoded = {"message": text[:500].decode(errors="replace")}
        if response.status >= 400:
            found = decoded if isinstance(decoded, dict) else {}
            raise KubeApiError(
                int(found.get("code") or response.status),
                str(found.get("reason") or response.reason or ""),
                str(found.get("message") or "no message"),
            )
        return decoded if isinstance(decoded, dict) else {}

    async def get_json(self, path: str) -> dict[str, Any]:
        return await self.send("GET", path)

    async def get(self, path: str) -> dict[str, Any] | None:
        """The object at ``path``, or None when it does not exist."""
        try:
            return await self.send("GET", path)
        except KubeApiError as exc:
            if exc.status == 404:
                return None
            raise

    async def create(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        return await self.send("POST", path, body, params={"fieldManager": FIELD_MANAGER})

    async def merge_patch(self, path: str, patch: Mapping[str, Any]) -> dict[str, Any]:
        return await self.send(
            "PATCH",
            path,
            patch,
            content_type="application/merge-patch+json",
            params={"fieldManager": FIELD_MANAGER},
        )

    async def apply(self, path: str, manifest: Mapping[str, Any]) -> dict[str, Any]:
        """Server-side apply as the operator's field manager (creates the object if missing)."""
        return await self.send(
            "PATCH",
            path,
            manifest,
            content_type="application/apply-patch+yaml",
            params={"fieldManager": FIELD_MANAGER, "force": "true"},
        )

    async def delete(self, path: str) -> bool:
        """Delete in the background (dependents are garbage-collected); False if already gone."""
        try:
            await self.send("DELETE", path, {"propagationPolicy": "Background"})
        except KubeApiError as exc:
            if exc.status == 404:
                return False
            raise
        return True

    async def post_event(
        self, involved: Mapping[str, Any], reason: str, message: str, kind: str = "Normal"
    ) -> None:
        """A core/v1 Event about ``involved`` (a body with apiVersion, kind and metadata)."""
        meta = involved["metadata"]
        now = datetime.now(UTC).isoformat()
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
            "involvedObject": {
                "apiVersion": involved["apiVersion"],
                "kind": involved["kind"],
                "name": meta["name"],
                "namespace": meta["namespace"],
                "uid": meta.get("uid"),
            },
            "reason": reason,
            "message": message[:1024],
            "type": kind,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "eventTime": now,
            "action": "Route",
            "source": {"component": FIELD_MANAGER},
            "reportingComponent": f"{GROUP}/operator",
            "reportingInstance": socket.gethostname()[:128],
        }
        await self.send("POST", core_path(meta["namespace"], "events"), event)
