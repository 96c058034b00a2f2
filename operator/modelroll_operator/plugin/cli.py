"""`kubectl-modelroll` (run as `kubectl modelroll ...`): look at and move a model's traffic.

Every command is a patch of ModelVersion resources, never a redeploy: the operator turns the new
weights into routes and the gateway follows within a second.

- ``status [MODEL]``: a table per model of its versions, weight, share, Ready and Routed; below
  it, what the last promote remembered and any annotation the plugin cannot use.
- ``set-weight VERSION WEIGHT``: set one version's spec.weight. It forgets nothing: a weight set
  after a promote wins anyway (see rollback), and a version with an unusable memory can always
  be given a weight this way.
- ``promote VERSION``: give VERSION all of its model's traffic. It gets the sum of the model's
  weights (at least 1, at most 1000) and every other version gets 0. The weight of *every*
  version of the model right before the promote is kept, as one JSON document, in VERSION's
  ``modelroll.io/before-promote`` annotation; the promote removes that annotation (usable or
  not) from the model's other versions, so a model remembers one promote: the last one. A
  promote that changes nothing (VERSION has all the traffic already) remembers nothing.
- ``rollback VERSION``: when VERSION holds the memory of the last promote, give every version
  back the weight it had right before it (VERSION's own included: promote then rollback of a
  canary is 90/10 again), then remove the memory. A version that no longer exists is skipped;
  a version created after the promote (not in the memory) keeps its weight; a version whose
  weight is no longer the 0 the promote left it at was changed since (set-weight, kubectl patch)
  and keeps its weight too (an explicit weight wins, as it always has). Each skip is printed.
  Rolling back a version that holds no memory only takes its traffic away (weight 0).
- ``analysis status|resume|abort|skip VERSION``: a canary's analysis (analysis.py).

Before the first patch, the whole plan is checked, so a command makes all of its patches or
none: every remembered weight must be an integer in 0..1000, and the API server validates every
patch in a server-side dry run. A malformed ``before-promote`` annotation makes rollback refuse,
``--force`` or not, naming the version and the annotation (``status`` shows the problem instead
of failing); so do two versions of one model holding a memory (an interrupted promote, a hand
edit). Only a change to the cluster between the dry run and the patches can stop a command
halfway; the error then says which patches were made and which were not.

set-weight, promote and rollback share one guard rail (``plans.guard``): a command that changes
a weight refuses to leave the model with no Ready version that has weight, since the gateway
would then have nothing to route it to and answer 503 (``--force`` does it anyway). So promote
refuses a version that is not Ready, rollback one whose model has no other Ready version with
weight, and ``set-weight V 0`` the only Ready, weighted version.

By default mutating commands wait until the operator has reconciled the change (every patched
version's status.observedGeneration caught up) and, while a version's new share waits for its
replicas (scale before shift), say what it waits for until the weights are in force or the
wait is over; then they print the model.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

from kubernetes.config import ConfigException

from modelroll_common.kube import KubeConfigError, connect

from ..api import UNREACHABLE, Api, KubeApiError, mv_path
from ..spec import FIELD_MANAGER
from . import analysis
from .plans import (
    Change,
    Plan,
    PluginError,
    Version,
    now,
    plan_promote,
    plan_rollback,
    plan_set_weight,
    render_notes,
    render_table,
)


class Plugin:
    """The commands, over one API client (blocking calls: this is a command-line tool)."""

    def __init__(self, api: Api, namespace: str, out: TextIO) -> None:
        self.api = api
        self.namespace = namespace
        self.out = out

    def versions(self, namespace: str | None) -> list[Version]:
        doc = self.api.call("GET", mv_path(namespace))
        return [Version.from_body(item) for item in doc.get("items") or []]

    def _body(self, name: str) -> dict[str, Any] | None:
        try:
            return self.api.call("GET", mv_path(self.namespace, name))
        except KubeApiError as exc:
            if exc.status == 404:
                return None
            raise

    def get(self, name: str) -> Version:
        body = self._body(name)
        if body is None:
            raise PluginError(f'ModelVersion "{name}" not found in namespace {self.namespace}')
        return Version.from_body(body)

    def model_of(self, name: str) -> tuple[Version, list[Version]]:
        target = self.get(name)
        siblings = [
            v
            for v in self.versions(self.namespace)
            if v.model == target.model and v.name != target.name and not v.deleting
        ]
        return target, siblings

    def status(self, model: str | None, all_namespaces: bool) -> None:
        versions = self.versions(None if all_namespaces else self.namespace)
        if model:
            versions = [v for v in versions if v.model == model]
        if not versions:
            where = "any namespace" if all_namespaces else f"namespace {self.namespace}"
            what = f"model {model}" if model else "any model"
            self.out.write(f"No ModelVersions of {what} in {where}.\n")
            return
        self.out.write(render_table(versions, all_namespaces) + "\n")
        notes = render_notes(versions, all_namespaces)
        if notes:
            self.out.write("\n" + "\n".join(notes) + "\n")

    def _patch(self, change: Change, dry_run: bool) -> dict[str, Any]:
        params = {"fieldManager": FIELD_MANAGER}
        if dry_run:
            params["dryRun"] = "All"
        return self.api.call(
            "PATCH",
            mv_path(self.namespace, change.version),
            change.patch(),
            "application/merge-patch+json",
            params,
        )

    def apply(self, plan: Plan, wait: float) -> None:
        """Dry-run every patch, then patch in order, then wait for the operator and show."""
        for note in plan.notes:
            self.out.write(f"note: {note}\n")
        if not plan.changes:
            self.out.write(f"Nothing to change in model {plan.model}.\n")
            return
        for change in plan.changes:  # the API server validates all of it before anything changes
            try:
                self._patch(change, dry_run=True)
            except KubeApiError as exc:
                if exc.status == 401 or len(plan.changes) == 1:
                    raise
                raise PluginError(
                    f"the API server refuses the patch of {change.version} ({change.describe()}):"
                    f" {exc.message}. Nothing was changed."
                ) from exc
        generations: dict[str, int] = {}
        for i, change in enumerate(plan.changes):
            try:
                body = self._patch(change, dry_run=False)
            except (KubeApiError, *UNREACHABLE) as exc:
                if i == 0:
                    raise
                why = exc.message if isinstance(exc, KubeApiError) else str(exc)
                made = "; ".join(c.describe() for c in plan.changes[:i])
                left = "; ".join(c.describe() for c in plan.changes[i:])
                raise PluginError(
                    f"patching {change.version} failed after the dry run passed (did something "
                    f"else change model {plan.model} meanwhile?): {why}. Made: {made}. Not made: "
                    f"{left}. Check `kubectl modelroll -n {self.namespace} status {plan.model}` "
                    "and set the weights that are missing with set-weight."
                ) from exc
            generations[change.version] = int(body["metadata"].get("generation") or 0)
            self.out.write(change.describe() + "\n")
        if wait > 0:
            deadline = time.monotonic() + wait
            self.wait_reconciled(generations, wait)
            self.wait_in_force(plan.model, deadline)
            self.status(plan.model, all_namespaces=False)

    def wait_in_force(self, model: str, deadline: float) -> None:
        """Until the model's new weights are in force, or ``deadline``: say what they wait for
        (the replicas a version's new share needs), each time that changes."""
        said: dict[str, str] = {}
        while True:
            versions = [v for v in self.versions(self.namespace) if v.model == model]
            waiting = {v.name: v.waiting_for for v in versions if v.waiting_for is not None}
            if not waiting:
                return
            for name, what in sorted(waiting.items()):
                if said.get(name) != what:
                    self.out.write(f"waiting: {name}: {what}\n")
                    self.out.flush()
            said = {n: str(w) for n, w in waiting.items()}
            if time.monotonic() > deadline:
                self.out.write(
                    "note: the new weights go in force once those replicas are ready; "
                    f"`kubectl get mv -n {self.namespace} -w` shows when\n"
                )
                return
            time.sleep(0.5)

    def wait_reconciled(self, generations: Mapping[str, int], within: float) -> None:
        deadline = time.monotonic() + within
        while True:
            behind = [
                name
                for name, generation in generations.items()
                if self._observed(name) < generation
            ]
            if not behind:
                return
            if time.monotonic() > deadline:
                raise PluginError(
                    f"the operator has not reconciled {', '.join(behind)} within {within:g}s "
                    "(is modelroll-operator running?); the weights are set and will apply "
                    "once it does"
                )
            time.sleep(0.2)

    def _observed(self, name: str) -> int:
        body = self._body(name)
        if body is None:
            return 1 << 62  # gone: nothing to wait for
        return int((body.get("status") or {}).get("observedGeneration") or 0)

    def set_weight(self, name: str, weight: int, force: bool, wait: float) -> None:
        target, siblings = self.model_of(name)
        self.apply(plan_set_weight(target, siblings, weight, force), wait)

    def promote(self, name: str, force: bool, wait: float) -> None:
        target, siblings = self.model_of(name)
        self.apply(plan_promote(target, siblings, force, at=now()), wait)

    def rollback(self, name: str, force: bool, wait: float) -> None:
        target, siblings = self.model_of(name)
        self.apply(plan_rollback(target, siblings, force), wait)


def _connection_flags(parser: argparse.ArgumentParser, suppress: bool) -> None:
    """-n, --kubeconfig and --context, before or after the command (``status -n prod``)."""
    default: dict[str, Any] = {"default": argparse.SUPPRESS} if suppress else {}
    parser.add_argument(
        "-n", "--namespace", help="namespace (default: the kubeconfig context's)", **default
    )
    parser.add_argument(
        "--kubeconfig",
        type=Path,
        help="kubeconfig file (default: $KUBECONFIG, else ~/.kube/config, else in-cluster)",
        **default,
    )
    parser.add_argument(
        "--context", help="kubeconfig context to use (default: the current context)", **default
    )


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="kubectl modelroll",
        description="Show and shift traffic between the versions of a model. Every change is "
        "a ModelVersion patch; nothing is redeployed.",
    )
    _connection_flags(p, suppress=False)
    common = argparse.ArgumentParser(add_help=False)
    _connection_flags(common, suppress=True)
    commands = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    status = commands.add_parser(
        "status",
        parents=[common],
        help="each model's versions: weight, share, Ready, Routed; the HTTPRoute routing a "
        "model and whether its Gateways accept it; what the last promote remembered",
    )
    status.add_argument("model", nargs="?", help="only this model")
    status.add_argument("-A", "--all-namespaces", action="store_true", help="every namespace")

    def mutating(name: str, help: str) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, parents=[common], help=help, description=help)
        sub.add_argument("version", help="the ModelVersion's name")
        sub.add_argument(
            "--force",
            action="store_true",
            help="make the change even if it leaves the model no Ready version with weight "
            "above 0 (the gateway then answers 503 for the model; never past an unusable "
            "memory)",
        )
        sub.add_argument(
            "--wait",
            type=float,
            default=30.0,
            metavar="SECONDS",
            help="seconds to wait until the operator has reconciled the change, then print "
            "the model; 0: do not wait (default: %(default)g)",
        )
        return sub

    weight = mutating("set-weight", "set one version's spec.weight (0..1000)")
    weight.add_argument("weight", type=int, help="the new weight")
    mutating(
        "promote",
        "give a version all of its model's traffic (others to weight 0), every version's "
        "weight remembered",
    )
    mutating(
        "rollback",
        "restore the weights from before the version's promote, its own included (without such "
        "a memory: the version to weight 0)",
    )
    analysing = commands.add_parser(
        "analysis",
        parents=[common],
        help="a canary's analysis: status, or resume, abort (roll back), skip (a step)",
        description="A canary's analysis (spec.analysis): show it, resume it after a pause, "
        "abort it (roll back), or skip the current step.",
    )
    analysing.add_argument(
        "action",
        choices=analysis.VERBS,
        help="status: phase, step, the weights it set, and per check the counts of both arms, "
        "the ratio, the test statistic and the verdict; resume: go on after a pause (past a "
        "step marked pause, the next step; after a weight changed by hand, this step again "
        "with its weights); abort: roll the canary back now (weight 0, the baseline's weight "
        "from before); skip: the next step (or the promotion) without judging this one",
    )
    analysing.add_argument("version", help="the canary's ModelVersion")
    analysing.add_argument(
        "--wait",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="seconds to wait until the operator has acted on the command (an annotation, "
        "modelroll.io/analysis-command, done once); 0: do not wait (default: %(default)g)",
    )
    return p


def run(args: argparse.Namespace, out: TextIO) -> None:
    client, namespace = connect(args.kubeconfig, args.context)
    with client:
        plugin = Plugin(Api(client, permissions=None), args.namespace or namespace, out)
        match args.command:
            case "status":
                plugin.status(args.model, args.all_namespaces)
            case "set-weight":
                plugin.set_weight(args.version, args.weight, args.force, args.wait)
            case "promote":
                plugin.promote(args.version, args.force, args.wait)
            case "rollback":
                plugin.rollback(args.version, args.force, args.wait)
            case "analysis":
                api, where = plugin.api, plugin.namespace
                if args.action == "status":
                    body = api.call("GET", mv_path(where, args.version))
                    out.write(analysis.render(body) + "\n")
                else:
                    text = analysis.command(api, where, args.version, args.action, args.wait)
                    out.write(text + "\n")


def main(argv: Sequence[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    try:
        run(args, sys.stdout)
    except PluginError as exc:
        sys.exit(f"error: {exc}")
    except KubeApiError as exc:
        if exc.status == 401:
            sys.exit(
                "error: the API server refused the credentials (401 Unauthorized): check the "
                "kubeconfig's user; a failing exec credential plugin prints its own error above"
            )
        sys.exit(f"error: {exc.message}")
    except (KubeConfigError, ConfigException) as exc:
        sys.exit(f"error: {exc}")
    except UNREACHABLE as exc:
        sys.exit(f"error: cannot reach the API server: {exc}")


if __name__ == "__main__":
    main()
