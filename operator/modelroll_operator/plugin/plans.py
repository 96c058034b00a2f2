"""The plugin's plans: what promote, rollback and set-weight would patch, decided from the
model's versions alone, and checked whole before the first patch (see plugin/cli.py for the rules).

Nothing here talks to the API server: every function is a pure function of ModelVersion bodies,
so the unit tests exercise every rule without a cluster.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from modelroll_common.routes import MAX_WEIGHT, format_share

from ..spec import ANNOTATION_BEFORE_PROMOTE


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
    routed_weight: int | None
    """The weight its model's route in force gives it (status.routedWeight); None when it is
    not in the route."""
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
    httproute: str | None = None
    """The HTTPRoute that routes its model, when one claims it."""
    acceptance: str = ""
    """That route's HTTPRouteAccepted condition: its status and message."""
    waiting_for: str | None = None
    """What its new weight waits for (a False Capacity condition's message), if it waits."""

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> Version:
        """Never raises for what annotations hold: ``status`` must always work."""
        meta = body.get("metadata") or {}
        spec = body.get("spec") or {}
        status = body.get("status") or {}
        conditions = {c.get("type"): c for c in status.get("conditions") or []}
        ready = conditions.get("Ready") or {}
        routed = conditions.get("Routed") or {}
        accepted = conditions.get("HTTPRouteAccepted") or {}
        capacity = conditions.get("Capacity") or {}
        annotations = meta.get("annotations") or {}
        memory, memory_error = None, None
        remembered = annotations.get(ANNOTATION_BEFORE_PROMOTE)
        if remembered is not None:
            try:
                memory = Memory.parse(str(remembered))
            except ValueError as exc:
                memory_error = str(exc)
        return cls(
            namespace=str(meta.get("namespace") or ""),
            name=str(meta.get("name") or ""),
            model=str(spec.get("model") or ""),
            weight=int(spec.get("weight") or 0),
            generation=int(meta.get("generation") or 0),
            routed_weight=weight if isinstance(weight := status.get("routedWeight"), int) else None,
            ready=str(ready.get("status") or "Unknown"),
            ready_reason=str(ready.get("reason") or "NotReconciled"),
            ready_message=str(ready.get("message") or "the operator has not reported yet"),
            routed=str(routed.get("reason") or "-"),
            endpoint=str(status.get("endpoint") or spec.get("endpoint") or "-"),
            deleting=bool(meta.get("deletionTimestamp")),
            memory=memory,
            memory_error=memory_error,
            httproute=str(status["httpRoute"]) if status.get("httpRoute") else None,
            acceptance=(
                f"{accepted.get('status')}: {accepted.get('message')}" if accepted else "Unknown"
            ),
            waiting_for=(
                str(capacity.get("message") or capacity.get("reason"))
                if capacity.get("status") == "False"
                else None
            ),
        )

    def share(self, total: int) -> str:
        """Its share of its model's traffic, ``total`` the routed weights of the model's
        versions added up; "-" when it is not in the route."""
        if self.routed_weight is None or self.deleting:
            return "-"
        return format_share(self.routed_weight / total if total else 0.0)

    @property
    def is_ready(self) -> bool:
        return self.ready == "True"

    @property
    def remembers(self) -> bool:
        """Whether it has a ``before-promote`` annotation at all, usable or not."""
        return self.memory is not None or self.memory_error is not None

    def stale_annotations(self) -> tuple[str, ...]:
        """The plugin's annotations a promote removes from the model's other versions."""
        return (ANNOTATION_BEFORE_PROMOTE,) if self.remembers else ()


def render_table(versions: Sequence[Version], all_namespaces: bool = False) -> str:
    """Rows grouped by model (then version name), columns aligned like kubectl's. SHARE is
    each version's routed weight over its model's (statuses hold only the weight: a share
    moves whenever a sibling's weight does)."""
    header = ["MODEL", "VERSION", "WEIGHT", "SHARE", "READY", "ROUTED", "ENDPOINT"]
    if all_namespaces:
        header.insert(0, "NAMESPACE")
    rows = [header]
    totals: Counter[tuple[str, str]] = Counter()
    for v in versions:
        if v.routed_weight is not None and not v.deleting:
            totals[v.namespace, v.model] += v.routed_weight
    for v in sorted(versions, key=lambda v: (v.namespace, v.model, v.name)):
        share = v.share(totals[v.namespace, v.model])
        row = [v.model, v.name, str(v.weight), share, v.ready, v.routed, v.endpoint]
        if all_namespaces:
            row.insert(0, v.namespace)
        rows.append(row)
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = ["   ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    return "\n".join(lines)


def _weights(weights: Mapping[str, int]) -> str:
    return ", ".join(f"{name} {weight}" for name, weight in sorted(weights.items()))


def render_notes(versions: Sequence[Version], all_namespaces: bool = False) -> list[str]:
    """What the table cannot show: the HTTPRoute routing a model and whether its Gateways
    accepted it, what a model's new weights wait for, remembered weights, and unusable
    annotations."""
    notes = []
    claimed = {(v.namespace, v.model): v for v in versions if v.httproute}
    for (namespace, model), v in sorted(claimed.items()):
        which = f"{namespace}/{model}" if all_namespaces else model
        notes.append(
            f"Model {which} is routed by HTTPRoute {v.httproute}; accepted by its Gateways: "
            f"{v.acceptance}"
        )
    for v in sorted(versions, key=lambda v: (v.namespace, v.model, v.name)):
        who = f"{v.namespace}/{v.name}" if all_namespaces else v.name
        if v.waiting_for is not None:
            notes.append(f"{who}: the weights of model {v.model} wait: {v.waiting_for}")
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


def guard(
    plan: Plan,
    target: Version,
    siblings: Sequence[Version],
    force: bool,
    doing: str,
    why: str = "",
) -> None:
    """The one rule of every command that moves weight (set-weight, promote, rollback).

    A plan that changes any version's weight must leave its model at least one Ready version
    with a weight above 0: otherwise the gateway has nothing to route the model to and answers
    503. ``--force`` (``force``) makes the plan anyway. ``doing`` names the command for the
    message ("rolling back canary"); ``why`` is the command's own explanation, if any.
    """
    versions = (target, *siblings)
    before = {v.name: v.weight for v in versions}
    after = before | {c.version: c.after for c in plan.changes if c.version in before}
    if force or after == before:
        return
    if any(v.is_ready and after[v.name] > 0 for v in versions):
        return
    weighted = [v for v in versions if after[v.name] > 0]
    if weighted:
        state = "only versions that are not Ready would have weight: " + "; ".join(
            f"{v.name} is not Ready ({v.ready_reason}: {v.ready_message}) and would have "
            f"weight {after[v.name]}"
            for v in sorted(weighted, key=lambda v: v.name)
        )
    else:
        state = "no version would have a weight above 0"
    if not any(v.is_ready and v.weight > 0 for v in versions):
        state += " (it has no Ready version with weight now either)"
    ns = f"-n {target.namespace} " if target.namespace else ""
    raise PluginError(
        f"{doing} would leave model {target.model} with no Ready version that has weight, so "
        f"the gateway would answer 503 for it: {why + '; ' if why else ''}{state}. Nothing was "
        f"changed. Give a Ready version a weight first (kubectl modelroll {ns}set-weight "
        "VERSION WEIGHT; `kubectl modelroll status` shows which are Ready), or use --force to "
        "do it anyway."
    )


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
    total = target.weight + sum(s.weight for s in siblings)
    new = min(MAX_WEIGHT, max(total, 1))
    before = {v.name: v.weight for v in (target, *siblings)}
    memory = Memory(target.model, before, at)
    plan.changes.append(Change(target.name, target.weight, new, memory.to_annotation()))
    for s in sorted(siblings, key=lambda s: s.name):
        forget = s.stale_annotations()
        if s.weight > 0 or forget:
            plan.changes.append(Change(s.name, s.weight, 0, forget=forget))
    guard(plan, target, siblings, force, f"promoting {target.name}")
    check_plan(plan)
    return plan


def plan_rollback(target: Version, siblings: Sequence[Version], force: bool) -> Plan:
    """The remembered weights of the others first, then the target's own (0 without a memory),
    forgetting the memory."""
    ns = f"-n {target.namespace} " if target.namespace else ""
    if target.memory_error is not None:
        raise PluginError(
            f"cannot roll back {target.name}: its annotation {ANNOTATION_BEFORE_PROMOTE}, the "
            f"weights before its promote, is unusable: {target.memory_error}. Nothing was "
            f"changed. Fix the annotation or remove it (kubectl annotate {ns}mv {target.name} "
            f"{ANNOTATION_BEFORE_PROMOTE}-), then roll back again; or set the weights by hand, "
            f"without restoring anything: give the version that should serve a weight "
            f"(kubectl modelroll {ns}set-weight VERSION WEIGHT), then take {target.name}'s "
            f"traffic away (kubectl modelroll {ns}set-weight {target.name} 0)"
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
                restore.append(Change(name, s.weight, weight))
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
    # With a memory: exactly the weights from before the promote, the target's own included.
    back = memory.weights.get(target.name, 0) if memory is not None else 0
    plan.changes.extend([*restore, Change(target.name, target.weight, back, forget=forget)])
    source = (
        f"the weights remembered by {target.name}'s promote give none to a Ready version"
        if memory is not None
        else f"{target.name} holds no memory of a promote to restore "
        f"(annotation {ANNOTATION_BEFORE_PROMOTE})"
    )
    guard(plan, target, siblings, force, f"rolling back {target.name}", source)
    check_plan(plan)
    return plan


def plan_set_weight(target: Version, siblings: Sequence[Version], weight: int, force: bool) -> Plan:
    """One patch. No memory is forgotten: a rollback gives a remembered weight back only to a
    version still at the 0 its promote left, so a weight set after the promote wins."""
    change = Change(target.name, target.weight, weight)
    plan = Plan(target.model, [change])
    guard(plan, target, siblings, force, f"setting {target.name}'s weight to {weight}")
    return plan
