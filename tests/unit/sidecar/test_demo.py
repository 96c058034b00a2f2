"""`make demo ARGS=--once`: one round against real processes, then a clean exit."""

from __future__ import annotations

import re
import subprocess
import sys


def test_demo_once_batches_a_burst_and_exits_cleanly() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "modelroll_sidecar.demo", "--once", "--burst", "64"],
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )

    assert done.returncode == 0, done.stderr
    answered = re.search(r"answered:\s+\{200: (\d+)\}", done.stdout)
    assert answered is not None, done.stdout
    assert int(answered.group(1)) == 64 + 3
    sizes = re.search(r"batch sizes:\s+\[([\d, ]+)\]", done.stdout)
    assert sizes is not None
    batches = [int(n) for n in sizes.group(1).split(",")]
    assert sum(batches) == 67
    assert max(batches) == 16  # the burst filled batches to the size limit
    assert batches[-3:] == [1, 1, 1]  # lone requests left on their max-wait timer
