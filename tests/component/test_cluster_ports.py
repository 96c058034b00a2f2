"""A local-cluster component that loses the race for its port: the cluster's start-up tells it
apart from any other failure, so that it starts again on new ports instead of failing."""

from __future__ import annotations

import socket
import sys
import time
from pathlib import Path

from modelroll_devcluster.processes import Component, PortTaken

BIND = "import socket, sys; socket.socket().bind(('127.0.0.1', int(sys.argv[1])))"


def exited(component: Component) -> None:
    component.start(die_with_parent=True)
    deadline = time.monotonic() + 30
    while component.running():
        assert time.monotonic() < deadline, f"{component.name} still running"
        time.sleep(0.05)
    component.stop()  # reaps it and closes its log


def test_a_component_whose_port_was_taken_is_told_apart_from_other_failures(
    tmp_path: Path,
) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        port = holder.getsockname()[1]
        taken = Component("binder", [sys.executable, "-c", BIND, str(port)], tmp_path / "a.log")
        exited(taken)
    assert isinstance(taken.exited(), PortTaken), (tmp_path / "a.log").read_text()
    broken = Component("broken", [sys.executable, "-c", "raise SystemExit(3)"], tmp_path / "b.log")
    exited(broken)
    error = broken.exited()
    assert not isinstance(error, PortTaken)
    assert "broken exited with code 3 during start-up" in str(error)
