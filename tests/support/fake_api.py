"""The operator's API connection, faked in memory for the unit tests of the reconciler and the
analysis: objects by path, writes and Events recorded, failures on demand."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from modelroll_operator.api import KubeApiError, core_path
from modelroll_operator.permissions import require


def merge(target: dict[str, Any], patch: Mapping[str, Any]) -> dict[str, Any]:
    """RFC 7386 JSON merge patch."""
    out = dict(target)
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, Mapping):
            out[key] = merge(out.get(key) or {}, value)
        else:
            out[key] = value
    return out


class FakeApi:
    """Objects by path; every write is recorded; ``failures`` makes the next calls fail. A call
    the operator's permissions do not declare raises, as the real Api does."""

    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Any]] = {}
        self.writes: list[tuple[str, str]] = []
        self.events: list[tuple[str, str, str]] = []
        self.failures = 0
        self.refuse: dict[str, KubeApiError] = {}
        """Writes to these paths are refused with that error, every time."""

    def _maybe_fail(self) -> None:
        if self.failures:
            self.failures -= 1
            raise KubeApiError(503, "ServiceUnavailable", "the API server is restarting")

    async def get(self, path: str) -> dict[str, Any] | None:
        require("GET", path)
        self._maybe_fail()
        return self.objects.get(path)

    async def create(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        require("POST", path)
        self._maybe_fail()
        full = f"{path}/{body['metadata']['name']}"
        if full in self.objects:
            raise KubeApiError(409, "AlreadyExists", "exists")
        self.objects[full] = dict(body)
        self.writes.append(("create", full))
        return self.objects[full]

    async def merge_patch(self, path: str, patch: Mapping[str, Any]) -> dict[str, Any]:
        require("PATCH", path)
        self._maybe_fail()
        if path in self.refuse:
            raise self.refuse[path]
        base = path.removesuffix("/status")
        self.objects[base] = merge(self.objects.get(base, {}), patch)
        self.writes.append(("patch", path))
        return self.objects[base]

    async def apply(self, path: str, manifest: Mapping[str, Any]) -> dict[str, Any]:
        require("PATCH", path)
        self._maybe_fail()
        if path in self.refuse:
            raise self.refuse[path]
        self.objects[path] = dict(manifest)
        self.writes.append(("apply", path))
        return self.objects[path]

    async def delete(self, path: str) -> bool:
        require("DELETE", path)
        self._maybe_fail()
        self.writes.append(("delete", path))
        return self.objects.pop(path, None) is not None

    async def post_event(
        self, involved: Mapping[str, Any], reason: str, message: str, kind: str = "Normal"
    ) -> None:
        require("POST", core_path(involved["metadata"]["namespace"], "events"))
        self.events.append((involved["metadata"]["name"], reason, message))
