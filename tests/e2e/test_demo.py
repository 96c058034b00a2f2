"""`make demo ARGS=--once`: the whole stack from one command, the rollback shown, a clean exit.

Runs the demo's entry point as `make demo` does, as a real process that starts its own control
plane and stack, and checks what a person watching it would see: both versions at 9:1, the
table before and after the rollback, and nothing left running afterwards.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from modelroll_devcluster.pytest_plugin import Figures

pytestmark = pytest.mark.e2e


def table_rows(block: str) -> dict[str, list[str]]:
    """The rows of one printed table, by version: WEIGHT SHARE OBSERVED REQ/S ERRORS P99 BATCH."""
    rows = {}
    for line in block.splitlines():
        if re.match(r"  (stable-v1|canary-v2) ", line):
            cells = line.split()
            rows[cells[0]] = cells[1:]
    return rows


def processes_mentioning(text: str) -> list[str]:
    """Command lines of running processes that contain ``text``."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            argv = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in argv:
            found.append(argv)
    return found


@pytest.mark.timeout(240)
def test_make_demo_once_shows_the_rollback_and_stops_everything(figures: Figures) -> None:
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "modelroll_devcluster.demo", "--once"],
        capture_output=True,
        text=True,
        timeout=200,
        check=False,
    )
    took = time.monotonic() - started
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    figures.add("make demo ARGS=--once", f"exit 0 after {took:.1f} s")

    run_dir = re.search(r"KUBECONFIG=(\S+)/cluster/kubeconfig", out)
    assert run_dir, out
    assert "modelversion.modelroll.io/canary-v2 created" in out

    before, _, after = out.partition("$ kubectl modelroll rollback canary-v2")
    assert after, out
    tables_before = re.split(r"^t=", before, flags=re.MULTILINE)[1:]
    tables_after = re.split(r"^t=", after, flags=re.MULTILINE)[1:]
    assert len(tables_before) >= 2, before
    assert len(tables_after) >= 2, after

    steady = table_rows(tables_before[-1])
    assert steady["stable-v1"][:3] == ["9", "90.0%", "90.0%"], tables_before[-1]
    assert steady["canary-v2"][:3] == ["1", "10.0%", "10.0%"], tables_before[-1]
    assert steady["stable-v1"][4] == "0.0%"  # stable-v1 never fails
    assert float(steady["stable-v1"][-1]) > 1  # its sidecar batches the rounds' requests

    dark = table_rows(tables_after[-1])
    assert dark["stable-v1"][:3] == ["9", "100.0%", "100.0%"], tables_after[-1]
    assert dark["canary-v2"][:4] == ["0", "0.0%", "0.0%", "0"], tables_after[-1]
    assert "modelversion/canary-v2 weight 1 -> 0" in after

    assert "Stopping every process the demo started ...\n    done" in out
    assert processes_mentioning(run_dir.group(1)) == []
