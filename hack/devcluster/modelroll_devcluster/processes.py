"""Helpers for scripts that run modelroll components as child processes (the benchmarks, the
devcluster's own processes)."""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import subprocess
import sys
import time
import urllib.parse
from collections.abc import AsyncIterator

import aiohttp

from .controlplane import ClusterError, Component, free_port, tail

__all__ = ["free_port", "http_get", "process", "wait_ready"]


@contextlib.asynccontextmanager
async def process(
    args: list[str], ready_url: str, python: str = sys.executable
) -> AsyncIterator[subprocess.Popen[bytes]]:
    """``python -m <args>`` running until the block ends, once ``ready_url`` answers 200."""
    proc = subprocess.Popen(  # noqa: ASYNC220 (spawning does not block; waiting is polled)
        [python, "-m", *args], stderr=subprocess.DEVNULL
    )
    try:
        async with aiohttp.ClientSession() as session:
            for _ in range(200):
                with contextlib.suppress(aiohttp.ClientError):
                    async with session.get(ready_url) as resp:
                        if resp.status == 200:
                            break
                if proc.poll() is not None:
                    raise SystemExit(f"{args[0]} exited with {proc.returncode}")
                await asyncio.sleep(0.05)
            else:
                raise SystemExit(f"{args[0]} was not ready at {ready_url}")
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


def http_get(url: str, timeout: float = 5.0) -> tuple[int, bytes]:
    """``GET url`` (plain HTTP, e.g. a loopback server): its status and body."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme != "http" or parts.hostname is None:
        raise ValueError(f"not a plain http URL: {url!r}")
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)
    try:
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        conn.request("GET", target)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def wait_ready(
    url: str, component: Component, timeout: float, error: type[ClusterError] = ClusterError
) -> None:
    """Poll ``url`` until it answers 200; raise ``error`` with the component's log if the process
    exits first or ``timeout`` seconds pass."""
    deadline = time.monotonic() + timeout
    while True:
        if not component.running():
            code = component.process.returncode if component.process else None
            log = f"log {component.log_path}:\n{tail(component.log_path)}"
            raise error(f"{component.name} exited with {code} during start-up; {log}")
        with contextlib.suppress(OSError, http.client.HTTPException):
            if http_get(url, timeout=1)[0] == 200:
                return
        if time.monotonic() > deadline:
            log = f"log {component.log_path}:\n{tail(component.log_path)}"
            raise error(f"{component.name} did not answer {url} within {timeout:.0f}s; {log}")
        time.sleep(0.05)
