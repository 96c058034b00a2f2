"""Child processes: start one with its output in a log file, wait until it answers over HTTP,
stop it. The control plane, the node, the demo stack, the benchmarks and every test tier start
their processes with :class:`Component`."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import http.client
import os
import signal
import socket
import subprocess
import threading
import time
import urllib.parse
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

__all__ = ["ClusterError", "Component", "PortTaken", "free_port", "http_get", "serve", "tail"]

STOP_TIMEOUT = 10.0
"""Seconds between SIGTERM and SIGKILL when a component is stopped."""
LOG_TAIL_LINES = 40
_PR_SET_PDEATHSIG = 1


class ClusterError(RuntimeError):
    """The local cluster or one of its processes could not be started, reached or stopped."""


class PortTaken(ClusterError):
    """A component lost the race for a port picked with :func:`free_port` to another process;
    starting again on new ports gets past it."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    """The last ``lines`` lines of a log file ('' when it does not exist)."""
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


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


def _die_with_parent() -> Callable[[], None] | None:
    """A preexec_fn that makes the child receive SIGTERM when the process that started it dies.

    Linux sends that signal when the *thread* that forked the child ends, so it is only armed for
    children started from the main thread; others are stopped by their owner alone.
    """
    if threading.current_thread() is not threading.main_thread():
        return None
    libc = ctypes.CDLL(None, use_errno=True)
    prctl = libc.prctl

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)

    return preexec


@dataclass
class Component:
    """One child process: its command line, its log file and, once started, its Popen (kept
    after it stops, for its exit code)."""

    name: str
    argv: list[str]
    log_path: Path
    env: Mapping[str, str] | None = None
    """The child's whole environment (None: this process's)."""
    announce: bool = True
    """Write the command line to the log before each start (off for a log read line by line)."""
    process: subprocess.Popen[bytes] | None = None
    _log: IO[bytes] | None = field(default=None, repr=False)

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    def start(self, *, die_with_parent: bool) -> None:
        """Start the process in its own session, appending stdout and stderr to its log."""
        self._log = self.log_path.open("ab")
        if self.announce:
            self._log.write(f"--- starting: {' '.join(self.argv)}\n".encode())
            self._log.flush()
        self.process = subprocess.Popen(
            self.argv,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=self.env,
            start_new_session=True,
            preexec_fn=_die_with_parent() if die_with_parent else None,
        )

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self, timeout: float = STOP_TIMEOUT) -> None:
        """SIGTERM, then SIGKILL after ``timeout`` seconds; always reaps the process."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self._log is not None:
            self._log.close()
            self._log = None

    def failure(self, reason: str) -> ClusterError:
        """An error saying why this component did not come up, with the tail of its log."""
        return ClusterError(
            f"{self.name} {reason}; log {self.log_path} ends with:\n{tail(self.log_path)}"
        )

    def exited(self) -> ClusterError:
        """Why this component exited during start-up: :class:`PortTaken` when another process
        took a port picked for it (worth a retry on new ports), else its failure."""
        if "address already in use" in tail(self.log_path, 200).lower():
            return PortTaken(f"{self.name}: a port picked for it was taken first")
        code = self.process.returncode if self.process else None
        return self.failure(f"exited with code {code} during start-up")

    def start_ready(
        self, urls: Sequence[str], timeout: float, *, error: type[Exception] = ClusterError
    ) -> None:
        """Start it (dying with its parent) and wait until each of ``urls`` answers 200 (see
        :meth:`wait_ready`); if it does not, it is stopped and ``error`` raised."""
        self.start(die_with_parent=True)
        try:
            for url in urls:
                self.wait_ready(url, timeout, error=error)
        except BaseException:
            self.stop()
            raise

    def wait_ready(
        self,
        url: str,
        timeout: float,
        *,
        status: int = 200,
        error: type[Exception] = ClusterError,
    ) -> None:
        """Poll ``url`` until it answers ``status``; raise ``error`` with the log's tail if the
        process exits first or ``timeout`` seconds pass."""
        deadline = time.monotonic() + timeout
        while True:
            if not self.running():
                code = self.process.returncode if self.process else None
                log = f"log {self.log_path}:\n{tail(self.log_path)}"
                raise error(f"{self.name} exited with {code} during start-up; {log}")
            with contextlib.suppress(OSError, http.client.HTTPException):
                if http_get(url, timeout=1)[0] == status:
                    return
            if time.monotonic() > deadline:
                log = f"log {self.log_path}:\n{tail(self.log_path)}"
                raise error(f"{self.name} did not answer {url} within {timeout:.0f}s; {log}")
            time.sleep(0.05)


@contextlib.asynccontextmanager
async def serve(
    component: Component,
    ready_url: str,
    *,
    start_s: float = 20.0,
    stop_s: float = STOP_TIMEOUT,
    error: type[Exception] = ClusterError,
) -> AsyncIterator[Component]:
    """``component`` running until the block ends, once ``ready_url`` answers 200 (for callers
    in an event loop; the waits run in a thread). It gets ``start_s`` to answer and ``stop_s``
    to exit on SIGTERM."""
    component.start(die_with_parent=True)
    try:
        await asyncio.to_thread(component.wait_ready, ready_url, start_s, error=error)
        yield component
    finally:
        await asyncio.to_thread(component.stop, stop_s)


def environment(changes: Mapping[str, str | None]) -> dict[str, str]:
    """This process's environment with ``changes`` applied (None removes a variable)."""
    merged: dict[str, str | None] = {**os.environ, **changes}
    return {name: value for name, value in merged.items() if value is not None}
