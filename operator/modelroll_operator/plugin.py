"""`kubectl-modelroll` (run as `kubectl modelroll ...`): look at and move a model's traffic.

Every command is a patch of ModelVersion resources, never a redeploy: the operator turns the new
weights into routes and the gateway follows within a second.

- ``status [MODEL]``: a table per model of its versions, weight, share, Ready and Routed.
- ``set-weight VERSION WEIGHT``: set one version's spec.weight (and forget its remembered
  weight: an explicit weight wins over what the last promote saved).
- ``promote VERSION``: give VERSION all of its model's traffic. It gets the sum of the model's
  weights (at least 1, at most 1000) and every other version gets 0. Each version's weight before
  the change is kept in its ``modelroll.io/previous-weight`` annotation.
- ``rollback VERSION``: take VERSION's traffic away (weight 0) and give the other versions back
  the weights they had before the last promote (from that annotation).

promote refuses a version that is not Ready, and rollback refuses to leave the model with no
Ready, weighted version, since either would leave the gateway nothing to route to (``--force``
does it anyway). By default mutating commands wait until the operator has reconciled the
change (every patched version's status.observedGeneration caught up) and then print the model.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from kubernetes.config import ConfigException

from modelroll_common.kube import KubeConfigError, connect
from modelroll_gateway.routes import MAX_WEIGHT

from .kube import UNREACHABLE, Api, KubeApiError, mv_path
from .spec import ANNOTATION_PREVIOUS_WEIGHT, FIELD_MANAGER


class PluginError(Exception):
    """A command that cannot (or should not) be carried out; the message says why."""


@dataclass(frozen=True)
class Version:
    """What the plugin needs of one ModelVersion."""

    namespace: str
    name: str
    model: str
    weight: int
    generation: int
    share: str
    ready: str
    ready_reason: str
    ready_message: str
    routed: str
    endpoint: str
    previous_weight: int | None
    deleting: bool

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> Version:
        meta = body.get("metadata") or {}
        spec = body.get("spec") or {}
        status = body.get("status") or {}
        conditions = {c.get("type"): c for c in status.get("conditions") or []}
        ready = conditions.get("Ready") or {}
        routed = conditions.get("Routed") or {}
        previous = (meta.get("annotations") or {}).get(ANNOTATION_PREVIOUS_WEIGHT)
        return cls(
            namespace=str(meta.get("namespace") or ""),
            name=str(meta.get("name") or ""),
            model=str(spec.get("model") or ""),
            weight=int(spec.get("weight") or 0),
            generation=int(meta.get("generation") or 0),
            share=str(status.get("share") or "-"),
            ready=str(ready.get("status") or "Unknown"),
            ready_reason=str(ready.get("reason") or "NotReconciled"),
            ready_message=str(ready.get("message") or "the operator has not reported yet"),
            routed=str(routed.get("reason") or "-"),
            endpoint=str(status.get("endpoint") or spec.get("endpoint") or "-"),
            previous_weight=int(previous) if previous and previous.isdigit() else None,
            deleting=bool(meta.get("deletionTimestamp")),
        )

    @property
    def is_ready(self) -> bool:
        return self.ready == "True"


def render_table(versions: Sequence[Version], all_namespaces: bool = False) -> str:
    """Rows grouped by model (then version name), columns aligned like kubectl's."""
    header = ["MODEL", "VERSION", "WEIGHT", "SHARE", "READY", "ROUTED", "ENDPOINT"]
    if all_namespaces:
        header.insert(0, "NAMESPACE")
    rows = [header]
    for v in sorted(versions, key=lambda v: (v.namespace, v.model, v.name)):
        row = [v.model, v.name, str(v.weight), v.share, v.ready, v.routed, v.endpoint]
        if all_namespaces:
            row.insert(0, v.namespace)
        rows.append(row)
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = ["   ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    return "\n".join(lines)


@dataclass(frozen=True)
class WeightChange:
    version: str
    before: int
    after: int
    remember: bool
    """Whether ``before`` goes into the previous-weight annotation (else the annotation goes)."""


def plan_promote(target: Version, siblings: Sequence[Version], force: bool) -> list[WeightChange]:
    """Target first (traffic never drops to nothing on the way), then the others to 0."""
    weighted = [s for s in siblings if s.weight > 0]
    if not weighted and target.weight > 0:
        return []
    if not target.is_ready and not force:
        raise PluginError(
            f"{target.name} is not Ready ({target.ready_reason}: {target.ready_message}); "
            f"promoting it would leave model {target.model} with nothing to route to. "
            "Use --force to promote it anyway."
        )
    total = target.weight + sum(s.weight for s in siblings)
    new = min(MAX_WEIGHT, max(total, 1))
    changes = [WeightChange(target.name, target.weight, new, remember=True)]
    changes += [WeightChange(s.name, s.weight, 0, remember=True) for s in weighted]
    return changes


def plan_rollback(target: Version, siblings: Sequence[Version], force: bool) -> list[WeightChange]:
    """The others' remembered weights first, then the target to 0."""
    restore = [
        WeightChange(s.name, s.weight, previous, remember=False)
        for s in siblings
        if (previous := s.previous_weight or 0) > 0 and s.weight == 0
    ]
    if target.weight == 0 and not restore:
        return []
    after = {s.name: s.weight for s in siblings} | {c.version: c.after for c in restore}
    serving = [s for s in siblings if s.is_ready and after[s.name] > 0]
    if not serving and not force:
        raise PluginError(
            f"rolling back {target.name} would leave model {target.model} with no Ready "
            "version that has weight (no other version has a weight, or one remembered in "
            f"{ANNOTATION_PREVIOUS_WEIGHT}). Give one a weight with set-weight first, "
            "or use --force."
        )
    return [*restore, WeightChange(target.name, target.weight, 0, remember=True)]


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

    def apply(self, model: str, changes: Sequence[WeightChange], wait: float) -> None:
        """Patch the weights in order, then wait for the operator and show the model."""
        if not changes:
            self.out.write(f"Nothing to change in model {model}.\n")
            return
        generations: dict[str, int] = {}
        for change in changes:
            annotation = str(change.before) if change.remember else None
            patch = {
                "metadata": {"annotations": {ANNOTATION_PREVIOUS_WEIGHT: annotation}},
                "spec": {"weight": change.after},
            }
            body = self.api.call(
                "PATCH", mv_path(self.namespace, change.version), patch,
                "application/merge-patch+json", {"fieldManager": FIELD_MANAGER},
            )  # fmt: skip
            generations[change.version] = int(body["metadata"].get("generation") or 0)
            self.out.write(
                f"modelversion/{change.version} weight {change.before} -> {change.after}\n"
            )
        if wait > 0:
            self.wait_reconciled(generations, wait)
            self.status(model, all_namespaces=False)

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

    def set_weight(self, name: str, weight: int, wait: float) -> None:
        target = self.get(name)
        change = WeightChange(name, target.weight, weight, remember=False)
        self.apply(target.model, [change], wait)

    def promote(self, name: str, force: bool, wait: float) -> None:
        target, siblings = self.model_of(name)
        self.apply(target.model, plan_promote(target, siblings, force), wait)

    def rollback(self, name: str, force: bool, wait: float) -> None:
        target, siblings = self.model_of(name)
        self.apply(target.model, plan_rollback(target, siblings, force), wait)


def _connection_flags(parser: argparse.ArgumentParser, suppress: bool) -> None:
    """-n, --kubeconfig and --context, before or after the command (``status -n prod``)."""
    default: dict[str, Any] = {"default": argparse.SUPPRESS} if suppress else {}
    parser.add_argument(
        "-n", "--namespace", help="namespace (default: the kubeconfig context's)", **default
    )
    parser.add_argument(
        "--kubeconfig", type=Path, help="kubeconfig file (default: $KUBECONFIG)", **default
    )
    parser.add_argument("--context", help="kubeconfig context to use", **default)


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
        "status", parents=[common], help="the versions of each model: weight, share, ready"
    )
    status.add_argument("model", nargs="?", help="only this model")
    status.add_argument("-A", "--all-namespaces", action="store_true", help="every namespace")

    def mutating(name: str, help: str) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, parents=[common], help=help, description=help)
        sub.add_argument("version", help="the ModelVersion's name")
        sub.add_argument(
            "--wait",
            type=float,
            default=30.0,
            metavar="SECONDS",
            help="wait this long for the operator to reconcile the change; 0: do not wait (30)",
        )
        return sub

    weight = mutating("set-weight", "set a version's routing weight (0..1000)")
    weight.add_argument("weight", type=int, help="the new weight")
    for name, help in (
        ("promote", "give a version all of its model's traffic (others to weight 0)"),
        ("rollback", "take a version's traffic away and restore the weights before promote"),
    ):
        sub = mutating(name, help)
        sub.add_argument(
            "--force", action="store_true", help="even if no Ready version would get traffic"
        )
    return p


def run(args: argparse.Namespace, out: TextIO) -> None:
    client, namespace = connect(args.kubeconfig, args.context)
    with client:
        plugin = Plugin(Api(client), args.namespace or namespace, out)
        match args.command:
            case "status":
                plugin.status(args.model, args.all_namespaces)
            case "set-weight":
                plugin.set_weight(args.version, args.weight, args.wait)
            case "promote":
                plugin.promote(args.version, args.force, args.wait)
            case "rollback":
                plugin.rollback(args.version, args.force, args.wait)


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
