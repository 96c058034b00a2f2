"""Follow the routes ConfigMap through the API: list, watch from that resourceVersion, repeat.

A watch that ends is resumed from the last resourceVersion seen (bookmarks keep it fresh);
410 Gone means that version is too old, so the watcher lists again. Any other failure is retried
with capped, jittered exponential backoff. A missing ConfigMap means no routes; the watch goes on.
"""

from __future__ import annotations

import asyncio
import logging
import random
from typing import Any

import aiohttp

from .kubeapi import KubeApiError, KubeClient
from .table import RouteTable

log = logging.getLogger(__name__)


class Backoff:
    """Capped exponential delays with full jitter: 0..initial, 0..2*initial, ... 0..cap."""

    def __init__(self, initial: float = 0.2, cap: float = 5.0) -> None:
        self.initial = initial
        self.cap = cap
        self._attempt = 0

    def reset(self) -> None:
        self._attempt = 0

    def next(self) -> float:
        ceiling = min(self.cap, self.initial * (2**self._attempt))
        self._attempt += 1
        return random.uniform(ceiling / 2, ceiling)


class _Expired(Exception):
    """The resourceVersion we watch from is gone from the server's history (410)."""


class ConfigMapWatcher:
    """Keeps a RouteTable equal to one ConfigMap's data, for as long as `run` runs."""

    def __init__(
        self,
        client: KubeClient,
        table: RouteTable,
        namespace: str,
        name: str,
        watch_timeout_seconds: int = 300,
    ) -> None:
        self.client = client
        self.table = table
        self.namespace = namespace
        self.name = name
        self.watch_timeout_seconds = watch_timeout_seconds
        self.backoff = Backoff()
        self._path = f"/api/v1/namespaces/{namespace}/configmaps"
        self._selector = {"fieldSelector": f"metadata.name={name}"}
        self._missing_logged = False

    async def run(self, resume_from: str | None = None) -> None:
        """List and watch forever (until cancelled); `resume_from` skips the first list."""
        version = resume_from
        while True:
            try:
                if version is None:
                    version = await self._list()
                    self.backoff.reset()
                version = await self._watch(version)
                self.backoff.reset()
                self.table.metrics.watch_restarts.labels("closed").inc()
            except _Expired:
                log.info("The watch of ConfigMap %s/%s expired; listing again", *self._where())
                self.table.metrics.watch_restarts.labels("expired").inc()
                version = None
            except (aiohttp.ClientError, TimeoutError, KubeApiError, ValueError) as exc:
                delay = self.backoff.next()
                log.warning(
                    "Lost the ConfigMap %s/%s watch (%s); retrying in %.1fs",
                    *self._where(),
                    _describe(exc),
                    delay,
                )
                self.table.metrics.watch_restarts.labels("error").inc()
                if isinstance(exc, KubeApiError) and exc.status == 410:
                    version = None
                await asyncio.sleep(delay)

    def _where(self) -> tuple[str, str]:
        return self.namespace, self.name

    async def _list(self) -> str:
        body = await self.client.get_json(self._path, self._selector)
        items = body.get("items") or []
        self._apply(items[0] if items else None)
        version = (body.get("metadata") or {}).get("resourceVersion")
        if not version:
            raise KubeApiError(200, "BadResponse", "the list carried no resourceVersion")
        return str(version)

    async def _watch(self, version: str) -> str:
        params = {
            **self._selector,
            "resourceVersion": version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(self.watch_timeout_seconds),
        }
        read_timeout = self.watch_timeout_seconds + 30.0
        try:
            async for event in self.client.watch(self._path, params, read_timeout):
                self.backoff.reset()
                kind = event.get("type")
                obj = event.get("object") or {}
                version = str((obj.get("metadata") or {}).get("resourceVersion") or version)
                if kind in ("ADDED", "MODIFIED"):
                    self._apply(obj)
                elif kind == "DELETED":
                    self._apply(None)
        except KubeApiError as exc:
            if exc.status == 410:
                raise _Expired from None
            raise
        return version

    def _apply(self, configmap: dict[str, Any] | None) -> None:
        if configmap is None:
            if not self._missing_logged:
                log.warning(
                    "ConfigMap %s/%s does not exist: no routes until it does", *self._where()
                )
                self._missing_logged = True
            self.table.apply_data(None)
            return
        self._missing_logged = False
        data = configmap.get("data")
        if data is not None and not isinstance(data, dict):
            self.table.reject_document("its data is not a mapping")
            return
        self.table.apply_data(data)


def _describe(exc: BaseException) -> str:
    if isinstance(exc, aiohttp.ClientConnectorError):
        return f"cannot connect to {exc.host}:{exc.port}: {exc.os_error.strerror}"
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
