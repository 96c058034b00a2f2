"""Who can take a managed pod out of service, on a node that runs the pods.

A pod in another namespace sends GET /prestop to a managed version's Service and to each of its
pods' IPs, again and again, and tries the sidecar's control port on the pod IPs: every /prestop
is an unknown path (404), the control port is not there (it listens on 127.0.0.1 in the pod), and
the version stays Ready and keeps serving through the gateway. Then ``kubectl delete pod`` of a
replica: the kubelet runs the preStop exec hook inside the sidecar container, the sidecar drains,
and no request through the gateway fails meanwhile.

The local node's bridge CNI does not enforce NetworkPolicy, so the chart's policy (on by
default) lets the other namespace through here: that is what puts the inference port within its
reach. Where a plugin enforces it, those connections are dropped instead, which this test also
accepts; it never counts on enforcement.
"""

from __future__ import annotations

import json
import subprocess
import time
from typing import Any

import pytest

from modelroll_devcluster.pytest_plugin import Figures
from modelroll_devcluster.traffic import Response, Traffic
from tests.support.incluster import InCluster, managed_manifest
from tests.support.pods import IMAGE, pods, ready, statuses
from tests.support.stack import eventually

pytestmark = pytest.mark.node

MODEL = "control"
NAME = "control-v1"
REPLICAS = 2
OTHER_NAMESPACE = "modelroll-outsider"
PROBE_POD = "outsider"
TRIES = 5
"""GET /prestop to the Service, and to each pod IP, this many times each."""
CONTROL_PORT = 8001
WINDOW = 10
ROUNDS_PER_SECOND = 10.0
OBSERVE_S = 3.0

PROBE = """
import json, socket, sys, urllib.error, urllib.request

def get(url):
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError as exc:
        return type(exc).__name__

def connect(host, port):
    try:
        socket.create_connection((host, port), timeout=5).close()
        return "open"
    except ConnectionRefusedError:
        return "refused"
    except OSError as exc:
        return type(exc).__name__

service, tries, control, ips = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4:]
found = {"service": [get(f"{service}/prestop") for _ in range(tries)]}
for ip in ips:
    found[ip] = [get(f"http://{ip}:8000/prestop") for _ in range(tries)]
    found[ip + " control"] = connect(ip, control)
print(json.dumps(found))
"""
"""Run in the other namespace's pod: what each GET /prestop answered, and whether the control
port accepts a connection on each pod IP."""


def manifest() -> dict[str, Any]:
    """The managed example, as version control-v1 of model control with two replicas."""
    doc = managed_manifest("stable-v1")
    doc["metadata"] = {"name": NAME}
    doc["spec"].update(model=MODEL, weight=1, replicas=REPLICAS)
    return doc


def ready_pods(story: InCluster) -> list[dict[str, Any]]:
    """The version's pods that are Ready and not terminating."""
    found = []
    for pod in pods(story, NAME):
        conditions = pod.get("status", {}).get("conditions", [])
        if pod["metadata"].get("deletionTimestamp"):
            continue
        if any(c["type"] == "Ready" and c["status"] == "True" for c in conditions):
            found.append(pod)
    return found


def routed(story: InCluster) -> bool:
    model = story.routes().get(MODEL) or {"versions": []}
    return [v["name"] for v in model["versions"]] == [NAME]


def sidecar_log(story: InCluster, pod: str) -> str:
    return story.kubectl("logs", pod, "-c", "sidecar").stdout


def failed(responses: list[Response]) -> list[Response]:
    return [r for r in responses if r.status != 200]


def outside_probe(story: InCluster, ips: list[str]) -> dict[str, Any]:
    """Run PROBE in a pod of another namespace; what it found."""
    service = f"http://{NAME}.{story.namespace}.svc:8000"
    kubectl = story.cluster.kubectl
    kubectl("create", "namespace", OTHER_NAMESPACE)
    kubectl(
        *("run", PROBE_POD, "--restart=Never", f"--image={IMAGE}", "--image-pull-policy=Never"),
        *("--command", "--", "python3", "-c", PROBE, service, str(TRIES), str(CONTROL_PORT)),
        *ips,
        namespace=OTHER_NAMESPACE,
    )
    phase = "--for=jsonpath={.status.phase}=Succeeded"
    kubectl("wait", f"pod/{PROBE_POD}", phase, "--timeout=120s", namespace=OTHER_NAMESPACE)
    logs = kubectl("logs", PROBE_POD, namespace=OTHER_NAMESPACE).stdout
    found: dict[str, Any] = json.loads(logs.strip().splitlines()[-1])
    return found


def blocked(outcome: object) -> bool:
    """A connection a NetworkPolicy-enforcing plugin dropped (never on the local node)."""
    return isinstance(outcome, str) and outcome not in ("open", "refused")


@pytest.mark.timeout(600)
def test_no_other_pod_can_drain_a_version_but_deleting_a_pod_still_drains_it(
    on_cluster: InCluster, figures: Figures
) -> None:
    story = on_cluster
    clean_up(story)  # whatever an interrupted run left
    try:
        story.kubectl("apply", "-f", "-", input=json.dumps(manifest()))
        eventually(lambda: ready(story, NAME).get("status") == "True", f"{NAME} Ready", 300)
        eventually(lambda: len(ready_pods(story)) == REPLICAS, f"{REPLICAS} ready pods", 180)
        eventually(lambda: routed(story), f"{NAME} routed by the gateway", 60)
        replicas = ready_pods(story)
        names = sorted(p["metadata"]["name"] for p in replicas)
        ips = sorted(p["status"]["podIP"] for p in replicas)
        hook = replicas[0]["spec"]["containers"][0]["lifecycle"]["preStop"]
        assert hook == {
            "exec": {
                "command": [
                    *("python3", "-m", "modelroll_sidecar.prestop"),
                    f"--control-port={CONTROL_PORT}",
                ]
            }
        }

        with Traffic(
            story.gateway_url, MODEL, window=WINDOW, rounds_per_second=ROUNDS_PER_SECOND
        ) as traffic:
            started = time.monotonic()
            traffic.wait_for(5 * WINDOW, after=started, timeout=60)

            # 1. Another namespace tries to drain the version, through its Service and each pod.
            found = outside_probe(story, ips)
            probed = time.monotonic()
            figures.add("node: what another namespace's pod got", json.dumps(found))
            attempts = [*found["service"], *(s for ip in ips for s in found[ip])]
            assert len(attempts) == TRIES * (1 + len(ips))
            controls = [found[f"{ip} control"] for ip in ips]
            assert all(a == 404 or blocked(a) for a in attempts), found
            assert all(c == "refused" or blocked(c) for c in controls), found
            if story.cluster.is_local:  # no NetworkPolicy enforcement: every attempt got through
                assert set(attempts) == {404}, found
                assert set(controls) == {"refused"}, found

            # Still Ready and serving, well past the readiness probe's period (2 s, 1 failure).
            traffic.wait_for(WINDOW, after=probed + OBSERVE_S, timeout=OBSERVE_S + 60)
            assert sorted(p["metadata"]["name"] for p in ready_pods(story)) == names
            assert ready(story, NAME).get("status") == "True"
            assert all(statuses(p)["sidecar"]["restartCount"] == 0 for p in pods(story, NAME))
            for name in names:
                assert "Closing" not in sidecar_log(story, name), name
            during = traffic.since(started)
            lost = failed(during)
            figures.add(
                "node: GET /prestop from another namespace, under load",
                f"{len(attempts)} sent, {len(lost)} of {len(during)} requests failed meanwhile",
            )
            assert not lost, lost[:5]
            assert {r.version for r in during} == {NAME}

            # 2. kubectl delete pod: the kubelet runs the exec hook, the replica drains.
            victim = names[0]
            log = subprocess.Popen(  # the sidecar's log until its container stops
                [
                    str(story.cluster.kubectl_path),
                    f"--kubeconfig={story.cluster.kubeconfig}",
                    f"--namespace={story.namespace}",
                    *("logs", "--follow", victim, "-c", "sidecar"),
                ],
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            deleting = time.monotonic()
            story.kubectl("delete", "pod", victim, "--wait=true", "--timeout=120s")
            deleted = time.monotonic() - deleting
            out, _ = log.communicate(timeout=30)
            eventually(lambda: len(ready_pods(story)) == REPLICAS, "a new replica", 180)
            traffic.wait_for(WINDOW, after=time.monotonic() + OBSERVE_S, timeout=OBSERVE_S + 60)
            during = traffic.since(deleting)
            lost = failed(during)
            figures.add(
                "node: kubectl delete pod (exec preStop hook)",
                f"deleted {victim} in {deleted:.1f} s; {len(lost)} of {len(during)} requests "
                "failed meanwhile",
            )
            assert not lost, lost[:5]
            assert f"Closing {MODEL}/{NAME}: unready" in out, out[-3000:]
            assert "Stopped" in out, out[-3000:]
            assert out.index("Closing") < out.index("Received a stop signal"), out[-3000:]
            assert deleted >= 3.0  # the hook's --prestop-delay-ms, before SIGTERM
            events = story.kubectl(
                *("get", "events", "-o", "json"),
                f"--field-selector=involvedObject.name={victim},reason=FailedPreStopHook",
            ).stdout
            assert json.loads(events)["items"] == [], events
    finally:
        clean_up(story)


def clean_up(story: InCluster) -> None:
    """Delete the version (and wait until its pods are gone) and the other namespace."""
    story.kubectl("delete", "mv", NAME, "--ignore-not-found", "--timeout=120s", check=False)
    story.cluster.kubectl(
        *("delete", "namespace", OTHER_NAMESPACE, "--ignore-not-found", "--timeout=120s"),
        check=False,
    )
    eventually(lambda: not pods(story, NAME), f"the pods of {NAME} gone", 120)
