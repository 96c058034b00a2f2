"""examples/managed/ exactly as a user applies it (README "A local node"): no renaming, no
patching. Both versions run on the node with the image `make images` built, the gateway Service
answers for model sentiment, and the canary's "Promote" comment does what it says.

The rollout story (test_rollout_on_node.py) runs copies of these examples changed for its own
scenario; this test is the one that holds the files themselves to their word.
"""

from __future__ import annotations

import json
import urllib.request
from typing import Any

import pytest
import yaml

from tests.support.incluster import EXAMPLES, InCluster
from tests.support.pods import (
    CANARY,
    STABLE,
    gateway_weights,
    kubectl_modelroll,
    ready_and_routed,
    status_of,
)
from tests.support.stack import eventually
from tests.support.story import MODEL

pytestmark = pytest.mark.node


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
