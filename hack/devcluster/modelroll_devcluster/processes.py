"""Helpers for scripts that run modelroll components as child processes (the benchmarks).

Moved here from the sidecar-only demo that ``make demo`` used to run, so that bench/ keeps them.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
from collections.abc import AsyncIterator

import aiohttp

from .controlplane import free_port

__all__ = ["free_port", "process"]


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
