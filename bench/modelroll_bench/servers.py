"""Servers under test as child processes: where they listen, and the CPU time they have used.

CPU time per request is the steadier figure when other processes share the machine, so the
benchmarks report it beside requests per second.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from .systems import running

Check = tuple[str, bool, str]
"""A benchmark target: what it is, whether it was met, and the figure measured."""


@dataclass(frozen=True)
class Server:
    url: str
    pid: int

    def cpu_seconds(self) -> float:
        """User + system CPU time the process has used so far (Linux /proc)."""
        fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextlib.asynccontextmanager
async def serve_module(
    module: str,
    args: Sequence[str],
    port: int,
    cpu: int | None = None,
    python: str = sys.executable,
) -> AsyncIterator[Server]:
    """Run ``python -m module args`` on 127.0.0.1:``port`` until the block ends, optionally
    pinned to one CPU; ``python``: another interpreter (another checkout's virtualenv)."""
    url = f"http://127.0.0.1:{port}"
    async with running([python, "-m", module, *args], port) as served:
        pid = served.pid
        assert pid is not None
        if cpu is not None:
            os.sched_setaffinity(pid, {cpu})
        yield Server(url, pid)
