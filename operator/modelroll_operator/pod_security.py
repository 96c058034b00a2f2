"""What Pod Security "baseline" forbids in a managed version's pod, declared once.

``RULES`` is the one declaration: the operator checks each spec.server against it
(``violations``, at parse time; ``forbidden`` with the operator's --pod-security), and
``make generate`` writes from it the CEL of the chart's ValidatingAdmissionPolicy
(hack/admission.py) and the table in docs/design.md. The rules are the "baseline" checks of
Kubernetes' Pod Security admission (k8s.io/pod-security-admission/policy, 1.36), each on the
fields of spec.server that become that part of the pod: the model container is spec.server
itself, the init containers are spec.server.initContainers, the pod's fields are spec.server's.
Pod fields spec.server does not have (hostNetwork, hostPID, the pod's securityContext with its
sysctls) cannot be set through a ModelVersion at all.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Literal, get_args

PodSecurity = Literal["baseline", "privileged"]
"""The operator's --pod-security: ``baseline`` refuses what ``RULES`` forbid; ``privileged``
refuses nothing, leaving the pods to the namespace's own Pod Security admission."""
LEVELS: tuple[PodSecurity, ...] = get_args(PodSecurity)
DEFAULT_LEVEL: PodSecurity = "baseline"


class Each:
    """A path segment: each item of a list."""

    def __repr__(self) -> str:
        return "[*]"


EACH = Each()


@dataclass(frozen=True)
class KeysStarting:
    """A path segment: each key of a map that starts with ``prefix``."""

    prefix: str


Segment = str | Each | KeysStarting
"""A field's name, each item of a list, or the keys of a map with a prefix."""


@dataclass(frozen=True)
class Allowed:
    """What a field may hold once it is set: one of ``values``, or a string that starts with one
    of ``prefixes``. With neither, the field may not be set at all. Unset is always allowed."""

    values: tuple[bool | int | str, ...] = ()
    prefixes: tuple[str, ...] = ()

    def admits(self, value: object) -> bool:
        """Whether ``value`` is allowed (compared as CEL compares: a bool only equals a bool,
        an int a number of the same value)."""
        if isinstance(value, str) and value.startswith(self.prefixes):
            return True
        return any(_same(value, allowed) for allowed in self.values)

    def shown(self) -> list[str]:
        """The allowed values as JSON, and the prefixes as ``"localhost/<name>"``."""
        return [json.dumps(v) for v in self.values] + [f'"{p}<name>"' for p in self.prefixes]

    def requirement(self) -> str:
        """What the rule asks, in words: ``must be false``, ``must not be set``."""
        shown = self.shown()
        if not shown:
            return "must not be set"
        if len(shown) == 1:
            return f"must be {shown[0]}"
        if len(shown) <= 3:
            return f"must be {', '.join(shown[:-1])} or {shown[-1]}"
        return f"must be one of {', '.join(shown)}"


def _same(value: object, allowed: object) -> bool:
    if isinstance(value, bool) or isinstance(allowed, bool):
        return type(value) is type(allowed) and value == allowed
    return value == allowed


@dataclass(frozen=True)
class Rule:
    """One field that Pod Security "baseline" restricts, and what it allows there."""

    control: str
    """The control of the Pod Security Standards that the rule belongs to, by its name there."""
    path: tuple[Segment, ...]
    """The field, relative to a container (``CONTAINER_RULES``) or to spec.server's pod fields
    (``POD_RULES``)."""
    allowed: Allowed

    def message(self, where: str) -> str:
        """The refusal of the field at ``where`` (its full path)."""
        return f'{where} {self.allowed.requirement()} (Pod Security "baseline": {self.control})'


def shown(path: tuple[Segment, ...]) -> str:
    """A path as the messages write it: ``securityContext.capabilities.add[*]``."""
    text = ""
    for segment in path:
        if isinstance(segment, Each):
            text += "[*]"
        elif isinstance(segment, KeysStarting):
            text += f"['{segment.prefix}*']"
        else:
            text += f".{segment}"
    return text.removeprefix(".")


FALSE = Allowed((False,))
EMPTY = Allowed(("",))
PROFILE_TYPES = Allowed(("RuntimeDefault", "Localhost"))
CAPABILITIES = (
    "AUDIT_WRITE",
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "FSETID",
    "KILL",
    "MKNOD",
    "NET_BIND_SERVICE",
    "SETFCAP",
    "SETGID",
    "SETPCAP",
    "SETUID",
    "SYS_CHROOT",
)
"""The capabilities "baseline" lets a container add: the container runtimes' default set."""
PROBES = ("startupProbe", "readinessProbe", "livenessProbe")
HANDLERS = ("httpGet", "tcpSocket")
SELINUX_TYPES = ("", "container_t", "container_init_t", "container_kvm_t", "container_engine_t")
HOST_FIELDS: tuple[tuple[str, ...], ...] = (
    *((probe, handler) for probe in PROBES for handler in HANDLERS),
    *(("lifecycle", hook, handler) for hook in ("postStart", "preStop") for handler in HANDLERS),
)
"""The probes and lifecycle handlers whose ``host`` makes the kubelet connect elsewhere."""
APPARMOR_ANNOTATION = "container.apparmor.security.beta.kubernetes.io/"

CONTAINER_RULES: tuple[Rule, ...] = (
    Rule("HostProcess", ("securityContext", "windowsOptions", "hostProcess"), FALSE),
    Rule("Privileged Containers", ("securityContext", "privileged"), FALSE),
    Rule("Capabilities", ("securityContext", "capabilities", "add", EACH), Allowed(CAPABILITIES)),
    Rule("Host Ports", ("ports", EACH, "hostPort"), Allowed((0,))),
    Rule("AppArmor", ("securityContext", "appArmorProfile", "type"), PROFILE_TYPES),
    Rule("SELinux", ("securityContext", "seLinuxOptions", "type"), Allowed(SELINUX_TYPES)),
    Rule("SELinux", ("securityContext", "seLinuxOptions", "user"), EMPTY),
    Rule("SELinux", ("securityContext", "seLinuxOptions", "role"), EMPTY),
    Rule("/proc Mount Type", ("securityContext", "procMount"), Allowed(("Default",))),
    Rule("Seccomp", ("securityContext", "seccompProfile", "type"), PROFILE_TYPES),
    *(Rule("Host Probes / Lifecycle Hooks", (*fields, "host"), EMPTY) for fields in HOST_FIELDS),
)
"""What "baseline" restricts in every container: the model container (spec.server) and each
init container (spec.server.initContainers[*])."""
POD_RULES: tuple[Rule, ...] = (
    Rule("Host Namespaces", ("hostIPC",), FALSE),
    Rule("HostPath Volumes", ("volumes", EACH, "hostPath"), Allowed()),
    Rule(
        "AppArmor",
        ("podAnnotations", KeysStarting(APPARMOR_ANNOTATION)),
        Allowed(("", "runtime/default"), prefixes=("localhost/",)),
    ),
)
"""What "baseline" restricts in the pod's own fields, as spec.server gives them."""

SERVER = "spec.server"
INIT_CONTAINERS: tuple[Segment, ...] = ("initContainers", EACH)


@dataclass(frozen=True)
class Placed:
    """A rule at its place in spec.server: the path from spec.server to the field."""

    rule: Rule
    path: tuple[Segment, ...]

    def message(self, where: str | None = None) -> str:
        """The refusal of the field at ``where``; by default the path with ``[*]`` for lists."""
        return self.rule.message(f"{SERVER}.{shown(self.path)}" if where is None else where)


RULES: tuple[Placed, ...] = (
    *(Placed(rule, rule.path) for rule in CONTAINER_RULES),
    *(Placed(rule, (*INIT_CONTAINERS, *rule.path)) for rule in CONTAINER_RULES),
    *(Placed(rule, rule.path) for rule in POD_RULES),
)
"""Every rule at every place it applies in spec.server: the model container's fields, each
init container's, the pod's."""


def _found(node: object, path: tuple[Segment, ...], where: str) -> Iterator[tuple[str, object]]:
    """Each value at ``path`` under ``node`` that is set (JSON null included), with its full
    path."""
    if not path:
        yield where, node
        return
    head, rest = path[0], path[1:]
    if isinstance(head, Each):
        if isinstance(node, list):
            for index, item in enumerate(node):
                yield from _found(item, rest, f"{where}[{index}]")
    elif isinstance(head, KeysStarting):
        if isinstance(node, Mapping):
            for key in node:
                if isinstance(key, str) and key.startswith(head.prefix):
                    yield from _found(node[key], rest, f"{where}['{key}']")
    elif isinstance(node, Mapping) and head in node:
        yield from _found(node[head], rest, f"{where}.{head}")


def violations(server: Mapping[str, object]) -> tuple[str, ...]:
    """What in a spec.server (as given) Pod Security "baseline" forbids, each naming the field
    and the rule; empty when nothing does."""
    return tuple(
        placed.message(where)
        for placed in RULES
        for where, value in _found(server, placed.path, SERVER)
        if not placed.rule.allowed.admits(value)
    )


def forbidden(found: tuple[str, ...], level: PodSecurity) -> str | None:
    """The refusal of a version whose spec.server has ``found`` (from ``violations``), under
    the operator's --pod-security ``level``; None when the level allows it."""
    if level == "privileged" or not found:
        return None
    return f"{'; '.join(found)}; the operator runs with --pod-security={level}"
