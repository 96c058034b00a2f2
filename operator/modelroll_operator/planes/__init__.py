"""The data planes that route a model's traffic, behind one interface: :class:`DataPlane`.

A model is in one plane at a time: the routes ConfigMap that the modelroll gateway reads
(``configmap.py``), or, with --gateway-api, the HTTPRoute that claims it (``httproute.py``).
:class:`Planes` picks it from what the operator's watches hold, never with an API call: once per
reconcile pass, and once per look of a canary analysis, by the same rule. So the two never
disagree, and a model that moves between planes (an HTTPRoute labelled for it, or its label or
route gone) moves for both at once: the watch event that moves it also queues the model's pass,
and until that pass has written the weights into the new plane, its weights in force are not
the step's, and the analysis holds.

Adding a plane (an InferencePool, a mesh) is one module here with two classes:

- one that implements :class:`DataPlane` for one model: what it can do (``sticky_cohorts``,
  ``shadow_copies``, ``pinning``), where an analysis reads the versions' counters
  (``metrics``), which versions it cannot route (``unroutable``), ``write`` (make the data plane
  route the model as a ModelRoute says, and say what it routes by now), and
  ``weights_in_force`` (the weights the data plane routes by, as an analysis verifies them);
- one that implements :class:`PlaneKind`: ``claim`` (the model's plane when this kind claims the
  model) and ``release`` (what to undo when another plane routes it);

and a line where the operator lists its kinds (``Reconciler.__init__``), beside the watch that
fills the kind's index (``handlers.py``).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence
from typing import Protocol

from modelroll_common.routes import ModelRoute

from ..routing import RouteWrite
from ..snapshots import ModelKey, VersionInfo
from ..spec import BackendRef

Weights = Mapping[str, float]
"""The weights one source of the data plane routes by, by version name."""


class MetricsOrigin(enum.Enum):
    """Where a canary analysis reads the versions' counters."""

    GATEWAY = "gateway"
    """The modelroll gateway's pods (spec.analysis.metrics), which also report the weights they
    route by."""
    SIDECARS = "sidecars"
    """The versions' own sidecars: the data plane's metrics are not modelroll's."""


class DataPlane(Protocol):
    """One model's route in the data plane that routes it."""

    @property
    def kind(self) -> PlaneKind:
        """The kind of plane this is (the one that claimed the model)."""

    @property
    def name(self) -> str:
        """The object that holds the route, as messages name it ("HTTPRoute models")."""

    @property
    def data_plane(self) -> str:
        """Who routes the requests, as messages name it ("a Gateway API data plane")."""

    @property
    def sticky_cohorts(self) -> bool:
        """Whether it keeps a cohort key's requests on one version (spec.cohortHeader)."""

    @property
    def shadow_copies(self) -> bool:
        """Whether it sends copies of requests to a version (spec.shadow) and compares them."""

    @property
    def pinning(self) -> bool:
        """Whether a request can pin a version with the X-Modelroll-Version header."""

    @property
    def metrics(self) -> MetricsOrigin:
        """Where a canary analysis reads the versions' counters."""

    def unroutable(self, version: str) -> str | None:
        """Why a Ready version cannot be routed here (None: it can)."""

    async def write(self, route: ModelRoute | None, endpoints: Mapping[str, str]) -> RouteWrite:
        """Make the data plane route the model as ``route`` says (None: the model has no
        versions left). ``endpoints`` holds each version's endpoint by name. A write that cannot
        be made comes back as a problem with what is in force; transient failures raise."""

    def weights_in_force(
        self, reported: Mapping[str, Weights], versions: Iterable[str]
    ) -> dict[str, Weights]:
        """The weights each source of the data plane routes ``versions`` by, by source name
        (a version it routes by none is left out). ``reported`` holds what each source of the
        analysis's counters said it routes by (a modelroll gateway pod's weights)."""


class PlaneKind(Protocol):
    """A kind of data plane: the models it claims, and what it gives up for another."""

    async def claim(self, key: ModelKey, backends: Mapping[str, BackendRef]) -> DataPlane | None:
        """The model's plane when this kind routes the model (None: it does not).
        ``backends`` holds each version's backend (:meth:`Planes.backends`)."""

    async def release(self, key: ModelKey) -> str | None:
        """Take the model out of this kind of plane, now that another routes it, so that the
        model is never in two planes with different weights; the problem, if that failed."""


class Planes:
    """The kinds of data plane the operator writes, in order: the first that claims a model
    routes it, and the last claims every model."""

    def __init__(self, kinds: Sequence[PlaneKind], sidecar_port: int) -> None:
        self.kinds = tuple(kinds)
        self.sidecar_port = sidecar_port

    def backends(self, versions: Iterable[VersionInfo]) -> dict[str, BackendRef]:
        """Each version's backend, for a plane that routes to Kubernetes objects: a managed
        version's own Service on the sidecar's port, an external version's spec.backendRef (an
        external version that names none is left out)."""
        refs: dict[str, BackendRef] = {}
        for v in versions:
            if v.spec is None:
                continue
            if v.spec.server is not None:
                refs[v.name] = BackendRef(v.name, "Service", self.sidecar_port)
            elif v.spec.backend_ref is not None:
                refs[v.name] = v.spec.backend_ref
        return refs

    async def choose(self, key: ModelKey, backends: Mapping[str, BackendRef]) -> DataPlane:
        """The plane that routes the model now."""
        for kind in self.kinds:
            plane = await kind.claim(key, backends)
            if plane is not None:
                return plane
        raise LookupError(f"no data plane claims model {key[0]}/{key[1]}")

    async def release_others(self, plane: DataPlane, key: ModelKey) -> list[str]:
        """Take the model out of every other plane (before ``plane`` is written); the
        problems of those that failed."""
        problems = []
        for kind in self.kinds:
            if kind is not plane.kind and (problem := await kind.release(key)) is not None:
                problems.append(problem)
        return problems
