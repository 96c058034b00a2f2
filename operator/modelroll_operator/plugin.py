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
- ``rollback VERSION``: take VERSION's traffic away (weight 0) and, when VERSION holds the
  memory of the last promote, give the other versions back the weights they had right before it,
  then remove the memory. A version that no longer exists is skipped; a version created after
  the promote (not in the memory) keeps its weight; a version whose weight is no longer the 0 the
  promote left it at was changed since (set-weight, kubectl patch) and keeps its weight too (an
  explicit weight wins, as it always has). Each skip is printed. Rolling back a version that
  holds no memory only takes its traffic away.

Before the first patch, the whole plan is checked, so a command makes all of its patches or
none: every remembered weight must be an integer in 0..1000, and the API server validates every
patch in a server-side dry run. A malformed ``before-promote`` annotation makes rollback refuse,
``--force`` or not, naming the version and the annotation (``status`` shows the problem instead
of failing); so do two versions of one model holding a memory (an interrupted promote, a hand
edit). Only a change to the cluster between the dry run and the patches can stop a command
halfway; the error then says which patches were made and which were not.

The per-version ``modelroll.io/previous-weight`` annotation of older versions of the plugin is
not honoured: it holds a weight from *some* promote, and restoring it is how a rollback could
bring back weights from an older promote. ``status`` lists it, a rollback that refuses for lack
of a weighted version names its value, and any patch this plugin makes to a version removes
that version's.

promote refuses a version that is not Ready, and rollback refuses to leave the model with no
Ready, weighted version, since either would leave the gateway nothing to route to (``--force``
does it anyway). By default mutating commands wait until the operator has reconciled the
change (every patched version's status.observedGeneration caught up) and then print the model.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

from kubernetes.config import ConfigException

from modelroll_common.kube import KubeConfigError, connect
from modelroll_gateway.routes import MAX_WEIGHT

from .kube import UNREACHABLE, Api, KubeApiError, mv_path
from .spec import ANNOTATION_BEFORE_PROMOTE, ANNOTATION_PREVIOUS_WEIGHT, FIELD_MANAGER


class PluginError(Exception):
    """A command that cannot (or should not) be carried out; the message says why."""


def _shown(value: object, limit: int = 40) -> str:
    """A value as JSON, cut short: for messages about what an annotation holds."""
    try:
        text = json.dumps(value, ensure_ascii=False)
    except ValueError:  # a float that JSON cannot show
        text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


@dataclass(frozen=True)
class Memory:
    """What a promote remembered: every version's weight in the model right before it."""

    model: str
    weights: Mapping[str, int]
    at: str = ""
    """When the promote happened (UTC, RFC 3339), as the promoting machine's clock saw it."""

    def to_annotation(self) -> str:
        doc = {"model": self.model, "at": self.at, "weights": dict(sorted(self.weights.items()))}
        return json.dumps(doc, separators=(",", ":"))

    @classmethod
    def parse(cls, text: str) -> Memory:
        """The annotation's value; ValueError says what is wrong with it."""
        try:
            doc = json.loads(text)
        except RecursionError:
            raise ValueError("not JSON (nested too deeply)") from None
        except ValueError as exc:
            raise ValueError(f"not JSON ({exc})") from None
        if not isinstance(doc, dict):
            raise ValueError(f"expected a JSON object, found {_shown(doc)}")
        weights = doc.get("weights")
        if not isinstance(weights, dict) or not weights:
            found = _shown(weights)
            want = 'expected "weights": an object of version names to weights'
            raise ValueError(f"{want}, found {found}")
        for name, weight in weights.items():
            if not name:
                raise ValueError('an empty version name in "weights"')
            if isinstance(weight, bool) or not isinstance(weight, int):
                raise ValueError(f"the weight of {name} is {_shown(weight)}, not an integer")
            if not 0 <= weight <= MAX_WEIGHT:
                raise ValueError(f"the weight of {name} is {weight}, outside 0..{MAX_WEIGHT}")
        model, at = doc.get("model", ""), doc.get("at", "")
        if not isinstance(model, str) or not isinstance(at, str):
            raise ValueError(f'"model" and "at" must be strings, found {_shown([model, at])}')
        return cls(model=model, weights=dict(weights), at=at)


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
    deleting: bool
    memory: Memory | None = None
    """The weights its promote remembered (``modelroll.io/before-promote``), when usable."""
    memory_error: str | None = None
    """Why its ``modelroll.io/before-promote`` annotation cannot be used, when it has one."""
    legacy_weight: str | None = None
    """The raw value of the legacy ``modelroll.io/previous-weight`` annotation, if any."""

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> Version:
        """Never raises for what annotations hold: ``status`` must always work."""
        meta = body.get("metadata") or {}
        spec = body.get("spec") or {}
        status = body.get("status") or {}
        conditions = {c.get("type"): c for c in status.get("conditions") or []}
        ready = conditions.get("Ready") or {}
        routed = conditions.get("Routed") or {}
        annotations = meta.get("annotations") or {}
        memory, memory_error = None, None
        remembered = annotations.get(ANNOTATION_BEFORE_PROMOTE)
        if remembered is not None:
            try:
                memory = Memory.parse(str(remembered))
            except ValueError as exc:
                memory_error = str(exc)
        legacy = annotations.get(ANNOTATION_PREVIOUS_WEIGHT)
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
            deleting=bool(meta.get("deletionTimestamp")),
            memory=memory,
            memory_error=memory_error,
            legacy_weight=None if legacy is None else str(legacy),
        )

    @property
    def is_ready(self) -> bool:
        return self.ready == "True"

    @property
    def remembers(self) -> bool:
        """Whether it has a ``before-promote`` annotation at all, usable or not."""
        return self.memory is not None or self.memory_error is not None

    def stale_annotations(self) -> tuple[str, ...]:
        """The plugin's annotations a promote removes from the model's other versions."""
        found = (
            (ANNOTATION_BEFORE_PROMOTE, self.remembers),
            (ANNOTATION_PREVIOUS_WEIGHT, self.legacy_weight is not None),
        )
        return tuple(name for name, present in found if present)

    def legacy_annotation(self) -> tuple[str, ...]:
        return (ANNOTATION_PREVIOUS_WEIGHT,) if self.legacy_weight is not None else ()


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


def _weights(weights: Mapping[str, int]) -> str:
    return ", ".join(f"{name} {weight}" for name, weight in sorted(weights.items()))


def render_notes(versions: Sequence[Version], all_namespaces: bool = False) -> list[str]:
    """What the table cannot show: remembered weights, unusable and legacy annotations."""
    notes = []
    for v in sorted(versions, key=lambda v: (v.namespace, v.model, v.name)):
        who = f"{v.namespace}/{v.name}" if all_namespaces else v.name
        rollback = f"kubectl modelroll -n {v.namespace} rollback {v.name}"
        if v.memory is not None:
            when = f" at {v.memory.at}" if v.memory.at else ""
            notes.append(
                f"{who} was promoted{when}; the weights before: "
                f"{_weights(v.memory.weights)}. `{rollback}` gives them back."
            )
        elif v.memory_error is not None:
            notes.append(
                f"warning: {who}: annotation {ANNOTATION_BEFORE_PROMOTE} is "
                f"unusable: {v.memory_error}. `{rollback}` refuses until it is fixed or removed "
                f"(kubectl annotate -n {v.namespace} mv {v.name} {ANNOTATION_BEFORE_PROMOTE}-)."
            )
        if v.legacy_weight is not None:
            notes.append(
                f"note: {who}: annotation {ANNOTATION_PREVIOUS_WEIGHT}="
                f"{_shown(v.legacy_weight)} is from an older kubectl-modelroll; rollback no "
                "longer restores it (it cannot tell which promote it belongs to). The next "
                f"promote, rollback or set-weight that patches {v.name} removes it."
            )
    return notes


@dataclass(frozen=True)
class Change:
    """One patch of one version: its weight, and the plugin's annotations to set or remove."""

    version: str
    before: int
    after: int
    remember: str | None = None
    """A new ``before-promote`` document for this version (promote's target)."""
    forget: tuple[str, ...] = ()
    """Annotations to remove."""

    def patch(self) -> dict[str, Any]:
        annotations: dict[str, str | None] = dict.fromkeys(self.forget)
        if self.remember is not None:
            annotations[ANNOTATION_BEFORE_PROMOTE] = self.remember
        patch: dict[str, Any] = {"spec": {"weight": self.after}}
        if annotations:
            patch["metadata"] = {"annotations": annotations}
        return patch

    def describe(self) -> str:
        if self.before != self.after:
            return f"modelversion/{self.version} weight {self.before} -> {self.after}"
        what = [f"modelversion/{self.version} weight {self.after} (unchanged)"]
        if self.remember is not None:
            what.append(f"set {ANNOTATION_BEFORE_PROMOTE}")
        if self.forget:
            what.append(f"removed {', '.join(self.forget)}")
        return ", ".join(what)


@dataclass(frozen=True)
class Plan:
    """Every patch a command makes, in order, and what it deliberately leaves alone."""

    model: str
    changes: list[Change] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def check_plan(plan: Plan) -> None:
    """What must hold before the first patch (an error here is a bug, not a user's mistake)."""
    names = [c.version for c in plan.changes]
    if len(set(names)) != len(names):
        raise PluginError(f"internal error: a plan patches a version twice: {names}")
    for change in plan.changes:
        if not 0 <= change.after <= MAX_WEIGHT:
            raise PluginError(
                f"internal error: the plan gives {change.version} weight {change.after}, "
                f"outside 0..{MAX_WEIGHT}; nothing was changed"
            )
        if change.remember is not None:
            try:
                Memory.parse(change.remember)
            except ValueError as exc:
                raise PluginError(f"internal error: the plan's memory is unusable: {exc}") from exc


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def plan_promote(target: Version, siblings: Sequence[Version], force: bool, at: str = "") -> Plan:
    """Target first (traffic never drops to nothing on the way), then the others to 0.

    The target remembers every version's weight; the others lose any memory of an older promote.
    """
    plan = Plan(target.model)
    weighted = [s for s in siblings if s.weight > 0]
    if not weighted and target.weight > 0:
        return plan  # it has all the traffic already: nothing to change, nothing to remember
    if not target.is_ready and not force:
        raise PluginError(
            f"{target.name} is not Ready ({target.ready_reason}: {target.ready_message}); "
            f"promoting it would leave model {target.model} with nothing to route to. "
            "Use --force to promote it anyway."
        )
    total = target.weight + sum(s.weight for s in siblings)
    new = min(MAX_WEIGHT, max(total, 1))
    before = {v.name: v.weight for v in (target, *siblings)}
    memory = Memory(target.model, before, at)
    plan.changes.append(
        Change(target.name, target.weight, new, memory.to_annotation(), target.legacy_annotation())
    )
    for s in sorted(siblings, key=lambda s: s.name):
        forget = s.stale_annotations()
        if s.weight > 0 or forget:
            plan.changes.append(Change(s.name, s.weight, 0, forget=forget))
    check_plan(plan)
    return plan


def plan_rollback(target: Version, siblings: Sequence[Version], force: bool) -> Plan:
    """The remembered weights of the others first, then the target to 0 (forgetting)."""
    ns = f"-n {target.namespace} " if target.namespace else ""
    if target.memory_error is not None:
        raise PluginError(
            f"cannot roll back {target.name}: its annotation {ANNOTATION_BEFORE_PROMOTE}, the "
            f"weights before its promote, is unusable: {target.memory_error}. Nothing was "
            f"changed. Fix the annotation or remove it (kubectl annotate {ns}mv {target.name} "
            f"{ANNOTATION_BEFORE_PROMOTE}-), then roll back again; to take {target.name}'s "
            f"traffic away now without restoring anything: kubectl modelroll {ns}set-weight "
            f"{target.name} 0"
        )
    memory = target.memory
    plan = Plan(target.model)
    others = [s for s in siblings if s.remembers]
    if memory is not None and others:
        raise PluginError(
            f"cannot roll back {target.name}: besides it, {', '.join(s.name for s in others)} "
            f"of model {target.model} also hold{'s' if len(others) == 1 else ''} "
            f"{ANNOTATION_BEFORE_PROMOTE}, so which promote was the last is unclear (an "
            "interrupted promote, or a hand edit). Nothing was changed. Remove the stale one "
            f"(kubectl annotate {ns}mv NAME {ANNOTATION_BEFORE_PROMOTE}-), then roll back again."
        )
    if memory is not None and memory.model and memory.model != target.model:
        raise PluginError(
            f"cannot roll back {target.name}: its {ANNOTATION_BEFORE_PROMOTE} remembers model "
            f"{memory.model}, but {target.name} now belongs to model {target.model}. Nothing "
            f"was changed. Remove the annotation (kubectl annotate {ns}mv {target.name} "
            f"{ANNOTATION_BEFORE_PROMOTE}-) and set the weights with set-weight."
        )
    restore: list[Change] = []
    if memory is not None:
        present = {s.name: s for s in siblings}
        for name, weight in sorted(memory.weights.items()):
            s = present.get(name)
            if name == target.name or (s is not None and s.weight == weight):
                continue
            if s is None:
                plan.notes.append(
                    f"{name} (weight {weight} before the promote) no longer exists: skipped"
                )
            elif s.weight != 0:
                plan.notes.append(
                    f"{name} keeps weight {s.weight}: it was changed after the promote of "
                    f"{target.name} (it had {weight} before it)"
                )
            else:
                restore.append(Change(name, s.weight, weight, forget=s.legacy_annotation()))
        plan.notes.extend(
            f"{s.name} keeps weight {s.weight}: it was created after the promote of {target.name}"
            for s in sorted(siblings, key=lambda s: s.name)
            if s.name not in memory.weights and s.weight > 0
        )
    elif others and target.weight > 0:
        plan.notes.append(
            f"{target.name} holds no memory of a promote; the last promote of model "
            f"{target.model} was of {others[0].name} (kubectl modelroll {ns}rollback "
            f"{others[0].name} undoes it)"
        )
    forget = target.stale_annotations()
    if target.weight == 0 and not restore:
        if forget:  # no traffic moves: only the used-up memory goes
            plan.changes.append(Change(target.name, 0, 0, forget=forget))
        return plan
    after = {s.name: s.weight for s in siblings} | {c.version: c.after for c in restore}
    serving = [s for s in siblings if s.is_ready and after[s.name] > 0]
    if not serving and not force:
        source = (
            f"the weights remembered by {target.name}'s promote give none"
            if memory is not None
            else f"{target.name} holds no memory of a promote to restore "
            f"(annotation {ANNOTATION_BEFORE_PROMOTE})"
        )
        legacy = ", ".join(
            f"{s.name} has {ANNOTATION_PREVIOUS_WEIGHT}={_shown(s.legacy_weight)}"
            for s in siblings
            if s.legacy_weight is not None
        )
        if legacy:
            legacy = (
                f"An older kubectl-modelroll left weights that are no longer restored, since "
                f"they cannot tell which promote they belong to: {legacy}. "
            )
        raise PluginError(
            f"rolling back {target.name} would leave model {target.model} with no Ready "
            f"version that has weight: {source}, and no other Ready version has a weight. "
            f"{legacy}Nothing was changed. Give one a weight first (kubectl modelroll "
            f"{ns}set-weight VERSION WEIGHT), or use --force."
        )
    plan.changes.extend([*restore, Change(target.name, target.weight, 0, forget=forget)])
    check_plan(plan)
    return plan


def plan_set_weight(target: Version, weight: int) -> Plan:
    """One patch; it also removes the version's legacy annotation.

    Nothing else is forgotten: a rollback gives a remembered weight back only to a version still
    at the 0 its promote left, so a weight set after the promote wins.
    """
    change = Change(target.name, target.weight, weight, forget=target.legacy_annotation())
    return Plan(target.model, [change])


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
            "PATCH", mv_path(self.namespace, change.version), change.patch(),
            "application/merge-patch+json", params,
        )  # fmt: skip

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
            self.wait_reconciled(generations, wait)
            self.status(plan.model, all_namespaces=False)

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
        self.apply(plan_set_weight(self.get(name), weight), wait)

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
