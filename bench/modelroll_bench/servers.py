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
from typing import Any, NoReturn

from . import results
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


def finish(report: dict[str, Any], checks: list[Check], out: Path) -> NoReturn:
    """Write the report with its targets to ``out``, print the verdicts, and exit 0 only when
    every target was met."""
    report["targets"] = [{"target": t, "met": ok, "measured": m} for t, ok, m in checks]
    results.write(report, out)
    print("\nTargets:")
    for target, ok, measured in checks:
        print(f"  [{'met' if ok else 'MISSED'}] {target}: {measured}")
    print(f"Results in {out}")
    sys.exit(0 if all(ok for _, ok, _ in checks) else 1)
