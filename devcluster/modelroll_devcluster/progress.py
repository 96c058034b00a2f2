"""Progress lines for long steps: what is happening, how long it has taken, and when it is done.

On a terminal a running step redraws one line with its elapsed time (and a count, for builds);
elsewhere (CI logs, pytest) it prints a line when it starts, every 30 s, and when it ends.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TextIO

#: Seconds between two progress lines when the output is not a terminal.
PLAIN_EVERY = 30.0


def _elapsed(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes}m{secs:02d}s" if minutes else f"{seconds:.1f}s"


class Progress:
    """Writes step lines to ``stream`` (nothing at all when ``stream`` is None)."""

    def __init__(self, stream: TextIO | None = sys.stdout) -> None:
        self.stream = stream
        self.tty = bool(stream is not None and stream.isatty())

    def say(self, text: str) -> None:
        if self.stream is not None:
            self.stream.write(text + "\n")
            self.stream.flush()

    @contextlib.contextmanager
    def step(self, what: str) -> Iterator[StepTicker]:
        """``with progress.step("Starting X"):`` prints ``==> Starting X`` and, at the end,
        how long it took (or that it failed). The ticker shows a live count when set."""
        ticker = StepTicker(self, what)
        ticker.start()
        try:
            yield ticker
        except BaseException:
            ticker.stop("failed")
            raise
        ticker.stop("done")

    def run(
        self,
        what: str,
        argv: Sequence[str],
        *,
        cwd: Path | None = None,
        env: Mapping[str, str] | None = None,
        unit: str = "lines",
    ) -> None:
        """Run a command, counting its output lines as progress; on failure raise with its tail.

        With ``GOFLAGS=-v`` in ``env``, ``go build`` prints each package it compiles: the count
        then says how far a long build has come.
        """
        tail: list[str] = []
        with self.step(what) as ticker:
            proc = subprocess.Popen(
                list(argv),
                cwd=cwd,
                env={**os.environ, **(env or {})},
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            assert proc.stdout is not None
            for line in proc.stdout:
                tail = [*tail[-29:], line.rstrip()]
                ticker.count += 1
                ticker.unit = unit
            code = proc.wait()
            if code != 0:
                joined = "\n".join(tail)
                command = " ".join(argv)
                raise RuntimeError(f"{command} exited {code}; its output ends with:\n{joined}")


class StepTicker:
    """The live part of one step: elapsed time and an optional count."""

    def __init__(self, progress: Progress, what: str) -> None:
        self.progress = progress
        self.what = what
        self.count = 0
        self.unit = ""
        self.started = time.monotonic()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _status(self) -> str:
        counted = f", {self.count} {self.unit}" if self.unit else ""
        return f"{_elapsed(time.monotonic() - self.started)}{counted}"

    def _write(self, on_tty: str, plain: str) -> None:
        stream = self.progress.stream
        if stream is not None:
            stream.write(on_tty if self.progress.tty else plain)
            stream.flush()

    def start(self) -> None:
        if self.progress.stream is None:
            return
        self._write(f"==> {self.what} ...", f"==> {self.what} ...\n")
        self._thread = threading.Thread(target=self._tick, daemon=True)
        self._thread.start()

    def _tick(self) -> None:
        every = 0.5 if self.progress.tty else PLAIN_EVERY
        while not self._stop.wait(every):
            status = self._status()
            self._write(f"\r\033[K==> {self.what} ... {status}", f"    ... {status}\n")

    def stop(self, outcome: str) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        status = self._status()
        self._write(
            f"\r\033[K==> {self.what} ... {outcome} ({status})\n", f"    {outcome} ({status})\n"
        )
