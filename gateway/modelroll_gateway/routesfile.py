"""Routes from a file instead of the API: for a mounted ConfigMap volume or a local run.

`path` is either
- a directory, as a ConfigMap volume mounts it: one file per data key (dot-files are skipped), or
- a JSON file: a ConfigMap object (`kubectl get cm modelroll-routes -o json`), or a mapping of
  model name to its route (an object, or the JSON text a ConfigMap value holds).

The path is polled; when it changes it is read again. A file that cannot be read or parsed is
rejected and the last good routes stay. A path missing at start means no routes yet.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from pathlib import Path
from typing import Any

from .table import RouteTable

log = logging.getLogger(__name__)

Signature = tuple[tuple[str, int, int, int], ...]


class RoutesFileError(Exception):
    """The routes file exists but is not a routes document."""


def _signature(path: Path) -> Signature | None:
    """What changes when the file (or any file in the directory) is rewritten; None if missing."""
    try:
        if path.is_dir():
            entries = []
            for entry in sorted(os.scandir(path), key=lambda e: e.name):
                if entry.name.startswith(".") or not entry.is_file():
                    continue
                st = entry.stat()
                entries.append((entry.name, st.st_ino, st.st_mtime_ns, st.st_size))
            return tuple(entries)
        st = path.stat()
    except FileNotFoundError:
        return None
    return ((path.name, st.st_ino, st.st_mtime_ns, st.st_size),)


def read_routes_path(path: Path) -> dict[str, Any]:
    """The ConfigMap-style data held at `path` (see the module docstring)."""
    if path.is_dir():
        data: dict[str, Any] = {}
        for entry in sorted(os.scandir(path), key=lambda e: e.name):
            if not entry.name.startswith(".") and entry.is_file():
                data[entry.name] = Path(entry.path).read_text()
        return data
    try:
        doc = json.loads(path.read_bytes())
    except ValueError as exc:
        raise RoutesFileError(f"not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise RoutesFileError("must be a JSON object (model -> route, or a ConfigMap)")
    if doc.get("kind") == "ConfigMap":
        inner = doc.get("data") or {}
        if not isinstance(inner, dict):
            raise RoutesFileError("the ConfigMap's data is not a mapping")
        return inner
    return doc


class RoutesFileWatcher:
    """Keeps a RouteTable equal to a routes file, polling it every `interval` seconds."""

    def __init__(self, path: Path, table: RouteTable, interval: float = 0.25) -> None:
        self.path = path
        self.table = table
        self.interval = interval
        self._signature: Signature | None = None

    def check(self) -> None:
        """Read the path if it changed since the last check, and apply what it holds."""
        signature = _signature(self.path)
        if signature is None:
            if not self.table.loaded:
                log.warning("Routes file %s does not exist: no routes until it does", self.path)
                self.table.apply_data(None)
            elif self._signature is not None:
                self.table.reject_document(f"{self.path} is gone; keeping the last routes")
            self._signature = None
            return
        if signature == self._signature:
            return
        self._signature = signature
        try:
            data = read_routes_path(self.path)
        except (OSError, UnicodeDecodeError, RoutesFileError) as exc:
            self.table.reject_document(f"{self.path}: {exc}")
            return
        self.table.apply_data(data)

    async def run(self) -> None:
        """Poll forever (until cancelled)."""
        while True:
            self.check()
            await asyncio.sleep(self.interval)
