"""Fixtures shared by every test tier: free loopback ports and real child processes."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from modelroll_devcluster.processes import ClusterError, Component, environment
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


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Spawn]:
    """Start a console script from .venv as a real process; every one is stopped at teardown.

    ``spawn(name, *args, ready=url)`` waits until ``url`` answers 200 (pass ``ready_status`` for
    another code, or ``ready=None`` not to wait). ``env`` adds variables (None removes one);
    ``prefix`` is a command that runs the script (e.g. in other namespaces).
    """
    procs: list[Proc] = []

    def start(
        command: str,
        *args: str,
        ready: str | None = None,
        ready_status: int = 200,
        env: Mapping[str, str | None] | None = None,
        prefix: Sequence[str] = (),
    ) -> Proc:
        argv = [*prefix, str(VENV_BIN / command), *args]
        log_path = tmp_path / f"{command}-{len(procs)}.log"
        proc = start_proc(command, argv, log_path, env=environment(env or {}), url=ready or "")
        procs.append(proc)
        if ready is not None:
            wait_http(ready, proc, status=ready_status)
        return proc

    yield start
    for proc in reversed(procs):
        proc.stop()
