"""Fixtures shared by every test tier: free loopback ports and real child processes."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

VENV_BIN = Path(sys.executable).parent


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass
class Proc:
    """A child process started by a test, with its output kept in a log file."""

    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path
    url: str = ""

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def signal(self, sig: int) -> None:
        self.popen.send_signal(sig)

    def wait(self, timeout: float) -> int:
        return self.popen.wait(timeout)

    def stop(self, timeout: float = 10.0) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(timeout)


def wait_http(url: str, proc: Proc, timeout: float = 20.0, status: int = 200) -> None:
    """Poll ``url`` until it answers ``status``; fail with the process's log if it never does."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.popen.poll() is not None:
            pytest.fail(f"{proc.name} exited with {proc.popen.returncode}:\n{proc.log()}")
        try:
            with urllib.request.urlopen(url, timeout=1) as resp:  # noqa: S310 (loopback URL)
                if resp.status == status:
                    return
        except urllib.error.HTTPError as exc:
            if exc.code == status:
                return
        except OSError:
            pass
        time.sleep(0.05)
    pytest.fail(f"{proc.name} did not answer {status} at {url} within {timeout}s:\n{proc.log()}")


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
        exe = VENV_BIN / command
        log_path = tmp_path / f"{command}-{len(procs)}.log"
        log_file = log_path.open("wb")
        environment = {**os.environ, **(env or {})}
        popen = subprocess.Popen(
            [*prefix, str(exe), *args],
            stdout=log_file,
            stderr=subprocess.STDOUT,
            env={name: value for name, value in environment.items() if value is not None},
        )
        log_file.close()
        proc = Proc(command, popen, log_path, url=ready or "")
        procs.append(proc)
        if ready is not None:
            wait_http(ready, proc, status=ready_status)
        return proc

    yield start
    for proc in reversed(procs):
        proc.stop()
