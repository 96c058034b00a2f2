"""The pure part of routing: which versions of a model go into its route, and what changed.

The document format is the gateway's (modelroll_common.routes); this module only decides its
content. A model with versions but none Ready keeps its key with no versions (the gateway answers
503: known model, nothing routable); a model with no versions left loses its key (404).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from modelroll_common.routes import ModelRoute, VersionRoute, format_share


@dataclass(frozen=True)
class Candidate:
    """A version that exists (and is not being deleted): may it be routed, and where to."""

    name: str
    weight: int
    endpoint: str | None
    ready: bool
    cohort_header: str | None = None
    shadow: int = 0
    """The percentage of the model's requests copied to it (spec.shadow.percent)."""
    standby: bool = False
    """Scaled to zero: in the route, with weight 0, so that a request pinned to it is answered
    503 with Retry-After rather than 404."""


def compute_route(model: str, candidates: Iterable[Candidate]) -> ModelRoute | None:
    """The model's route from its versions: Ready ones, and those on standby (scaled to zero,
    weight 0), ordered by name; its cohort
    header, the one named by the highest-weight routed version that names one (ties: the
    first by name), so that a canary that leaves it out changes nothing while it is smaller.

    None means the model has no versions at all, so its ConfigMap key should go.
    """
    versions = sorted(candidates, key=lambda c: c.name)
    if not versions:
        return None
    ready = [c for c in versions if c.ready and c.endpoint]
    routed = tuple(
        VersionRoute(c.name, c.weight, c.endpoint, c.shadow)
        if c.ready
        else VersionRoute(c.name, 0, c.endpoint, standby=True)
        for c in versions
        if c.endpoint and (c.ready or c.standby)
    )
    keyed = [c for c in ready if c.cohort_header]
    header = max(keyed, key=lambda c: c.weight).cohort_header if keyed else None
    return ModelRoute(model, routed, header)


@dataclass(frozen=True)
class Acceptance:
    """Whether the parents of a model's HTTPRoute (its Gateways) accepted it, as a condition's
    status ("True", "False", "Unknown"), reason and message."""

    status: str
    reason: str
    message: str


@dataclass(frozen=True)
class RouteWrite:
    """The outcome of writing one model's route, to the routes ConfigMap or to an HTTPRoute."""

    before: ModelRoute | None
    """What the route said before (None: none, or one that did not parse)."""
    in_force: ModelRoute | None
    """What it says now: the route the data plane has."""
    problem: str | None = None
    """Why the wanted route is not in force (None: it is)."""
    httproute: str | None = None
    """The HTTPRoute that holds the model's route (None: the routes ConfigMap does)."""
    acceptance: Acceptance | None = None
    """Whether that HTTPRoute's parents accepted it (None: no HTTPRoute)."""


@dataclass(frozen=True)
class Placement:
    """How one version sits in a route: its weight, the model's total, and where it answers."""

    weight: int
    total: int
    endpoint: str

    @property
    def share(self) -> float:
        return self.weight / self.total if self.total else 0.0

    def describe(self, model: str) -> str:
        """E.g. "90.0% of model sentiment's traffic (weight 9 of 10)"."""
        return (
            f"{format_share(self.share)} of model {model}'s traffic "
            f"(weight {self.weight} of {self.total})"
        )


def placement(route: ModelRoute | None, version: str) -> Placement | None:
    """Where ``version`` is in ``route``; None when it is not routed."""
    if route is None:
        return None
    entry = route.version(version)
    if entry is None:
        return None
    return Placement(entry.weight, route.total_weight, entry.endpoint)


@dataclass(frozen=True)
class RouteChange:
    """One version's routing before and after a route update (None: not routed)."""

    version: str
    before: Placement | None
    after: Placement | None

    @property
    def own(self) -> bool:
        """Whether the version itself changed (routed, unrouted, a new weight or endpoint),
        rather than only its share, because another version of the model changed."""
        if self.before is None or self.after is None:
            return True
        return (self.before.weight, self.before.endpoint) != (
            self.after.weight,
            self.after.endpoint,
        )

    def reason(self) -> str:
        return "Unrouted" if self.after is None else "Routed"

    def message(self, model: str) -> str:
        if self.after is None:
            return f"No longer routed: removed from the routes of model {model}"
        if self.before is None:
            return f"Now routed: {self.after.describe(model)} to {self.after.endpoint}"
        if self.before.endpoint != self.after.endpoint:
            return f"Routing changed: {self.after.describe(model)} to {self.after.endpoint}"
        return f"Routing changed: {format_share(self.before.share)} -> {self.after.describe(model)}"


def route_changes(
    before: ModelRoute | None, after: ModelRoute | None, names: Iterable[str] = ()
) -> list[RouteChange]:
    """Every version whose weight, share or endpoint differs between the two routes.

    ``names`` adds versions to consider beyond those listed in either route.
    """
    every = set(names)
    for route in (before, after):
        if route is not None:
            every.update(v.name for v in route.versions)
    changes = []
    for name in sorted(every):
        old, new = placement(before, name), placement(after, name)
        if old != new:
            changes.append(RouteChange(name, old, new))
    return changes
