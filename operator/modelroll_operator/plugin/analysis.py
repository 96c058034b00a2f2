"""``kubectl modelroll analysis status|resume|abort|skip VERSION``: a canary's analysis.

``status`` prints ``status.analysis``: phase, step, the weights, and per check the counts per
arm, the ratio, the test statistic and the verdict. The other three set the command annotation
(``modelroll.io/analysis-command: <verb>:<nonce>``) that the operator acts on once, and wait
until it has (``status.analysis.lastCommand``).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from ..analysis.daemon import ANNOTATION_COMMAND
from ..analysis.phases import FINISHED, Phase
from ..api import Api, KubeApiError, mv_path
from .plans import PluginError

VERBS = ("status", "resume", "abort", "skip")


def _analysis(body: Mapping[str, Any]) -> Mapping[str, Any]:
    return (body.get("status") or {}).get("analysis") or {}


def render(body: Mapping[str, Any]) -> str:
    """A canary's analysis in a few lines."""
    name = (body.get("metadata") or {}).get("name", "")
    spec = body.get("spec") or {}
    analysis = _analysis(body)
    if not spec.get("analysis"):
        return f"{name} has no spec.analysis: it is not a canary."
    if not analysis:
        return f"{name}: the operator has not started its analysis yet."
    steps = len((spec.get("analysis") or {}).get("steps") or [])
    where = (
        "before step 1 (shadow gate)"
        if analysis.get("shadowing")
        else f"step {analysis.get('step', '?')} of {steps}"
    )
    lines = [f"{name}: {analysis.get('phase', '?')} ({analysis.get('reason', '')}), {where}"]
    if "baseline" in analysis:
        lines.append(
            f"  weights: {name} {analysis.get('canaryWeight')}, baseline "
            f"{analysis.get('baseline')} {analysis.get('baselineStepWeight')} "
            f"(its weight before: {analysis.get('baselineWeight')})"
        )
    if message := analysis.get("message"):
        lines.append(f"  {message}")
    compared = ((analysis.get("stepCounts") or {}).get("canary") or {}).get("agreement") or {}
    if copies := compared.get("count"):
        mean = compared.get("sum", 0) / copies
        lines.append(f"  shadow copies: {copies:g} compared, mean agreement {mean:.4f}")
    checks = analysis.get("checks") or []
    if checks:
        lines.append(
            f"  {'CHECK':<18} {'CANARY':>14} {'BASELINE':>14} {'RATIO':>7} {'STATISTIC':>10} "
            "VERDICT"
        )
    for check in checks:
        c, b = check.get("canary") or {}, check.get("baseline") or {}
        ratio = check.get("ratio")
        lines.append(
            f"  {check.get('name', ''):<18} {_arm(c):>14} {_arm(b):>14} "
            f"{'-' if ratio is None else f'{ratio:.3g}':>7} "
            f"{check.get('statistic', 0):>10.3g} {check.get('verdict', '')}"
        )
    return "\n".join(lines)


def _arm(counts: Mapping[str, Any]) -> str:
    return f"{counts.get('bad', 0)}/{counts.get('requests', 0)}"


def command(api: Api, namespace: str, name: str, verb: str, wait: float) -> str:
    """Ask the operator to resume, abort or skip; the analysis as it is afterwards."""
    body = _get(api, namespace, name)
    analysis = _analysis(body)
    if not (body.get("spec") or {}).get("analysis"):
        raise PluginError(f"{name} has no spec.analysis: it is not a canary")
    phase = analysis.get("phase")
    if phase in FINISHED:
        raise PluginError(f"the analysis of {name} is over ({phase}): nothing to {verb}")
    if verb == "resume" and phase != Phase.PAUSED:
        raise PluginError(f"the analysis of {name} is not paused (it is {phase or 'not started'})")
    value = f"{verb}:{time.time_ns()}"
    patch = {"metadata": {"annotations": {ANNOTATION_COMMAND: value}}}
    api.call("PATCH", mv_path(namespace, name), patch, "application/merge-patch+json")
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        body = _get(api, namespace, name)
        if _analysis(body).get("lastCommand") == value:
            return render(body)
        time.sleep(0.2)
    if wait > 0:
        raise PluginError(
            f"the operator did not take up '{verb}' within {wait:g}s (is it running?); the "
            f"annotation {ANNOTATION_COMMAND}={value} stays, and it will"
        )
    return f"Asked the operator to {verb} the analysis of {name}."


def _get(api: Api, namespace: str, name: str) -> dict[str, Any]:
    try:
        return api.call("GET", mv_path(namespace, name))
    except KubeApiError as exc:
        if exc.status == 404:
            raise PluginError(f'ModelVersion "{name}" not found in namespace {namespace}') from None
        raise
