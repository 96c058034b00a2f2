"""What Pod Security "baseline" forbids in spec.server, by name: each control of the standard on
the model container, the init containers and the pod's fields, the values it allows, and the
operator's --pod-security that relaxes it. The examples pass it (tests/chart/test_examples.py);
the chart's admission policy, generated from the same rules, and the operator's refusal are
tested on the real API server (tests/integration/test_pod_security.py)."""

from __future__ import annotations

from typing import Any

import pytest

from modelroll_operator.cli import build_parser, parse_config
from modelroll_operator.pod_security import forbidden
from modelroll_operator.spec import parse_spec
from tests.support.specs import GPU_SERVER

IMAGE = "ghcr.io/acme/llm:2.0"
FETCH: dict[str, Any] = {"name": "fetch", "image": "ghcr.io/acme/fetch:1"}


def server(**fields: Any) -> dict[str, Any]:
    return {"image": IMAGE, **fields}


def init(**fields: Any) -> dict[str, Any]:
    """spec.server with one init container (after a harmless one) holding ``fields``."""
    return server(initContainers=[FETCH, {**FETCH, "name": "prepare", **fields}])


def found(spec_server: dict[str, Any]) -> tuple[str, ...]:
    parsed = parse_spec({"model": "llm", "server": spec_server}).server
    assert parsed is not None
    return parsed.baseline_violations


BASELINE = 'Pod Security "baseline"'


@pytest.mark.parametrize(
    ("spec_server", "says"),
    [
        (
            server(securityContext={"privileged": True}),
            "spec.server.securityContext.privileged must be false "
            f"({BASELINE}: Privileged Containers)",
        ),
        (
            init(securityContext={"privileged": True}),
            "spec.server.initContainers[1].securityContext.privileged must be false",
        ),
        (
            server(securityContext={"windowsOptions": {"hostProcess": True}}),
            f"spec.server.securityContext.windowsOptions.hostProcess must be false ({BASELINE}: "
            "HostProcess)",
        ),
        (
            server(hostIPC=True),
            f"spec.server.hostIPC must be false ({BASELINE}: Host Namespaces)",
        ),
        (
            server(
                volumes=[{"name": "w", "emptyDir": {}}, {"name": "root", "hostPath": {"path": "/"}}]
            ),
            f"spec.server.volumes[1].hostPath must not be set ({BASELINE}: HostPath Volumes)",
        ),
        (
            server(securityContext={"capabilities": {"add": ["NET_BIND_SERVICE", "SYS_ADMIN"]}}),
            'spec.server.securityContext.capabilities.add[1] must be one of "AUDIT_WRITE"',
        ),
        (
            init(ports=[{"containerPort": 9100}, {"containerPort": 9101, "hostPort": 9101}]),
            f"spec.server.initContainers[1].ports[1].hostPort must be 0 ({BASELINE}: Host Ports)",
        ),
        (
            server(securityContext={"seccompProfile": {"type": "Unconfined"}}),
            'spec.server.securityContext.seccompProfile.type must be "RuntimeDefault" or '
            f'"Localhost" ({BASELINE}: Seccomp)',
        ),
        (
            init(securityContext={"appArmorProfile": {"type": "Unconfined"}}),
            'spec.server.initContainers[1].securityContext.appArmorProfile.type must be "Runtime',
        ),
        (
            server(
                podAnnotations={
                    "container.apparmor.security.beta.kubernetes.io/model": "unconfined"
                }
            ),
            "spec.server.podAnnotations['container.apparmor.security.beta.kubernetes.io/model'] "
            f'must be "", "runtime/default" or "localhost/<name>" ({BASELINE}: AppArmor)',
        ),
        (
            server(securityContext={"seLinuxOptions": {"type": "spc_t"}}),
            "spec.server.securityContext.seLinuxOptions.type must be one of",
        ),
        (
            init(securityContext={"seLinuxOptions": {"user": "system_u"}}),
            "spec.server.initContainers[1].securityContext.seLinuxOptions.user "
            f'must be "" ({BASELINE}: SELinux)',
        ),
        (
            server(securityContext={"procMount": "Unmasked"}),
            f'spec.server.securityContext.procMount must be "Default" ({BASELINE}: /proc Mount',
        ),
        (
            server(livenessProbe={"httpGet": {"host": "169.254.169.254", "port": 80}}),
            f'spec.server.livenessProbe.httpGet.host must be "" ({BASELINE}: Host Probes',
        ),
        (
            init(lifecycle={"preStop": {"tcpSocket": {"host": "10.0.0.1", "port": 22}}}),
            'spec.server.initContainers[1].lifecycle.preStop.tcpSocket.host must be ""',
        ),
    ],
    ids=[
        "privileged",
        "privileged init container",
        "hostProcess",
        "hostIPC",
        "hostPath",
        "capabilities",
        "hostPort",
        "seccomp Unconfined",
        "AppArmor Unconfined",
        "AppArmor annotation",
        "SELinux type",
        "SELinux user",
        "procMount Unmasked",
        "probe host",
        "lifecycle host",
    ],
)
def test_what_baseline_forbids_is_named_by_field_and_control(
    spec_server: dict[str, Any], says: str
) -> None:
    (message,) = found(spec_server)
    assert message.startswith(says), message


def test_every_field_at_fault_is_named() -> None:
    spec_server = {
        **init(securityContext={"privileged": True}),
        "securityContext": {"privileged": True, "capabilities": {"add": ["SYS_ADMIN", "BPF"]}},
        "hostIPC": True,
    }
    assert [message.split(" must ")[0] for message in found(spec_server)] == [
        "spec.server.securityContext.privileged",
        "spec.server.securityContext.capabilities.add[0]",
        "spec.server.securityContext.capabilities.add[1]",
        "spec.server.initContainers[1].securityContext.privileged",
        "spec.server.hostIPC",
    ]


HARDENED: dict[str, Any] = {
    "privileged": False,
    "allowPrivilegeEscalation": False,
    "runAsNonRoot": True,
    "capabilities": {"drop": ["ALL"], "add": ["NET_BIND_SERVICE", "CHOWN"]},
    "seccompProfile": {"type": "Localhost", "localhostProfile": "profiles/model.json"},
    "appArmorProfile": {"type": "RuntimeDefault"},
    "seLinuxOptions": {"type": "container_t", "level": "s0:c123,c456"},
    "procMount": "Default",
    "windowsOptions": {"hostProcess": False},
}


def test_what_baseline_allows_passes() -> None:
    """Each restricted field at a value baseline allows, and everything it does not restrict
    (Secrets, a service account, shareProcessNamespace, an emptyDir, a probe on the pod)."""
    spec_server = {
        **GPU_SERVER,
        "securityContext": HARDENED,
        "livenessProbe": {"httpGet": {"path": "/livez", "port": 9000, "host": ""}},
        "initContainers": [
            {
                **FETCH,
                "securityContext": {**HARDENED, "seccompProfile": {"type": "RuntimeDefault"}},
                "ports": [{"containerPort": 9100, "hostPort": 0}],
            }
        ],
        "hostIPC": False,
        "shareProcessNamespace": True,
        "podAnnotations": {
            "container.apparmor.security.beta.kubernetes.io/model": "localhost/model-profile",
            "container.apparmor.security.beta.kubernetes.io/fetch": "runtime/default",
            "apparmor.example.com/note": "unconfined",
        },
    }
    assert found(spec_server) == ()


def test_baseline_refuses_and_privileged_allows() -> None:
    at_fault = found(server(securityContext={"privileged": True}))
    refusal = forbidden(at_fault, "baseline")
    assert refusal is not None
    assert refusal.startswith("spec.server.securityContext.privileged must be false")
    assert refusal.endswith("the operator runs with --pod-security=baseline")
    assert forbidden(at_fault, "privileged") is None
    assert forbidden((), "baseline") is None


def test_the_operator_refuses_by_default_and_the_flag_relaxes_it() -> None:
    assert parse_config(build_parser().parse_args([])).pod_security == "baseline"
    relaxed = parse_config(build_parser().parse_args(["--pod-security=privileged"]))
    assert relaxed.pod_security == "privileged"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--pod-security=restricted"])
