"""The API calls the operator and the plugin make beyond kopf's own: get, create, patch, apply.

They go through the official Kubernetes Python client, connected by
:func:`modelroll_common.kube.connect` with the credentials kubectl would use. The client is
synchronous: the operator's calls run in worker threads (``asyncio.to_thread``) so that kopf's
event loop never waits on the network. Each of the operator's calls is checked against the
table its RBAC is generated from (:mod:`.permissions`) before it is sent.
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import urllib3
from kubernetes import client as k8s

from .permissions import PERMISSIONS, Permission, require
from .spec import FIELD_MANAGER, GROUP, PLURAL, VERSION

__all__ = ["Api", "KubeApiError", "mv_path"]

REQUEST_TIMEOUT = 30.0
#: What a failed call raises besides KubeApiError: the API server could not be reached.
UNREACHABLE = (urllib3.exceptions.HTTPError, OSError)


class KubeApiError(Exception):
    """The API server answered with an error status."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message


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


Body = Mapping[str, Any] | list[dict[str, Any]]
"""A request's JSON body: an object, or a JSON patch's list of operations."""


class Api:
    """Raw REST calls by path through the official client, each in a worker thread.

    ``permissions``: the calls it may make (:func:`.permissions.require` raises before any
    other is sent); None for the plugin, which a person runs with their own credentials.
    """

    def __init__(
        self, client: k8s.ApiClient, permissions: tuple[Permission, ...] | None = PERMISSIONS
    ) -> None:
        self.client = client
        self.permissions = permissions

    async def send(
        self,
        method: str,
        path: str,
        body: Body | None = None,
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
        body: Body | None = None,
        content_type: str = "application/json",
        params: Mapping[str, str] | None = None,
    ) -> dict[str, Any]:
        """:meth:`send`, blocking (for the plugin, a command-line tool)."""
        if self.permissions is not None:
            require(method, path, params, self.permissions)
        headers = {"Accept": "application/json", "Content-Type": content_type}
        request = self.client.param_serialize(
            method,
            path,
            query_params=list((params or {}).items()),
            header_params=headers,
            body=body if isinstance(body, list) or body is None else dict(body),
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
        return await self._patch(path, patch, "application/merge-patch+json")

    async def json_patch(self, path: str, operations: list[dict[str, Any]]) -> dict[str, Any]:
        """A JSON patch (RFC 6902): for one item of a list, with ``test`` operations guarding
        what the patch assumes."""
        return await self._patch(path, operations, "application/json-patch+json")

    async def _patch(self, path: str, body: Body, content_type: str) -> dict[str, Any]:
        return await self.send(
            "PATCH", path, body, content_type=content_type, params={"fieldManager": FIELD_MANAGER}
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
