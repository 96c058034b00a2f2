"""The operator's side of canary analyses: one task per canary (a kopf daemon) that reads the
counters, asks analysis/machine.py what to do, and writes the weights and ``status.analysis``.

Writes are ordered so that a restart never repeats or loses a step: the new state is saved first
(with ``applied: false``), then the weights (canary first), then ``applied: true``. An operator
that finds ``applied: false`` writes those weights again; weights are absolute, so writing them
twice is the same as once. Weights in the spec that differ from the ones the analysis wrote last
were set by hand: the analysis pauses and says so.

One canary of a model is analysed at a time: two would share the baseline, and each would take
the other's weights for a change made by hand. Another waits, Pending, until the first is over.

Commands come as an annotation, ``modelroll.io/analysis-command: <verb>:<nonce>`` (``kubectl
modelroll analysis resume|abort|skip``); the state records the last one handled, so each is done
once, whatever restarts happen.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import replace
from typing import Any

from prometheus_client import CollectorRegistry

from ..api import UNREACHABLE, Api, KubeApiError, mv_path
from ..planes import DataPlane, Planes
from ..snapshots import ModelKey, VersionInfo, VersionKey
from ..spec import PREFIX, SpecError
from ..status import CAPACITY
from . import machine
from .exporter import AnalysisMetrics
from .machine import Decision
from .phases import Phase, Reason
from .reader import MetricsReader, MetricsUnavailable
from .spec import AnalysisSpec, parse_analysis
from .state import AnalysisState

log = logging.getLogger("modelroll_operator")

ANNOTATION_COMMAND = f"{PREFIX}/analysis-command"
"""``<verb>:<nonce>``, verb one of COMMANDS; set by ``kubectl modelroll analysis``."""
COMMANDS = ("resume", "abort", "skip")
RETRY_S = 2.0
"""Seconds before a tick that failed on the API server (an error, or no connection) is tried
again."""
FAULT_RETRY_S = 30.0
"""Seconds before a tick that failed on a fault of the operator's own (logged with its
traceback) is tried again: soon enough to go on once the cause is gone, seldom enough that
the log is not one traceback after another."""
FINISHED_CHECK_S = 10.0
"""Seconds between two looks at a canary whose analysis is over."""
PENDING = Phase.PENDING
"""status.analysis.phase while no analysis can start (no baseline yet, or another canary)."""
UNDER_WAY = (Phase.PROGRESSING, Phase.PAUSED, Phase.HOLDING)
"""The phases of an analysis that holds its model: another canary of the model waits."""

VersionLookup = Callable[[ModelKey], list[VersionInfo]]


def spec_hash(raw: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(raw, sort_keys=True).encode()).hexdigest()[:16]


def choose_baseline(
    versions: list[VersionInfo], canary: str, named: str | None
) -> tuple[VersionInfo | None, str]:
    """The baseline: the one named, else the model's highest-weight Ready version other than
    the canary (ties: by name). None, with why, when there is none or the named one is not
    Ready (a version that serves nothing is no comparison)."""
    others = [v for v in versions if v.name != canary and not v.deleting and v.spec is not None]
    if named is not None:
        found = next((v for v in others if v.name == named), None)
        if found is None:
            return None, f"the baseline {named} is not a version of this model"
        return (found, "") if found.ready else (None, f"the baseline {named} is not Ready")
    ready = [v for v in others if v.ready and v.spec is not None and v.spec.weight > 0]
    if not ready:
        return None, "no other version of this model is Ready with a weight above 0"
    ready.sort(key=lambda v: (-(v.spec.weight if v.spec else 0), v.name))
    return ready[0], ""


class Canaries:
    """Runs the analyses of one operator."""

    def __init__(
        self,
        api: Api,
        versions: VersionLookup,
        reader: MetricsReader,
        metrics: AnalysisMetrics | None = None,
        clock: Callable[[], float] = time.time,
        *,
        planes: Planes | None = None,
    ) -> None:
        self.api = api
        self.versions = versions
        self.reader = reader
        self.planes = planes
        """The operator's data planes, which say where a model's counters are and which weights
        are in force (None: the reader finds the model's plane itself)."""
        self.metrics = metrics or AnalysisMetrics(CollectorRegistry())
        self.clock = clock
        self._holders: dict[ModelKey, VersionKey] = {}
        """The canary whose analysis this operator runs, by model: it knows them before the
        index shows their status."""

    async def run(
        self, namespace: str, name: str, sleep: Callable[[float], Awaitable[bool]]
    ) -> None:
        """Tick until the canary has no analysis left to run; ``sleep(seconds)`` returns True
        when the daemon is asked to stop. A tick that fails is tried again, whatever failed:
        the task ends only when the analysis does."""
        try:
            while True:
                try:
                    delay = await self.tick(namespace, name)
                except (KubeApiError, *UNREACHABLE) as exc:
                    # With no API server, no status can say so: the log does, and the step
                    # holds (no weight is written) until the server is back.
                    log.warning("Analysis of %s/%s: %s; trying again", namespace, name, exc)
                    delay = RETRY_S
                except Exception:
                    log.exception(
                        "Analysis of %s/%s failed; trying again in %.0fs",
                        namespace,
                        name,
                        FAULT_RETRY_S,
                    )
                    delay = FAULT_RETRY_S
                if delay is None or await sleep(delay):
                    return
        finally:  # gone, no longer a canary, or another replica runs it now
            self.metrics.forget(namespace, name)
            self._release((namespace, name))

    def _release(self, canary: VersionKey) -> None:
        for model in [m for m, held in self._holders.items() if held == canary]:
            del self._holders[model]

    async def tick(self, namespace: str, name: str) -> float | None:
        """One look at the canary; the seconds until the next, or None when there is nothing to
        run (the canary or its analysis is gone)."""
        body = await self.api.get(mv_path(namespace, name))
        if body is None:
            return None
        info = VersionInfo.from_body(body)
        raw = (body.get("spec") or {}).get("analysis")
        if info is None or not isinstance(raw, Mapping):
            return None
        try:
            spec = parse_analysis(raw)
        except SpecError as exc:
            log.warning("The analysis of %s/%s cannot run: %s", namespace, name, exc)
            return 30.0
        assert spec is not None
        digest = spec_hash(raw)
        current = (body.get("status") or {}).get("analysis") or {}
        state = AnalysisState.from_dict(current)
        if state is None or state.spec_hash != digest:
            return await self._start(info, spec, digest, current)
        if not state.applied:
            weights = machine.Weights(state.canary_weight, state.baseline_step_weight)
            state = await self._apply(info, state, weights)
        self._holders.setdefault(info.model_key, info.key)
        decision = await self._next(info, body, spec, state)
        await self._save(info, state, decision)
        if decision.state.finished:
            self._release(info.key)
        # A finished analysis is looked at now and then: a new spec.analysis starts another.
        return FINISHED_CHECK_S if decision.state.finished else float(spec.interval_seconds)

    async def _next(
        self, info: VersionInfo, body: Mapping[str, Any], spec: AnalysisSpec, state: AnalysisState
    ) -> Decision:
        now = self.clock()
        annotations = (body.get("metadata") or {}).get("annotations") or {}
        command = str(annotations.get(ANNOTATION_COMMAND) or "")
        if command and command != state.last_command:
            state = replace(state, last_command=command)
            verb = command.split(":", 1)[0]
            log.info("Analysis of %s/%s: command %s", info.namespace, info.name, verb)
            if verb == "resume":
                return machine.resume(spec, state, now)
            if verb == "abort":
                return machine.abort(state)
            if verb == "skip":
                return machine.skip(spec, state, now)
            return Decision(state)
        if state.finished or state.phase == Phase.PAUSED:
            return Decision(state)
        changed = await self._changed_by_hand(info, state)
        if changed:
            return machine.pause(
                state,
                Reason.MANUAL_WEIGHT,
                f"Paused: {changed}, not what the analysis set; `kubectl modelroll analysis "
                "resume` starts this step again with its weights, `abort` rolls back",
            )
        assert info.spec is not None
        try:
            snapshot = await self.reader.read(
                spec.metrics,
                info.namespace,
                info.model,
                info.name,
                state.baseline,
                now,
                streams=spec.judges_streams,
                agreement=state.shadowing,
                plane=await self._plane(info.model_key),
            )
        except MetricsUnavailable as exc:
            error = str(exc)
        except Exception:  # a fault of the operator's own: the step holds, saying so
            log.exception("Reading the metrics of %s/%s failed", info.namespace, info.name)
            error = "the operator failed to read them: an internal error, in its log"
        else:
            return _waits_for_replicas(machine.evaluate(spec, state, snapshot, now), body)
        self.metrics.source_error(info.namespace, info.model, info.name)
        return machine.evaluate(spec, state, None, now, error)

    async def _plane(self, model: ModelKey) -> DataPlane | None:
        """The data plane that routes the model now, chosen as the model's pass chooses it."""
        if self.planes is None:
            return None
        return await self.planes.choose(model, self.planes.backends(self.versions(model)))

    async def _changed_by_hand(self, info: VersionInfo, state: AnalysisState) -> str:
        """Which weight someone else changed ("" if none)."""
        assert info.spec is not None
        if info.spec.weight != state.canary_weight:
            return f"the canary's weight is {info.spec.weight}"
        baseline = await self.api.get(mv_path(info.namespace, state.baseline))
        if baseline is None:
            return f"the baseline {state.baseline} was deleted"
        weight = (baseline.get("spec") or {}).get("weight", 0)
        if weight != state.baseline_step_weight:
            return f"the baseline {state.baseline}'s weight is {weight}"
        return ""

    async def _start(
        self, info: VersionInfo, spec: AnalysisSpec, digest: str, current: Mapping[str, Any]
    ) -> float:
        versions = self.versions(info.model_key)
        if other := await self._other_canary(info, versions):
            message = (
                f"Waiting for the analysis of {other}, another canary of model {info.model}, "
                "to finish: one canary of a model is analysed at a time"
            )
            await self._wait(info, Reason.OTHER_CANARY, message, digest, current)
            return float(spec.interval_seconds)
        baseline, why = choose_baseline(versions, info.name, spec.baseline)
        if baseline is None or baseline.spec is None:
            message = f"Waiting for a baseline: {why}"
            await self._wait(info, Reason.NO_BASELINE, message, digest, current)
            return float(spec.interval_seconds)
        self._holders[info.model_key] = info.key
        decision = machine.start(spec, baseline.name, baseline.spec.weight, self.clock(), digest)
        await self._save(info, None, decision)
        return float(spec.interval_seconds)

    async def _other_canary(self, info: VersionInfo, versions: list[VersionInfo]) -> str:
        """Another canary of the model whose analysis is under way ("" if none): one this
        operator runs, or one whose status says so and which is still a canary."""
        held = self._holders.get(info.model_key)
        if held is not None and held != info.key:
            return held[1]
        for other in versions:
            analysis = other.status.get("analysis") or {}
            if other.name == info.name or analysis.get("phase") not in UNDER_WAY:
                continue
            body = await self.api.get(mv_path(other.namespace, other.name)) or {}  # the index lags
            now = (body.get("status") or {}).get("analysis") or {}
            if (body.get("spec") or {}).get("analysis") and now.get("phase") in UNDER_WAY:
                return other.name
        return ""

    async def _wait(
        self,
        info: VersionInfo,
        reason: Reason,
        message: str,
        digest: str,
        current: Mapping[str, Any],
    ) -> None:
        """Say why the analysis cannot start yet (status and an Event, once)."""
        pending: dict[str, Any] = {
            "phase": PENDING,
            "reason": reason,
            "message": message,
            "specHash": digest,
        }
        if any(current.get(k) != v for k, v in pending.items()):
            # a merge patch: null whatever an earlier analysis left
            pending = {**dict.fromkeys(current), **pending}
            await self._write_status(info, pending)
            await self._event(info, reason, message, warning=True)

    async def _save(
        self, info: VersionInfo, before: AnalysisState | None, decision: Decision
    ) -> None:
        state = decision.state
        if decision.weights is not None:
            state = replace(state, applied=False)
            await self._write_status(info, state.to_dict())
            state = await self._apply(info, state, decision.weights)
        elif before is None or state != before:
            await self._write_status(info, state.to_dict())
        self.metrics.observe(info.namespace, info.model, info.name, state)
        if (what := _decision_kind(before, decision)) is not None:
            self.metrics.decided(info.namespace, info.model, info.name, what)
        if decision.event:
            await self._event(info, _event_reason(state), decision.event, decision.warning)

    async def _apply(
        self, info: VersionInfo, state: AnalysisState, weights: machine.Weights
    ) -> AnalysisState:
        """Write the weights (canary first), then record that they are written."""
        await self._weight(info.namespace, info.name, weights.canary)
        await self._weight(info.namespace, state.baseline, weights.baseline)
        state = replace(state, applied=True)
        await self._write_status(info, state.to_dict())
        log.info(
            "Analysis of %s/%s: weights %s=%d, %s=%d",
            info.namespace,
            info.name,
            info.name,
            weights.canary,
            state.baseline,
            weights.baseline,
        )
        return state

    async def _weight(self, namespace: str, name: str, weight: int) -> None:
        try:
            await self.api.merge_patch(mv_path(namespace, name), {"spec": {"weight": weight}})
        except KubeApiError as exc:
            if exc.status != 404:  # a baseline deleted meanwhile has no weight to set
                raise

    async def _write_status(self, info: VersionInfo, analysis: Mapping[str, Any]) -> None:
        # A merge patch of status.analysis alone: the reconciler owns every other status field
        # (the conditions included, which it derives from status.analysis).
        await self.api.merge_patch(
            mv_path(info.namespace, info.name, "status"), {"status": {"analysis": analysis}}
        )

    async def _event(self, info: VersionInfo, reason: str, message: str, warning: bool) -> None:
        try:
            await self.api.post_event(
                info.owner_body(), reason, message, kind="Warning" if warning else "Normal"
            )
        except (KubeApiError, *UNREACHABLE) as exc:
            log.debug("Could not post an event for %s: %s", info.name, exc)


def _waits_for_replicas(decision: Decision, body: Mapping[str, Any]) -> Decision:
    """A hold for weights not in force, told why when it is the canary's replicas: its new
    share waits for them (scale before shift), and the step's time stands still meanwhile."""
    state = decision.state
    if state.reason != Reason.WEIGHTS_NOT_APPLIED:
        return decision
    for c in (body.get("status") or {}).get("conditions") or []:
        if isinstance(c, Mapping) and c.get("type") == CAPACITY and c.get("status") == "False":
            message = (
                f"Holding: the step's weights {state.canary_weight}/"
                f"{state.baseline_step_weight} wait for the canary's replicas: {c.get('message')}"
            )
            event = message if decision.event is not None else None
            return replace(decision, state=replace(state, message=message), event=event)
    return decision


def _decision_kind(before: AnalysisState | None, decision: Decision) -> str | None:
    """What the decision did, for modelroll_operator_analysis_decisions_total (None: nothing)."""
    after = decision.state
    if after.phase == Phase.PROMOTED and (before is None or before.phase != Phase.PROMOTED):
        return "promote"
    if after.phase == Phase.ROLLED_BACK and (before is None or not before.finished):
        return "rollback"
    if decision.weights is not None:
        return "step"
    if before is not None and after.phase != before.phase:
        if after.phase == Phase.PAUSED:
            return "pause"
        if after.phase == Phase.HOLDING:
            return "hold"
    return None


def _event_reason(state: AnalysisState) -> str:
    if state.finished:
        return state.phase
    if state.phase in (Phase.PAUSED, Phase.HOLDING):
        return state.reason
    return "AnalysisStep"
