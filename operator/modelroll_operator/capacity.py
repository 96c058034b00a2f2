"""Capacity follows weight: the replicas a version's share of its model's traffic needs, and
whether the model's new weights may go into its route yet (pure; reconcile.py applies it).

**Scale before shift.** When a managed version's share of its model's traffic rises (a weight
patched by ``kubectl modelroll promote`` or ``set-weight``, an analysis step, a promotion), the
version first gets the ready replicas its new share needs; only then do the model's new weights
go into its route. Until then the route keeps the weights in force, for every version of the
model at once, and the version's Capacity condition says what it waits for. A version whose pods
cannot be created (a ResourceQuota, an admission webhook) holds the move with that reason.

**How many.** In proportion to the replicas that carry the model's traffic now: the version
with the largest share in force runs ``r`` replicas for share ``s``, so the whole model's
traffic takes ``R = r / s`` (when that version is external, its replicas are unknown, and a
share needs 1 ready replica); a version taking share ``s'`` needs ``ceil(s' x R x 0.9)`` ready
replicas (the HPA's 10% tolerance), at least 1, and with spec.scaling at most its
maxReplicas. (A canary taking 50% of a model whose stable runs 8 replicas for all of it needs
4.) A version that was kept warm takes back, at once, up to the share it left.

**Floors.** What a share needs is the version's floor (status.capacity): its Deployment runs
``max(spec.replicas, floor)``, and with spec.scaling the autoscaler's minimum is at least the
floor. A floor is kept

- while a version without spec.scaling takes traffic (nothing else knows what its share needs);
- for spec.scaleDownDelaySeconds after a version's share fell, at the replicas it ran then, so
  that moving the traffic back is as instant as moving it away;
- with spec.scaling, for spec.scaleDownDelaySeconds after its share rose (then the autoscaler,
  which has seen the version's load by then, owns its replicas).

A floor then ends, and the version returns to spec.replicas (or the autoscaler's minimum).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Literal

from modelroll_common.routes import format_share

from .schema import api

CapacityReason = Literal[
    "ReplicasForShare", "WaitingForReplicas", "ReplicasUnavailable", "KeptWarm"
]
"""Every reason of the Capacity condition."""
EPSILON = 1e-9
"""Shares closer than this are equal (weights are integers, shares their ratios)."""
TOLERANCE = 0.1
"""A share needs replicas for all of its traffic but this fraction, the HorizontalPodAutoscaler's
own default tolerance: a replica may carry up to 1 / (1 - TOLERANCE), about 11%, more than the
replicas that carry the model now do (the last version of a 90/10 split takes all of it on as
many replicas as the 90 had)."""
STORED_SHARE = 0.0005
"""How far a share read back from status.capacity (to a tenth of a percent) may be off."""


@dataclass(frozen=True)
class CapacityStatus:
    """status.capacity: the replicas the operator keeps a managed version at, at least."""

    floor: int = api(
        "The replicas the version's Deployment runs at least, whatever spec.replicas says "
        "(with spec.scaling, the autoscaler's minimum is at least this): what its share of the "
        "model's traffic needs, or what it ran before its share fell.",
        minimum=0,
    )
    share: str = api(
        "The share of the model's traffic the floor is for, e.g. 90.0%.", max_length=16
    )
    until: str | None = api(
        "When the floor ends (RFC 3339). Absent: while the version takes its share.",
        default=None,
        format="date-time",
    )


@dataclass(frozen=True)
class Floor:
    """A version's floor as the decision works with it."""

    replicas: int
    share: float
    until: float | None = None
    """Seconds since the epoch; None: while the version takes traffic."""

    def to_status(self) -> CapacityStatus:
        until = None
        if self.until is not None:
            until = datetime.fromtimestamp(self.until, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        return CapacityStatus(self.replicas, format_share(self.share), until)

    @classmethod
    def from_status(cls, status: CapacityStatus) -> Floor:
        until = None
        if status.until is not None:
            until = datetime.fromisoformat(status.until.replace("Z", "+00:00")).timestamp()
        share = float(status.share.rstrip("%")) / 100 if status.share.endswith("%") else 0.0
        return cls(status.floor, share, until)


@dataclass(frozen=True)
class Member:
    """One managed version of the model, as the decision sees it."""

    name: str
    replicas: int
    """spec.replicas (with spec.scaling, what the autoscaler last set)."""
    ready: int
    """Ready replicas of its Deployment."""
    floor: Floor | None
    """Its floor as stored (status.capacity)."""
    delay_s: int
    """spec.scaleDownDelaySeconds."""
    max_replicas: int | None = None
    """spec.scaling.maxReplicas; None: not autoscaled."""
    failure: str | None = None
    """Why its pods cannot be created, if they cannot."""

    @property
    def autoscaled(self) -> bool:
        return self.max_replicas is not None

    @property
    def running(self) -> int:
        """The replicas its Deployment is meant to run."""
        return max(self.replicas, self.floor.replicas if self.floor else 0)


@dataclass(frozen=True)
class Verdict:
    """One managed version's floor after the pass, and its Capacity condition."""

    floor: Floor | None
    ready: bool
    reason: CapacityReason
    message: str


@dataclass(frozen=True)
class Decision:
    """Whether the model's new weights go in force, and each managed version's verdict."""

    shift: bool
    """True: write the new weights; False: keep those in force until the replicas are ready."""
    verdicts: Mapping[str, Verdict]
    waiting: tuple[str, ...] = ()
    """What the move waits for, one line per version."""

    def next_change(self) -> float | None:
        """When a floor ends next (seconds since the epoch), if one will."""
        ends = [v.floor.until for v in self.verdicts.values() if v.floor and v.floor.until]
        return min(ends) if ends else None


def shares(weights: Mapping[str, int]) -> dict[str, float]:
    """Each version's share of the model's traffic, from the weights of its routed versions."""
    total = sum(weights.values())
    return {name: (w / total if total else 0.0) for name, w in weights.items()}


def model_replicas(members: Iterable[Member], in_force: Mapping[str, float]) -> float:
    """R: the replicas the whole model's traffic takes, from the version with the largest share
    in force (ties: a managed one, then the most replicas): its replicas over its share, or over
    the share it left while it is kept warm; 0 when that is an external version (whose replicas
    the operator does not know) or no version has traffic."""
    by_name = {m.name: m for m in members}
    carrying = [n for n, share in in_force.items() if share > EPSILON]
    if not carrying:
        return 0.0

    def rank(name: str) -> tuple[float, bool, int]:
        member = by_name.get(name)
        return (in_force[name], member is not None, member.running if member else 0)

    ref = by_name.get(max(carrying, key=rank))
    if ref is None:
        return 0.0
    # A version kept warm runs the replicas of the share it left: a measure of that share.
    sized_for = max(in_force[ref.name], ref.floor.share if ref.floor else 0.0)
    return ref.running / sized_for


def needed(member: Member, share: float, whole: float) -> int:
    """The ready replicas ``member`` needs to take ``share`` of a model whose traffic takes
    ``whole`` replicas: ``ceil(share x whole x (1 - TOLERANCE))``, at least 1, at most its
    maxReplicas; a version kept warm needs no more than it kept, up to the share it left."""
    need = max(1, math.ceil(share * whole * (1 - TOLERANCE) - EPSILON))
    if member.floor is not None and share <= member.floor.share + STORED_SHARE:
        return min(member.floor.replicas, need)
    return min(need, member.max_replicas) if member.max_replicas is not None else need


def decide(
    model: str,
    members: Iterable[Member],
    wanted: Mapping[str, int],
    in_force: Mapping[str, int],
    now: float,
) -> Decision:
    """The decision for one model: ``wanted`` holds the weights its route should have (routed
    versions only), ``in_force`` the weights its data plane routes by now."""
    members = list(members)
    old, new = shares(in_force), shares(wanted)
    floors = {m.name: _kept(m, old.get(m.name, 0.0), now) for m in members}
    members = [replace(m, floor=floors[m.name]) for m in members]
    whole = model_replicas(members, old)
    rising = {
        m.name: needed(m, new[m.name], whole)
        for m in members
        if new.get(m.name, 0.0) > old.get(m.name, 0.0) + EPSILON
    }
    by_name = {m.name: m for m in members}
    for name, need in rising.items():
        # A warm floor, raised or not, still covers the share it was kept for.
        floor = floors[name]
        kept = (floor.replicas, floor.share) if floor else (0, 0.0)
        floors[name] = Floor(max(need, kept[0]), max(new[name], kept[1]))
    short = {n: need for n, need in rising.items() if by_name[n].ready < need}
    verdicts: dict[str, Verdict] = {}
    waiting = []
    for m in members:
        share_new, share_old = new.get(m.name, 0.0), old.get(m.name, 0.0)
        if m.name in short:
            verdict = _waiting(model, m, short[m.name], share_new, floors[m.name])
            waiting.append(f"{m.name}: {verdict.message}")
        elif short:
            verdict = _steady(model, m, floors[m.name], share_old)
        elif share_new < share_old - EPSILON:
            verdict = _falling(model, m, floors[m.name], share_old, now)
        elif m.name in rising:
            verdict = _risen(model, m, floors[m.name], share_new, now)
        else:
            verdict = _steady(model, m, floors[m.name], share_new)
        verdicts[m.name] = verdict
    return Decision(not short, verdicts, tuple(waiting))


def _kept(member: Member, share: float, now: float) -> Floor | None:
    """The member's stored floor if it still holds: one whose time is up ends (a version
    without spec.scaling that still takes traffic keeps it, for that traffic), and so does one
    held only while the version takes traffic, once it takes none."""
    floor = member.floor
    if floor is None:
        return None
    if floor.until is not None and floor.until <= now:
        if member.autoscaled or share <= EPSILON:
            return None
        return Floor(floor.replicas, share)
    if floor.until is None and share <= EPSILON:
        return None
    return floor


def _share(model: str, share: float) -> str:
    return f"{format_share(share)} of model {model}'s traffic"


def _waiting(model: str, member: Member, need: int, share: float, floor: Floor | None) -> Verdict:
    what = f"{need} ready replicas before it takes {_share(model, share)}: {member.ready} ready"
    if member.failure is not None:
        message = f"Needs {what}; the ReplicaSet cannot create pods: {member.failure}"
        return Verdict(floor, False, "ReplicasUnavailable", message)
    return Verdict(floor, False, "WaitingForReplicas", f"Waiting for {what}")


def _risen(model: str, member: Member, floor: Floor | None, share: float, now: float) -> Verdict:
    if floor is not None and member.autoscaled and member.delay_s > 0:
        floor = Floor(floor.replicas, share, now + member.delay_s)
    elif floor is not None and member.autoscaled:
        floor = None
    return _steady(model, member, floor, share)


def _falling(model: str, member: Member, floor: Floor | None, share: float, now: float) -> Verdict:
    """Its share falls now: it keeps the replicas it runs for spec.scaleDownDelaySeconds."""
    if member.delay_s <= 0:
        return _steady(model, member, None, 0.0)
    kept = Floor(member.running, max(share, floor.share if floor else 0.0), now + member.delay_s)
    return _warm(model, member, kept)


def _warm(model: str, member: Member, floor: Floor) -> Verdict:
    until = datetime.fromtimestamp(floor.until or 0, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    message = (
        f"Keeps {floor.replicas} replicas until {until} (spec.scaleDownDelaySeconds), so that "
        f"it can take back up to {_share(model, floor.share)} at once"
    )
    return Verdict(floor, True, "KeptWarm", message)


def _steady(model: str, member: Member, floor: Floor | None, share: float) -> Verdict:
    if floor is not None and floor.until is not None and share < floor.share - STORED_SHARE:
        return _warm(model, member, floor)
    runs = member.running if floor is None else max(member.replicas, floor.replicas)
    message = f"{member.ready} of {runs} replicas ready for {_share(model, share)}"
    if floor is not None and floor.replicas > member.replicas:
        message = f"{message} (spec.replicas {member.replicas}, raised for its share)"
    return Verdict(floor, True, "ReplicasForShare", message)
