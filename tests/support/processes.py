"""Real child processes a test starts (console scripts from .venv), free loopback ports, and
waiting until a process answers over HTTP."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from modelroll_devcluster.processes import ClusterError, Component
from modelroll_devcluster.processes import free_port as free_port

VENV_BIN = Path(sys.executable).parent


@dataclass
class Proc(Component):
    """A child process started by a test; its log holds its whole output and nothing else."""

    url: str = ""

    @property
    def popen(self) -> subprocess.Popen[bytes]:
        assert self.process is not None, f"{self.name} was never started"
        return self.process

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def signal(self, sig: int) -> None:
        self.popen.send_signal(sig)

    def wait(self, timeout: float) -> int:
        return self.popen.wait(timeout)


def start_proc(name: str, argv: list[str], log_path: Path, **fields: Any) -> Proc:
    """A started :class:`Proc` (stopped by its owner, not when the thread that started it ends)."""
    proc = Proc(name, argv, log_path, announce=False, **fields)
    proc.start(die_with_parent=False)
    return proc


def wait_http(url: str, proc: Proc, timeout: float = 20.0, status: int = 200) -> None:
    """Poll ``url`` until it answers ``status``; fail with the process's log if it never does."""
    try:
        proc.wait_ready(url, timeout, status=status)
    except ClusterError as exc:
        pytest.fail(str(exc))


Spawn = Callable[..., Proc]
