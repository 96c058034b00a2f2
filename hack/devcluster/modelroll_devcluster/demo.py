"""``make demo``: the rollout story live, on loopback, from a fresh clone.

Builds the local control plane if needed and starts it, then the operator, the gateway, and two
versions of model ``sentiment`` (stable-v1 and canary-v2, each a demo model behind its own
batching sidecar; canary-v2's model fails 20% of items), applies both at weights 9:1 with
kubectl and sends traffic. A per-version table shows what each version does; then canary-v2 is
rolled back with ``kubectl modelroll rollback`` and the table changes. ``--once`` stops there
(for CI); otherwise the table keeps updating until Ctrl-C. Every process it started is stopped
on the way out.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import signal
import sys
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any, TextIO

import yaml

from .controlplane import ClusterError
from .progress import Progress
from .stack import ROLLOUT, Stack
from .traffic import Response, Traffic, by_version

ROUNDS_PER_SECOND = 20.0
WINDOW = 10


def batch_sizes(sidecar_url: str) -> tuple[float, float]:
    """(sum, count) of ``modelroll_batch_size`` from a sidecar's /metrics."""
    with urllib.request.urlopen(f"{sidecar_url}/metrics", timeout=5) as resp:  # noqa: S310
        text = resp.read().decode()
    found = {"sum": 0.0, "count": 0.0}
    for line in text.splitlines():
        for kind in found:
            if line.startswith(f"modelroll_batch_size_{kind}{{"):
                found[kind] += float(line.rsplit(" ", 1)[1])
    return found["sum"], found["count"]


@dataclass
class Snapshot:
    at: float
    responses: int
    batches: dict[str, tuple[float, float]]


class Table:
    """The per-version table over the interval since the previous one."""

    def __init__(self, stack: Stack, traffic: Traffic, out: TextIO) -> None:
        self.stack = stack
        self.traffic = traffic
        self.out = out
        self.tty = out.isatty()
        self.drawn = 0
        self.last = self._snapshot()
        self.started = self.last.at

    def _snapshot(self) -> Snapshot:
        batches = {name: batch_sizes(v.sidecar_url) for name, v in self.stack.versions.items()}
        return Snapshot(time.monotonic(), len(self.traffic.responses), batches)

    def render(self) -> list[str]:
        now = self._snapshot()
        recent: list[Response] = self.traffic.responses[self.last.responses : now.responses]
        seconds = max(now.at - self.last.at, 1e-9)
        model = self.stack.routes().get(self.stack.model) or {"versions": []}
        routes = {v["name"]: v for v in model["versions"]}
        figures = by_version(recent)
        total = len(recent)
        rows = [["VERSION", "WEIGHT", "SHARE", "OBSERVED", "REQ/S", "ERRORS", "P99", "BATCH"]]
        for name in self.stack.versions:
            route = routes.get(name, {"weight": "-", "share": None})
            seen = figures.get(name)
            batch_sum = now.batches[name][0] - self.last.batches[name][0]
            batch_count = now.batches[name][1] - self.last.batches[name][1]
            rows.append(
                [
                    name,
                    str(route["weight"]),
                    "-" if route["share"] is None else f"{route['share']:.1%}",
                    f"{(seen.requests if seen else 0) / total:.1%}" if total else "-",
                    f"{(seen.requests if seen else 0) / seconds:.0f}",
                    f"{seen.error_ratio:.1%}" if seen else "-",
                    f"{seen.p99 * 1000:.1f} ms" if seen else "-",
                    f"{batch_sum / batch_count:.1f}" if batch_count else "-",
                ]
            )
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        lines = [f"t={now.at - self.started:4.0f}s, last {seconds:.1f}s:"]
        lines += [
            "  " + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
            for r in rows
        ]
        errors = sum(f.errors for f in figures.values())
        lines.append(
            f"  all versions blended: error ratio {errors / total:.1%}" if total else "  no traffic"
        )
        self.last = now
        return lines

    def show(self) -> None:
        """Print the table; on a terminal, in place of the previous one."""
        lines = self.render()
        if self.tty and self.drawn:
            self.out.write(f"\033[{self.drawn}F\033[J")
        self.out.write("\n".join(lines) + "\n")
        self.out.flush()
        self.drawn = len(lines)

    def event(self, text: str) -> None:
        """Print something that stays (the next table goes below it)."""
        self.out.write(text + "\n")
        self.out.flush()
        self.drawn = 0


def watch(table: Table, seconds: float, every: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(min(every, max(0.0, deadline - time.monotonic())))
        table.show()


def shell_lines(stack: Stack) -> list[str]:
    """What another shell needs to reach the demo, as lines to paste: a KUBECONFIG whose current
    context is in the demo's namespace (written next to the run's logs), and a PATH with kubectl
    and ``kubectl-modelroll`` (the plugin kubectl runs for ``kubectl modelroll``) on it."""
    cluster = stack.cluster
    assert cluster is not None
    config: dict[str, Any] = yaml.safe_load(cluster.kubeconfig.read_text())
    for context in config.get("contexts") or []:
        if context["name"] == config["current-context"]:
            context["context"]["namespace"] = stack.namespace
    kubeconfig = stack.run_dir / "kubeconfig"
    tmp = kubeconfig.with_suffix(".tmp")
    tmp.write_text(yaml.safe_dump(config, sort_keys=False))
    tmp.chmod(0o600)
    tmp.replace(kubeconfig)
    # The plugin is a console script of this virtualenv (`make venv`), next to the interpreter.
    dirs = dict.fromkeys(str(d) for d in (cluster.kubectl_path.parent, Path(sys.executable).parent))
    path = shlex.quote(os.pathsep.join(dirs))
    return [
        f"export KUBECONFIG={shlex.quote(str(kubeconfig))}   # namespace {stack.namespace}",
        f"export PATH={path}:$PATH   # kubectl, and kubectl-modelroll for `kubectl modelroll`",
    ]


def run(stack: Stack, out: TextIO, once: bool, every: float) -> None:
    say = Progress(out).say
    stable, canary = (spec.name for spec in ROLLOUT)
    stack.start()
    say("")
    say(f"Gateway:    {stack.gateway_url}/v1/models/{stack.model}/infer")
    if stack.prometheus is not None:
        say(f"Prometheus: {stack.prometheus.url}/graph (per-version series, 1 s scrapes)")
    shell = shell_lines(stack)
    say(f"kubectl:    {shell[0]}")
    say("")
    say(f"$ kubectl apply -f -   # {stable} at weight 9, {canary} at weight 1 (external mode)")
    say(stack.kubectl("apply", "-f", "-", input=stack.manifests_yaml()).stdout.rstrip())
    deadline = time.monotonic() + 30
    while {v["name"]: v["weight"] for v in _versions(stack)} != {stable: 9, canary: 1}:
        if time.monotonic() > deadline:
            raise ClusterError("the gateway did not route both versions within 30 s")
        time.sleep(0.05)
    say(f"$ kubectl get mv\n{stack.kubectl('get', 'mv').stdout.rstrip()}")
    say("")
    say(
        f"Traffic: rounds of {WINDOW} concurrent requests, {ROUNDS_PER_SECOND:.0f} rounds/s. "
        f"SHARE is the weight's share, OBSERVED what the gateway sent; BATCH the sidecar's mean "
        "batch size."
    )
    with Traffic(
        stack.gateway_url, stack.model, window=WINDOW, rounds_per_second=ROUNDS_PER_SECOND
    ) as traffic:
        table = Table(stack, traffic, out)
        watch(table, 3 * every, every)
        table.event(
            f"\n{canary} fails about 20% of its requests; blended with {stable} that is about 2%, "
            "which is why every figure is per version.\n"
            f"$ kubectl modelroll rollback {canary}   "
            f'# = kubectl patch mv {canary} --type merge -p \'{{"spec":{{"weight":0}}}}\''
        )
        started = time.monotonic()
        result = stack.plugin("rollback", canary)
        returned = time.monotonic()
        table.event(result.stdout.rstrip())
        watch(table, 2 * every, every)
        late = [r for r in traffic.since(started) if r.version == canary]
        last = max((r.done for r in late), default=started)
        table.event(
            f"\nRollback: {canary} answered its last request {(last - started) * 1000:.0f} ms "
            f"after the rollback started; the plugin returned after "
            f"{(returned - started) * 1000:.0f} ms (it waits for the operator's status). "
            f"Nothing was redeployed: {canary} still runs, dark."
        )
        if once:
            _prometheus_view(stack, table, canary)
            return
        commands = [
            *shell,
            "kubectl get mv",
            "kubectl modelroll status",
            f"kubectl modelroll promote {canary}",
        ]
        table.event(
            "Running until Ctrl-C. Try in another shell:\n"
            + "".join(f"  {line}\n" for line in commands)
        )
        while True:
            watch(table, every, every)


def _versions(stack: Stack) -> list[dict[str, object]]:
    model = stack.routes().get(stack.model) or {"versions": []}
    versions: list[dict[str, object]] = model["versions"]
    return versions


def _prometheus_view(stack: Stack, table: Table, canary: str) -> None:
    """What Prometheus recorded per version (the same series a Grafana panel plots)."""
    if stack.prometheus is None:
        return
    selector = f'namespace="{stack.namespace}", model="{stack.model}"'
    errors = stack.prometheus.by_label(
        f'sum by (version) (modelroll_requests_total{{{selector}, code=~"5..|422"}})'
    )
    totals = stack.prometheus.by_label(f"sum by (version) (modelroll_requests_total{{{selector}}})")
    if not totals:
        return
    ratios = ", ".join(
        f"{v} {errors.get(v, 0) / n:.1%} of {n:.0f}" for v, n in sorted(totals.items()) if n
    )
    table.event(f"Prometheus, error ratio per version since the start: {ratios}")


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="make demo", description=__doc__)
    parser.add_argument("--once", action="store_true", help="stop after the rollback, exit 0")
    parser.add_argument(
        "--every", type=float, default=2.0, help="seconds between two tables (2)", metavar="S"
    )
    parser.add_argument(
        "--keep-logs", action="store_true", help="keep the processes' logs (printed path)"
    )
    args = parser.parse_args(argv)
    out = sys.stdout
    for signum in (signal.SIGINT, signal.SIGTERM):  # SIGINT too: `&` in a script ignores it
        signal.signal(signum, _interrupt)
    run_dir = Path(tempfile.mkdtemp(prefix="modelroll-demo-"))
    stack = Stack(run_dir, prometheus="optional", progress=Progress(out))
    code = 0
    try:
        run(stack, out, args.once, args.every)
    except KeyboardInterrupt:
        out.write("\nInterrupted.\n")
    except (ClusterError, OSError, RuntimeError) as err:
        out.write(f"\nmake demo failed: {err}\n")
        code = 1
    finally:
        with Progress(out).step("Stopping every process the demo started"):
            stack.stop()
        if code or args.keep_logs:
            out.write(f"Logs: {stack.log_dir}\n")
        else:
            shutil.rmtree(run_dir, ignore_errors=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
