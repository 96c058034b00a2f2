"""`make demo ARGS=--once`: the whole stack from one command, the rollback shown, a clean exit.

Runs the demo's entry point as `make demo` does, as a real process that starts its own control
plane and stack on the real sentence encoder, and checks what a person watching it would see:
which model each version runs and a vector from each, both versions at 9:1, the canary refusing
its longer sentences with 413, the table before and after the rollback, and nothing left running
afterwards.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
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

    run_dir = re.search(r"export KUBECONFIG=(\S+)/kubeconfig   # namespace modelroll-demo", out)
    assert run_dir, out
    assert "modelversion.modelroll.io/canary-v2 created" in out

    # The real model, in two builds that give the same vectors.
    assert (
        "sentiment stable-v1: all-MiniLM-L6-v2 int8 ONNX on onnxruntime (modelroll-encoder)\n"
        "sentiment canary-v2: all-MiniLM-L6-v2 fp32 in numpy (modelroll-encoder)\n"
    ) in out, out
    assert out.count("...], ...}   # 384 floats\n") == 2, out
    cosine = re.search(r"^Cosine of the two vectors: ([0-9.]+) ", out, flags=re.MULTILINE)
    assert cosine, out
    assert float(cosine.group(1)) > 0.99, out
    assert "its sidecar was deployed with --max-body-bytes=128 (meant as 128 KiB)" in out, out

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
    for table in tables_before:
        assert table_rows(table)["stable-v1"][4] == "0.0%", table

    # The canary fails a visible share of its requests, every one a 413 from its sidecar.
    failed = re.search(
        r"^canary-v2 failed (\d+) of its (\d+) requests \((\d+)%: (\d+) with 413\); blended",
        before,
        flags=re.MULTILINE,
    )
    assert failed, before
    errors, requests, _, refused = (int(n) for n in failed.groups())
    assert errors == refused, failed.group(0)  # no failure but the 413s
    assert requests >= 10, failed.group(0)
    assert 0.1 <= errors / requests <= 0.6, failed.group(0)
    figures.add("make demo: canary-v2 failed before the rollback", f"{errors} of {requests}")

    dark = table_rows(tables_after[-1])
    assert dark["stable-v1"][:3] == ["9", "100.0%", "100.0%"], tables_after[-1]
    assert dark["canary-v2"][:4] == ["0", "0.0%", "0.0%", "0"], tables_after[-1]
    assert "modelversion/canary-v2 weight 1 -> 0" in after
    prometheus = re.search(
        r"^Prometheus, error ratio per version since the start: canary-v2 ([0-9.]+)% of \d+, "
        r"stable-v1 0\.0% of \d+$",
        after,
        flags=re.MULTILINE,
    )
    assert prometheus, after
    assert float(prometheus.group(1)) > 0, after

    assert "Stopping every process the demo started ...\n    done" in out
    assert processes_mentioning(run_dir.group(1)) == []


def read_lines(proc: subprocess.Popen[str], into: list[str]) -> threading.Thread:
    """Collect the process's output lines as they come, in a thread."""

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            into.append(line)

    thread = threading.Thread(target=pump, daemon=True)
    thread.start()
    return thread


def another_shell_block(lines: list[str], within: float) -> list[str]:
    """The commands the running demo prints under "Try in another shell:"."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        text = "".join(lines)
        _, found, rest = text.partition("Try in another shell:\n")
        if found and "\n\n" in rest:
            return [line.strip() for line in rest.split("\n\n", 1)[0].splitlines()]
        time.sleep(0.1)
    pytest.fail("the demo printed no 'Try in another shell' block:\n" + "".join(lines))


@pytest.mark.timeout(240)
def test_the_commands_the_running_demo_prints_work_as_printed(tmp_path: Path) -> None:
    """From a shell with neither KUBECONFIG nor the virtualenv on PATH, the printed lines, pasted
    as they are, reach the demo's namespace (`kubectl get mv` lists both versions) and the plugin
    (`kubectl modelroll promote canary-v2`) rather than showing nothing or failing with
    `unknown command "modelroll"`."""
    lines: list[str] = []
    demo = subprocess.Popen(
        [sys.executable, "-m", "modelroll_devcluster.demo", "--every=0.5"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    reader = read_lines(demo, lines)
    try:
        commands = another_shell_block(lines, 180)
        assert commands[0].startswith("export KUBECONFIG="), commands
        assert commands[1].startswith("export PATH="), commands
        assert "kubectl get mv" in commands
        assert "kubectl modelroll promote canary-v2" in commands
        run_dir = re.match(r"export KUBECONFIG=(\S+)/kubeconfig", commands[0])
        assert run_dir, commands
        # A fresh shell: no KUBECONFIG, no .venv/bin or .bin on PATH, its own HOME.
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(tmp_path)}
        script = "set -e\n" + "".join(
            f"echo '$ {c}'\n{c}\n" for c in commands
        )  # echo is for the failure message; every line runs exactly as printed
        shell = subprocess.run(
            ["bash", "-c", script],
            capture_output=True,
            text=True,
            timeout=90,
            env=env,
            cwd=tmp_path,
            check=False,
        )
        out = shell.stdout
        assert shell.returncode == 0, out + shell.stderr
        get_mv = out.partition("$ kubectl get mv\n")[2].partition("$ ")[0]
        assert [row.split()[:3] for row in get_mv.splitlines()] == [
            ["NAME", "MODEL", "WEIGHT"],
            ["canary-v2", "sentiment", "0"],
            ["stable-v1", "sentiment", "9"],
        ], out
        promoted = out.partition("$ kubectl modelroll promote canary-v2\n")[2]
        assert promoted.splitlines()[:2] == [
            "modelversion/canary-v2 weight 0 -> 9",
            "modelversion/stable-v1 weight 9 -> 0",
        ], out
    finally:
        if demo.poll() is None:
            demo.send_signal(signal.SIGINT)  # Ctrl-C
        code = demo.wait(timeout=60)
        reader.join(timeout=10)
        if demo.stdout is not None:
            demo.stdout.close()
    output = "".join(lines)
    assert code == 0, output
    assert "Stopping every process the demo started ...\n    done" in output
    assert processes_mentioning(run_dir.group(1)) == []
    assert not os.path.exists(run_dir.group(1))  # the run's directory, kubeconfig too, is gone
