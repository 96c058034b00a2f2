"""Follow the routes ConfigMap through the API: list, watch from that resourceVersion, repeat.

The calls go through the official Kubernetes client, which blocks: each list and each watch runs
in a daemon thread of its own, and every document it reads is handed to the event loop, which
alone touches the route table. The proxy never waits on the API.

A watch that ends is resumed from the last resourceVersion seen (bookmarks keep it fresh);
410 Gone means that version is too old, so the watcher lists again. Any other failure is retried
with capped, jittered exponential backoff. A ConfigMap missing from the start means no routes;
one deleted after it was read leaves the last routes in force (as Envoy keeps its last good
configuration), rejected as a document, until it exists again. The watch goes on.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import urllib3
from kubernetes import client as k8s
from kubernetes import watch as k8s_watch

from .table import RouteTable

log = logging.getLogger(__name__)

T = TypeVar("T")

REQUEST_TIMEOUT = 30.0
"""Seconds for a list request."""
CONNECT_TIMEOUT = 10.0
"""Seconds to connect for a watch; reading waits as long as the watch lasts, plus a margin."""
FAILURES = (k8s.ApiException, urllib3.exceptions.HTTPError, OSError, ValueError)
"""What a failed list or watch raises: an error status, or no usable answer at all."""


class Backoff:
    """Capped exponential delays with jitter: initial/2..initial, then double, up to cap."""

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


class ConfigMapWatcher:
    """Keeps a RouteTable equal to one ConfigMap's data, for as long as `run` runs."""

    def __init__(
        self,
        api: k8s.CoreV1Api,
        table: RouteTable,
        namespace: str,
        name: str,
        watch_timeout_seconds: int = 300,
    ) -> None:
        self.api = api
        self.table = table
        self.namespace = namespace
        self.name = name
        self.watch_timeout_seconds = watch_timeout_seconds
        self.backoff = Backoff()
        self._selector = f"metadata.name={name}"
        self._missing_logged = False
        self._read = False
        """Whether the ConfigMap has been read: once it has, its absence keeps its routes."""
        self._watch: k8s_watch.Watch | None = None

    async def run(self, resume_from: str | None = None) -> None:
        """List and watch forever (until cancelled); `resume_from` skips the first list."""
        loop = asyncio.get_running_loop()
        version = resume_from
        where = self._where()
        try:
            while True:
                try:
                    if version is None:
                        version = await _in_thread(self._list, loop)
                        self.backoff.reset()
                    version = await _in_thread(self._follow, loop, version)
                    self.table.metrics.watch_restarts.labels("closed").inc()
                except FAILURES as exc:
                    if isinstance(exc, k8s.ApiException) and exc.status == 410:
                        log.info("The watch of ConfigMap %s/%s expired: listing again", *where)
                        self.table.metrics.watch_restarts.labels("expired").inc()
                        version = None
                    else:
                        await self._retry_after(exc)
        finally:
            if self._watch is not None:
                self._watch.stop()  # type: ignore[no-untyped-call]  # unblocks its reader

    async def _retry_after(self, exc: BaseException) -> None:
        delay = self.backoff.next()
        log.warning(
            "Lost the ConfigMap %s/%s watch (%s); retrying in %.1fs",
            *self._where(),
            describe(exc),
            delay,
        )
        self.table.metrics.watch_restarts.labels("error").inc()
        await asyncio.sleep(delay)

    def _where(self) -> tuple[str, str]:
        return self.namespace, self.name

    # The two calls below run in worker threads; they reach the table only through the loop.

    def _list(self, loop: asyncio.AbstractEventLoop) -> str:
        found = self.api.list_namespaced_config_map(
            self.namespace, field_selector=self._selector, _request_timeout=REQUEST_TIMEOUT
        )
        items = [self.api.api_client.sanitize_for_serialization(item) for item in found.items]
        loop.call_soon_threadsafe(self._apply, items[0] if items else None)
        version = found.metadata.resource_version if found.metadata else None
        if not version:
            raise ValueError("the list of ConfigMaps carried no resourceVersion")
        return str(version)

    def _follow(self, loop: asyncio.AbstractEventLoop, version: str) -> str:
        """Apply each event until the server ends the watch; the last resourceVersion seen."""
        self._watch = watch = k8s_watch.Watch()  # type: ignore[no-untyped-call]
        events = watch.stream(  # type: ignore[no-untyped-call]
            self.api.list_namespaced_config_map,
            self.namespace,
            field_selector=self._selector,
            resource_version=version,
            allow_watch_bookmarks=True,
            timeout_seconds=self.watch_timeout_seconds,
            _request_timeout=(CONNECT_TIMEOUT, self.watch_timeout_seconds + 30.0),
        )
        for event in events:
            loop.call_soon_threadsafe(self.backoff.reset)
            obj = event.get("raw_object") or {}
            version = str((obj.get("metadata") or {}).get("resourceVersion") or version)
            if event["type"] in ("ADDED", "MODIFIED"):
                loop.call_soon_threadsafe(self._apply, obj)
            elif event["type"] == "DELETED":
                loop.call_soon_threadsafe(self._apply, None)
        return version

    def _apply(self, configmap: dict[str, Any] | None) -> None:
        if configmap is None and self._read:
            self.table.reject_document(
                "it was deleted; the routes read before stay in force until it exists again"
            )
            return
        if configmap is None:
            if not self._missing_logged:
                log.warning(
                    "ConfigMap %s/%s does not exist: no routes until it does", *self._where()
                )
                self._missing_logged = True
            self.table.apply_data(None)
            return
        self._missing_logged = False
        self._read = True
        data = configmap.get("data")
        if data is not None and not isinstance(data, dict):
            self.table.reject_document("its data is not a mapping")
            return
        self.table.apply_data(data)


async def _in_thread(call: Callable[..., T], *args: Any) -> T:
    """``call(*args)`` in a daemon thread of its own, awaited without blocking the loop.

    Not asyncio.to_thread: a watch blocks for minutes, and the default executor's threads are
    joined when the process exits; a daemon thread is not, and the caller stops its watch.
    """
    loop = asyncio.get_running_loop()
    done: asyncio.Future[T] = loop.create_future()

    def settle(result: T | None, error: BaseException | None) -> None:
        if done.done():  # cancelled meanwhile
            return
        if error is not None:
            done.set_exception(error)
        else:
            done.set_result(result)  # type: ignore[arg-type]

    def work() -> None:
        try:
            result, error = call(*args), None
        except BaseException as exc:  # handed to the awaiting task, which decides
            result, error = None, exc
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody is waiting
            loop.call_soon_threadsafe(settle, result, error)

    threading.Thread(target=work, name="routes-watch", daemon=True).start()
    return await done


def describe(exc: BaseException) -> str:
    """One line about a failed API call (never the response headers the client's str has)."""
    if isinstance(exc, k8s.ApiException):
        message = ""
        with contextlib.suppress(ValueError, AttributeError):
            message = str(json.loads(exc.body or "{}").get("message") or "")
        return f"{exc.status} {exc.reason}" + (f": {message}" if message else "")
    if isinstance(exc, urllib3.exceptions.MaxRetryError) and exc.reason is not None:
        return describe(exc.reason)
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
