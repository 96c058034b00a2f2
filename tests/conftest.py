"""Fixtures shared by every test tier: real child processes (helpers in tests.support.processes)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import pytest

from modelroll_devcluster.processes import environment
from tests.support.processes import VENV_BIN, Proc, Spawn, start_proc, wait_http


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
