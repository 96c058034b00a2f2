"""examples/managed/ exactly as a user applies it (README "A local node"): no renaming, no
patching. Both versions run on the node with the image `make images` built, the gateway Service
answers for model sentiment, and the canary's "Promote" comment does what it says.

The rollout story (test_rollout_on_node.py) runs copies of these examples changed for its own
scenario; this test is the one that holds the files themselves to their word.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e.conftest import eventually
from tests.e2e.incluster import EXAMPLES, InCluster
from tests.e2e.test_rollout import MODEL

pytestmark = pytest.mark.node

STABLE, CANARY = "sentiment-stable", "sentiment-canary"


def status_of(story: InCluster, name: str) -> dict[str, Any]:
    mv = story.cluster.kubectl_json("get", "mv", name, namespace=story.namespace)
    status: dict[str, Any] = mv.get("status") or {}
    return status


def ready_and_routed(story: InCluster, names: tuple[str, ...] = (STABLE, CANARY)) -> bool:
    for name in names:
        conditions = {c["type"]: c["status"] for c in status_of(story, name).get("conditions", [])}
        if conditions.get("Ready") != "True" or conditions.get("Routed") != "True":
            return False
    return True


def gateway_weights(story: InCluster, model_name: str = MODEL) -> dict[str, int]:
    model = story.routes().get(model_name) or {"versions": []}
    return {v["name"]: v["weight"] for v in model["versions"]}


def infer(story: InCluster) -> dict[str, Any]:
    request = urllib.request.Request(  # noqa: S310 (http to the gateway)
        f"{story.gateway_url}/v1/models/{MODEL}/infer",
        data=json.dumps({"payload": "a fine day"}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as resp:  # noqa: S310
        answer: dict[str, Any] = json.loads(resp.read())
    return answer


def answered(story: InCluster) -> dict[str, Any] | None:
    try:
        return infer(story)
    except OSError:  # urllib's HTTPError and URLError included
        return None


def kubectl_modelroll(story: InCluster, *args: str) -> subprocess.CompletedProcess[str]:
    """`kubectl modelroll ...` as the user runs it: the plugin found on PATH by kubectl."""
    env = {
        **os.environ,
        "KUBECONFIG": str(story.cluster.kubeconfig),
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    return subprocess.run(
        [str(story.cluster.kubectl_path), "modelroll", "-n", story.namespace, *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )


@pytest.mark.timeout(420)
def test_the_managed_examples_run_as_written_and_their_promote_comment_works(
    on_cluster: InCluster,
) -> None:
    story = on_cluster
    try:
        story.kubectl("apply", "-f", str(EXAMPLES))
        eventually(lambda: ready_and_routed(story), "both examples Ready and Routed", 300)
        # Ready means "serves": one ready pod is enough for it, so the second replica may
        # still be starting when both versions turn Ready.
        eventually(lambda: status_of(story, STABLE).get("readyReplicas") == 2, "2 stable pods", 120)
        # The pods run the image the file names, which `make images` built.
        for name in (STABLE, CANARY):
            written = yaml.safe_load((EXAMPLES / f"{name}.yaml").read_text())
            deployment = story.cluster.kubectl_json(
                "get", "deployment", name, namespace=story.namespace
            )
            pod = deployment["spec"]["template"]["spec"]
            images = {c["image"] for c in pod.get("initContainers", []) + pod["containers"]}
            assert written["spec"]["server"]["image"] in images, images
        eventually(lambda: gateway_weights(story) == {STABLE: 90, CANARY: 10}, "90/10", 60)
        answer = eventually(lambda: answered(story), "an answer through the gateway", 30)
        assert answer["model"] == MODEL
        assert answer["version"] in (STABLE, CANARY)

        # The canary's comment: `kubectl modelroll promote sentiment-canary`, then rollback.
        comment = (EXAMPLES / f"{CANARY}.yaml").read_text()
        for command in ("promote", "rollback"):
            assert f"#   kubectl modelroll {command} {CANARY}\n" in comment
        promoted = kubectl_modelroll(story, "promote", CANARY)
        assert promoted.returncode == 0, promoted.stderr
        eventually(lambda: gateway_weights(story) == {STABLE: 0, CANARY: 100}, "all to canary", 30)
        assert all(infer(story)["version"] == CANARY for _ in range(10))
        back = kubectl_modelroll(story, "rollback", CANARY)
        assert back.returncode == 0, back.stderr
        # Rollback gives back exactly the weights from before the promote, the canary's too.
        eventually(lambda: gateway_weights(story) == {STABLE: 90, CANARY: 10}, "90/10 again", 30)
    finally:
        story.kubectl(
            "delete", "-f", str(EXAMPLES), "--ignore-not-found", "--timeout=120s", check=False
        )
