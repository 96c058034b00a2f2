"""The chart's RBAC rules for the operator, written from the table of its API calls
(``modelroll_operator.permissions.PERMISSIONS``) into two named templates that
``templates/operator-rbac.yaml`` includes:

- ``modelroll.operator.rules``: the namespaced rules, granted by a Role in each watched namespace
  or by one ClusterRole when the operator watches every namespace;
- ``modelroll.operator.clusterRules``: the cluster-scoped ones, and with watchNamespaces what
  finishing a watched namespace's deletion takes (each row's ``deleting``).

A row needed only with one of the operator's options stays behind that value's Helm conditional,
so the chart grants HTTPRoutes only with ``operator.gatewayAPI`` and peering only with
``operator.peering``.
"""

from __future__ import annotations

import textwrap
from collections.abc import Iterable
from pathlib import Path

from modelroll_operator.permissions import PERMISSIONS, Feature, Permission, Scope, Verb

ROOT = Path(__file__).resolve().parents[1]
RULES = ROOT / "charts" / "modelroll" / "templates" / "_operator-rules.tpl"
WIDTH = 96

CONDITIONS = {
    Feature.GATEWAY_API: ".Values.operator.gatewayAPI",
    Feature.PEERING: ".Values.operator.peering",
    Feature.CLUSTER_PEERING: "and .Values.operator.peering (not .Values.operator.watchNamespaces)",
    Feature.AUTOSCALER: ".Values.autoscaling.keda.enabled",
}
"""The Helm values that turn on the operator's option each feature needs."""

HEADER = """\
{{- /*
Written by `make generate` (hack/rbac.py) from operator/modelroll_operator/permissions.py, the
table of the API calls the operator makes: edit that, not this file.
*/}}
"""

RULES_DOC = """\
{{/*
The operator's permissions in each namespace it serves, as its code uses them.
*/}}"""

CLUSTER_DOC = """\
{{/*
What the operator needs cluster-wide: kopf finds the CRDs it serves and the namespaces it
watches. With watchNamespaces, what lets it finish deleting a watched namespace: deleting the
namespace deletes the Role and RoleBinding with everything else in it, in no set order, while its
ModelVersions wait for the operator to remove our finalizer (modelroll.io/finalizer). A
ClusterRoleBinding is the only grant a namespace's deletion cannot take away (a RoleBinding, even
to a ClusterRole, lives in the namespace), so these rules are cluster-wide, and no more than
finishing a deletion takes; everything that creates, changes or deletes workloads stays in the
namespaced rules.
*/}}"""


def comment(text: str) -> list[str]:
    return textwrap.wrap(text, WIDTH - 2, initial_indent="# ", subsequent_indent="# ")


def rule(
    permission: Permission, verbs: Iterable[Verb], names: tuple[str, ...], why: str
) -> list[str]:
    """One RBAC rule in the chart's layout, with why it is there as a YAML comment."""
    group = permission.group or '""'
    lines = [
        *comment(why),
        f"- apiGroups: [{group}]",
        f"  resources: [{permission.resource}]",
    ]
    if names:
        lines.append(f"  resourceNames: [{', '.join(names)}]")
    lines.append(f"  verbs: [{', '.join(verbs)}]")
    return lines


def conditional(feature: Feature, lines: list[str]) -> list[str]:
    if feature is Feature.ALWAYS:
        return lines
    return [f"{{{{- if {CONDITIONS[feature]} }}}}", *lines, "{{- end }}"]


def namespaced_rules() -> list[str]:
    return [
        line
        for p in PERMISSIONS
        if p.scope is Scope.NAMESPACED
        for line in conditional(p.feature, rule(p, p.verbs, p.names, p.why))
    ]


def deletion_rules() -> list[str]:
    lines = [
        line
        for p in PERMISSIONS
        if p.deleting is not None
        for line in conditional(
            p.feature, rule(p, p.deleting.verbs, p.deleting.names, p.deleting.why)
        )
    ]
    return ["{{- if .Values.operator.watchNamespaces }}", *lines, "{{- end }}"]


def cluster_rules() -> list[str]:
    cluster = [p for p in PERMISSIONS if p.scope is Scope.CLUSTER]
    always = [p for p in cluster if p.feature is Feature.ALWAYS]
    optional = [p for p in cluster if p.feature is not Feature.ALWAYS]
    return [
        *(line for p in always for line in rule(p, p.verbs, p.names, p.why)),
        *deletion_rules(),
        *(
            line
            for p in optional
            for line in conditional(p.feature, rule(p, p.verbs, p.names, p.why))
        ),
    ]


def define(name: str, doc: str, lines: list[str]) -> str:
    body = "\n".join(lines)
    return f'{doc}\n{{{{- define "{name}" -}}}}\n{body}\n{{{{- end }}}}\n'


def render() -> str:
    """The templates file's text."""
    return (
        HEADER
        + "\n"
        + define("modelroll.operator.rules", RULES_DOC, namespaced_rules())
        + "\n"
        + define("modelroll.operator.clusterRules", CLUSTER_DOC, cluster_rules())
    )
