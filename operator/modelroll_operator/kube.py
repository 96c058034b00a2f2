"""The API calls the operator and the plugin make beyond kopf's own: get, create, patch, apply.

Credentials come from the gateway's loader (kubeconfig or in-cluster service account), so every
modelroll component authenticates the same way. Errors are the gateway's ``KubeApiError``.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp

from modelroll_gateway.kubeapi import (
    KubeApiError,
    KubeClient,
    KubeConnection,
    load_connection,
    load_kubeconfig,
)

from .spec import FIELD_MANAGER, GROUP, PLURAL, VERSION

__all__ = ["Api", "KubeApiError", "connect", "mv_path"]

REQUEST_TIMEOUT = 30.0


def connect(kubeconfig: Path | None = None) -> KubeConnection:
    """--kubeconfig, else $KUBECONFIG, else ~/.kube/config, else the in-cluster service account."""
    if kubeconfig is None and not os.environ.get("KUBECONFIG"):
        default = Path.home() / ".kube" / "config"
        if default.exists():
            return load_kubeconfig(default)
    return load_connection(kubeconfig)


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


class Api(KubeClient):
    """The gateway's list/watch client plus writes. The caller owns the aiohttp session."""

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
        headers = {**self.connection.headers(), "Accept": "application/json"}
        data = None
        if body is not None:
            headers["Content-Type"] = content_type
            data = json.dumps(body).encode()
        async with self.session.request(
            method,
            f"{self.connection.server}{path}",
            data=data,
            params=params,
            headers=headers,
            ssl=self.connection.ssl_context or True,
            timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT),
        ) as resp:
            text = await resp.text()
            try:
                decoded = json.loads(text) if text else {}
            except ValueError:
                decoded = {"message": text[:500]}
            if resp.status >= 400:
                raise KubeApiError.from_status(
                    resp.status, decoded if isinstance(decoded, dict) else None
                )
            return decoded if isinstance(decoded, dict) else {}

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
