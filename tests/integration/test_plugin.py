"""`kubectl modelroll`: status, set-weight, promote and rollback against a running operator."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from modelroll_devcluster import Cluster
from tests.support.apiserver import Routes, StartOperator, eventually, model_version
from tests.support.credentials import credential_plugin, exec_kubeconfig

pytestmark = pytest.mark.integration

VENV_BIN = Path(sys.executable).parent
BEFORE_PROMOTE = "modelroll.io/before-promote"


def run(
    cluster: Cluster, namespace: str, *args: str, via_kubectl: bool = False
) -> subprocess.CompletedProcess[str]:
    """The plugin as a person runs it: with the cluster's KUBECONFIG and -n <namespace>."""
    env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig)}
    if via_kubectl:  # kubectl finds kubectl-modelroll on PATH
        env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"
        argv = [str(cluster.kubectl_path), "modelroll", "-n", namespace, *args]
    else:
        argv = [str(VENV_BIN / "kubectl-modelroll"), "-n", namespace, *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=90, env=env, check=False)


def table(output: str) -> list[list[str]]:
    return [line.split() for line in output.strip().splitlines()]


@pytest.fixture
def versions(
    cluster: Cluster, namespace: str, start_operator: StartOperator, routes: Routes
) -> Routes:
    """stable-v1 (weight 9) and canary-v2 (weight 1) of model sentiment, routed."""
    start_operator()
    for name, weight in (("stable-v1", 9), ("canary-v2", 1)):
        manifest = model_version(name, "sentiment", weight=weight, endpoint=f"http://{name}:8000")
        cluster.apply(manifest, namespace=namespace)
    eventually(lambda: routes.weights("sentiment") == {"canary-v2": 1, "stable-v1": 9}, "routed")
    eventually(
        lambda: "90.0%" in run(cluster, namespace, "status").stdout, "shares in the status table"
    )
    return routes


def annotations_of(cluster: Cluster, namespace: str, name: str) -> dict[str, Any]:
    meta = cluster.kubectl_json("get", "mv", name, namespace=namespace)["metadata"]
    return dict(meta.get("annotations") or {})


def test_status_is_a_table_of_each_models_versions(
    cluster: Cluster, namespace: str, versions: Routes
) -> None:
    cluster.apply(model_version("t1", "translate", weight=2, endpoint="http://t1:8000"), namespace)
    eventually(lambda: versions.weights("translate") == {"t1": 2}, "translate routed")
    eventually(lambda: "100.0%" in run(cluster, namespace, "status").stdout, "t1's share")
    result = run(cluster, namespace, "status", via_kubectl=True)
    assert result.returncode == 0, result.stderr
    assert table(result.stdout) == [
        ["MODEL", "VERSION", "WEIGHT", "SHARE", "READY", "ROUTED", "ENDPOINT"],
        ["sentiment", "canary-v2", "1", "10.0%", "True", "Routed", "http://canary-v2:8000"],
        ["sentiment", "stable-v1", "9", "90.0%", "True", "Routed", "http://stable-v1:8000"],
        ["translate", "t1", "2", "100.0%", "True", "Routed", "http://t1:8000"],
    ]
    only = table(run(cluster, namespace, "status", "translate").stdout)
    assert [row[1] for row in only[1:]] == ["t1"]


def test_promote_moves_all_traffic_and_rollback_restores_it(
    cluster: Cluster, namespace: str, versions: Routes
) -> None:
    result = run(cluster, namespace, "promote", "canary-v2")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[:2] == [
        "modelversion/canary-v2 weight 1 -> 10",
        "modelversion/stable-v1 weight 9 -> 0",
    ]
    # By the time promote returns, the operator has routed it.
    assert versions.weights("sentiment") == {"canary-v2": 10, "stable-v1": 0}
    assert ["sentiment", "canary-v2", "10", "100.0%", "True", "Routed"] in [
        row[:6] for row in table("\n".join(lines[2:]))
    ]
    remembered = annotations_of(cluster, namespace, "canary-v2")[BEFORE_PROMOTE]
    assert json.loads(remembered)["weights"] == {"canary-v2": 1, "stable-v1": 9}
    assert BEFORE_PROMOTE not in annotations_of(cluster, namespace, "stable-v1")
    # No workload was touched: promote is a patch of ModelVersions only.
    assert cluster.kubectl_json("get", "deploy,rs,pods", namespace=namespace)["items"] == []

    again = run(cluster, namespace, "promote", "canary-v2")
    assert again.returncode == 0, again.stderr
    assert again.stdout.startswith("Nothing to change in model sentiment.")

    back = run(cluster, namespace, "rollback", "canary-v2")
    assert back.returncode == 0, back.stderr
    assert back.stdout.splitlines()[:2] == [
        "modelversion/stable-v1 weight 0 -> 9",
        "modelversion/canary-v2 weight 10 -> 1",
    ]
    # Exactly the weights from before the promote: 9 and 1 again.
    assert versions.weights("sentiment") == {"canary-v2": 1, "stable-v1": 9}
    assert BEFORE_PROMOTE not in annotations_of(cluster, namespace, "canary-v2")


def stored(cluster: Cluster, namespace: str) -> dict[str, tuple[int, int, dict[str, str]]]:
    """Each ModelVersion's (spec.weight, metadata.generation, the plugin's annotations)."""
    items = cluster.kubectl_json("get", "mv", namespace=namespace)["items"]
    ours = (BEFORE_PROMOTE,)
    return {
        item["metadata"]["name"]: (
            item["spec"]["weight"],
            item["metadata"]["generation"],
            {k: v for k, v in (item["metadata"].get("annotations") or {}).items() if k in ours},
        )
        for item in items
    }


def weights(cluster: Cluster, namespace: str) -> dict[str, int]:
    return {name: weight for name, (weight, _, _) in stored(cluster, namespace).items()}


def add_version(cluster: Cluster, namespace: str, routes: Routes, name: str) -> None:
    """One more external version of model sentiment, at weight 0, Ready."""
    cluster.apply(
        model_version(name, "sentiment", weight=0, endpoint=f"http://{name}:8000"), namespace
    )
    eventually(
        lambda: (
            [name, "0", "True"]
            in [[r[1], r[2], r[4]] for r in table(run(cluster, namespace, "status").stdout)[1:]]
        ),
        f"{name} Ready",
    )


def test_rollback_after_two_promotes_restores_the_weights_right_before_the_last_one(
    cluster: Cluster, namespace: str, versions: Routes
) -> None:
    add_version(cluster, namespace, versions, "next-v3")
    first = run(cluster, namespace, "promote", "canary-v2")
    assert first.returncode == 0, first.stderr
    second = run(cluster, namespace, "promote", "next-v3")
    assert second.returncode == 0, second.stderr
    assert second.stdout.splitlines()[:2] == [
        "modelversion/next-v3 weight 0 -> 10",
        "modelversion/canary-v2 weight 10 -> 0",
    ]
    before_last = {"canary-v2": 10, "next-v3": 0, "stable-v1": 0}
    remembered = json.loads(annotations_of(cluster, namespace, "next-v3")[BEFORE_PROMOTE])
    assert remembered["weights"] == before_last
    assert BEFORE_PROMOTE not in annotations_of(cluster, namespace, "canary-v2")
    status = run(cluster, namespace, "status")
    note = (
        r"next-v3 was promoted at \d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ; the weights before: "
        r"canary-v2 10, next-v3 0, stable-v1 0\. "
        rf"`kubectl modelroll -n {namespace} rollback next-v3` gives them back\."
    )
    assert re.search(note, status.stdout), status.stdout

    back = run(cluster, namespace, "rollback", "next-v3")
    assert back.returncode == 0, back.stderr
    assert back.stdout.splitlines()[:2] == [
        "modelversion/canary-v2 weight 0 -> 10",
        "modelversion/next-v3 weight 10 -> 0",
    ]
    assert weights(cluster, namespace) == before_last  # stable-v1 did not get its 9 back
    assert versions.weights("sentiment") == before_last  # and the operator has routed it
    assert all(BEFORE_PROMOTE not in a for _, _, a in stored(cluster, namespace).values())


@pytest.mark.parametrize(
    ("garbage", "why"),
    [
        ("abc", "not JSON (Expecting value: line 1 column 1 (char 0))"),
        ("99999", "expected a JSON object, found 99999"),
        (
            '{"model":"sentiment","weights":{"canary-v2":1,"stable-v1":99999}}',
            "the weight of stable-v1 is 99999, outside 0..1000",
        ),
        (
            '{"model":"sentiment","weights":{"canary-v2":1,"stable-v1":-5}}',
            "the weight of stable-v1 is -5, outside 0..1000",
        ),
        ('{"weights":{"stable-v1":"abc"}}', 'the weight of stable-v1 is "abc", not an integer'),
    ],
)
def test_unusable_remembered_weights_show_in_status_and_rollback_patches_nothing(
    cluster: Cluster, namespace: str, versions: Routes, garbage: str, why: str
) -> None:
    add_version(cluster, namespace, versions, "other-v0")  # a third version: a multi-patch plan
    cluster.kubectl(
        "patch",
        "mv",
        "other-v0",
        "--type=merge",
        "-p",
        '{"spec":{"weight":2}}',
        namespace=namespace,
    )
    promoted = run(cluster, namespace, "promote", "canary-v2")
    assert promoted.returncode == 0, promoted.stderr
    cluster.kubectl(
        "annotate",
        "--overwrite",
        "mv",
        "canary-v2",
        f"{BEFORE_PROMOTE}={garbage}",
        namespace=namespace,
    )
    before = stored(cluster, namespace)
    assert {name: w for name, (w, _, _) in before.items()} == {
        "canary-v2": 12,
        "other-v0": 0,
        "stable-v1": 0,
    }

    status = run(cluster, namespace, "status")
    assert status.returncode == 0, status.stderr
    assert status.stderr == ""
    rows = table(status.stdout)
    assert [r[1:3] for r in rows[1:4]] == [
        ["canary-v2", "12"],
        ["other-v0", "0"],
        ["stable-v1", "0"],
    ]
    assert (
        f"warning: canary-v2: annotation {BEFORE_PROMOTE} is unusable: {why}. "
        f"`kubectl modelroll -n {namespace} rollback canary-v2` refuses until it is fixed or "
        f"removed (kubectl annotate -n {namespace} mv canary-v2 {BEFORE_PROMOTE}-)."
    ) in status.stdout

    for force in ((), ("--force",)):
        refused = run(cluster, namespace, "rollback", "canary-v2", *force)
        assert refused.returncode == 1
        assert "Traceback" not in refused.stderr
        assert refused.stderr.startswith(
            f"error: cannot roll back canary-v2: its annotation {BEFORE_PROMOTE}, the weights "
            f"before its promote, is unusable: {why}. Nothing was changed."
        ), refused.stderr
        assert f"kubectl modelroll -n {namespace} set-weight canary-v2 0" in refused.stderr
        assert refused.stdout == ""
        assert stored(cluster, namespace) == before  # weights, generations, annotations

    # The way out the message names works: a weight for the version that should serve, then
    # canary-v2's traffic away (on its own that would leave the model nothing: refused).
    alone = run(cluster, namespace, "set-weight", "canary-v2", "0", "--wait=0")
    assert alone.returncode == 1
    assert "no version would have a weight above 0" in alone.stderr
    for name, weight in (("stable-v1", "9"), ("canary-v2", "0")):
        out = run(cluster, namespace, "set-weight", name, weight, "--wait=0")
        assert out.returncode == 0, out.stderr
    assert weights(cluster, namespace) == {"canary-v2": 0, "other-v0": 0, "stable-v1": 9}


def test_set_weight_patches_one_version_and_reports_what_the_api_server_refuses(
    cluster: Cluster, namespace: str, versions: Routes
) -> None:
    result = run(cluster, namespace, "set-weight", "canary-v2", "3")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0] == "modelversion/canary-v2 weight 1 -> 3"
    assert versions.weights("sentiment") == {"canary-v2": 3, "stable-v1": 9}

    negative = run(cluster, namespace, "set-weight", "canary-v2", "-1")
    assert negative.returncode == 1
    assert "spec.weight in body should be greater than or equal to 0" in negative.stderr
    missing = run(cluster, namespace, "set-weight", "nope", "3")
    assert missing.returncode == 1
    assert (
        missing.stderr.strip() == f'error: ModelVersion "nope" not found in namespace {namespace}'
    )


def test_set_weight_refuses_to_leave_the_model_no_ready_weighted_version_unless_forced(
    cluster: Cluster, namespace: str, versions: Routes
) -> None:
    """The README's guard rail: `set-weight V 0` of the only Ready, weighted version used to
    exit 0 and leave the gateway answering 503 for the model."""
    dark = run(cluster, namespace, "set-weight", "canary-v2", "0", via_kubectl=True)
    assert dark.returncode == 0, dark.stderr  # stable-v1 still serves
    assert dark.stdout.splitlines()[0] == "modelversion/canary-v2 weight 1 -> 0"
    assert versions.weights("sentiment") == {"canary-v2": 0, "stable-v1": 9}
    before = stored(cluster, namespace)

    refused = run(cluster, namespace, "set-weight", "stable-v1", "0", via_kubectl=True)
    assert refused.returncode == 1
    assert refused.stdout == ""
    assert "Traceback" not in refused.stderr
    assert refused.stderr.startswith(
        "error: setting stable-v1's weight to 0 would leave model sentiment with no Ready "
        "version that has weight, so the gateway would answer 503 for it"
    ), refused.stderr
    assert "Nothing was changed." in refused.stderr
    assert "--force" in refused.stderr
    assert stored(cluster, namespace) == before  # weights, generations, annotations
    assert versions.weights("sentiment") == {"canary-v2": 0, "stable-v1": 9}

    # Weight that would go only to a version that is not Ready counts as none.
    cold = model_version("cold-v3", "sentiment", weight=0, server={"image": "acme/s:3"})
    cluster.apply(cold, namespace=namespace)
    moved = run(cluster, namespace, "set-weight", "cold-v3", "5")  # stable-v1 still serves
    assert moved.returncode == 0, moved.stderr
    eventually(
        lambda: (
            "ReplicasNotReady" in run(cluster, namespace, "set-weight", "stable-v1", "0").stderr
        ),
        "the operator reporting cold-v3 not Ready",
    )
    refused = run(cluster, namespace, "set-weight", "stable-v1", "0")
    assert refused.returncode == 1
    assert "cold-v3 is not Ready (ReplicasNotReady" in refused.stderr
    assert "and would have weight 5" in refused.stderr
    assert weights(cluster, namespace)["stable-v1"] == 9

    forced = run(cluster, namespace, "set-weight", "stable-v1", "0", "--force", via_kubectl=True)
    assert forced.returncode == 0, forced.stderr
    assert forced.stdout.splitlines()[0] == "modelversion/stable-v1 weight 9 -> 0"
    assert weights(cluster, namespace) == {"canary-v2": 0, "cold-v3": 5, "stable-v1": 0}


def test_promote_refuses_a_version_that_is_not_ready(
    cluster: Cluster, namespace: str, versions: Routes
) -> None:
    manifest = model_version("cold-v3", "sentiment", weight=0, server={"image": "acme/s:3"})
    cluster.apply(manifest, namespace=namespace)
    eventually(
        lambda: "ReplicasNotReady" in run(cluster, namespace, "promote", "cold-v3").stderr,
        "the operator reporting cold-v3 not Ready",
    )
    refused = run(cluster, namespace, "promote", "cold-v3")
    assert refused.returncode == 1
    assert "cold-v3 is not Ready" in refused.stderr
    assert "--force" in refused.stderr
    assert versions.weights("sentiment") == {"canary-v2": 1, "stable-v1": 9}


@pytest.mark.usefixtures("crd")
def test_without_an_operator_a_change_is_made_and_the_wait_says_so(
    cluster: Cluster, namespace: str
) -> None:
    cluster.apply(
        model_version("lonely", "sentiment", weight=1, endpoint="http://l:8000"), namespace
    )
    # Without an operator nothing is Ready: the guard rail would refuse without --force.
    result = run(cluster, namespace, "set-weight", "lonely", "4", "--force", "--wait=1")
    assert result.returncode == 1
    assert "has not reconciled lonely within 1s (is modelroll-operator running?)" in result.stderr
    assert cluster.kubectl_json("get", "mv", "lonely", namespace=namespace)["spec"]["weight"] == 4


def test_an_exec_credential_plugin_in_the_kubeconfig_works_and_its_failure_is_named(
    cluster: Cluster, namespace: str, versions: Routes, tmp_path: Path
) -> None:
    """The token comes from a ServiceAccount that may read and patch ModelVersions here."""
    cluster.kubectl("create", "serviceaccount", "plugin-user", namespace=namespace)
    cluster.kubectl(
        "create",
        "role",
        "modelversions",
        "--verb=get,list,patch",
        "--resource=modelversions.modelroll.io",
        namespace=namespace,
    )
    cluster.kubectl(
        "create",
        "rolebinding",
        "plugin-user",
        "--role=modelversions",
        f"--serviceaccount={namespace}:plugin-user",
        namespace=namespace,
    )
    token = cluster.kubectl("create", "token", "plugin-user", namespace=namespace).stdout.strip()
    plugin = credential_plugin(tmp_path / "get-token", token)
    kubeconfig = exec_kubeconfig(cluster, tmp_path / "exec.kubeconfig", plugin)
    binary = str(VENV_BIN / "kubectl-modelroll")

    def plugin_run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [binary, f"--kubeconfig={kubeconfig}", "-n", namespace, *args],
            capture_output=True,
            text=True,
            timeout=90,
            check=False,
        )

    status = plugin_run("status")
    assert status.returncode == 0, status.stderr
    assert [row[1] for row in table(status.stdout)[1:]] == ["canary-v2", "stable-v1"]
    changed = plugin_run("set-weight", "canary-v2", "2")
    assert changed.returncode == 0, changed.stderr
    eventually(lambda: versions.weights("sentiment") == {"canary-v2": 2, "stable-v1": 9}, "2:9")

    credential_plugin(plugin, None)  # now it fails
    failed = plugin_run("status")
    assert failed.returncode != 0
    assert f"exec credential plugin '{plugin}' gave no token" in failed.stderr
    assert "no credentials for you" in failed.stderr  # the plugin's own words, passed on
