"""One model's reconcile pass against an in-memory API: what gets written, and when nothing is.

The real API server is in tests/integration; here the point is the pass's logic: the routes
entry, statuses, events, workloads, no writes on a replay, and retries that keep the queue alive.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from typing import Any, cast

import pytest

from modelroll_operator.api import Api, KubeApiError
from modelroll_operator.config import OperatorConfig
from modelroll_operator.reconcile import Reconciler, VersionIndex, WorkloadIndex
from modelroll_operator.snapshots import VersionInfo, WorkloadInfo
from tests.support.fake_api import FakeApi
from tests.support.specs import version

CM = "/api/v1/namespaces/prod/configmaps/modelroll-routes"


class World:
    """Indices as kopf would fill them, and a reconciler over the fake API."""

    def __init__(self, *versions: VersionInfo) -> None:
        self.api = FakeApi()
        self.versions: dict[tuple[str, str], list[VersionInfo]] = {}
        self.deployments: dict[tuple[str, str], list[WorkloadInfo]] = {}
        self.services: dict[tuple[str, str], list[WorkloadInfo]] = {}
        for v in versions:
            self.versions.setdefault(v.model_key, []).append(v)
        config = OperatorConfig(retry_initial_s=0.01, retry_max_s=0.05, workers=2)
        self.reconciler = Reconciler(
            cast(Api, self.api),
            config,
            cast(VersionIndex, self.versions),
            cast(WorkloadIndex, self.deployments),
            cast(WorkloadIndex, self.services),
        )

    def observe(self) -> None:
        """Feed what was written back into the indices, as the watches would."""
        for key, store in self.versions.items():
            refreshed = []
            for v in store:
                body = self.api.objects.get(
                    f"/apis/modelroll.io/v1alpha1/namespaces/prod/modelversions/{v.name}"
                )
                status = (body or {}).get("status", v.status)
                refreshed.append(dataclasses.replace(v, status=status))
            self.versions[key] = refreshed
        for body in self.api.objects.values():
            kind = body.get("kind")
            if kind in ("Deployment", "Service"):
                info = WorkloadInfo.from_body(kind, body)
                assert info is not None
                index = self.deployments if kind == "Deployment" else self.services
                index[info.key] = [info]

    def route(self, model: str) -> dict[str, Any]:
        doc: dict[str, Any] = json.loads(self.api.objects[CM]["data"][model])
        return doc


def external(name: str, weight: int) -> VersionInfo:
    return version(name, weight=weight, endpoint=f"http://{name}:8000", uid=f"uid-{name}")


async def test_a_pass_writes_the_route_statuses_and_events_and_a_replay_writes_nothing() -> None:
    world = World(external("stable-v1", 9), external("canary-v2", 1))
    await world.reconciler.reconcile(("prod", "sentiment"))
    assert world.route("sentiment")["versions"] == [
        {"name": "canary-v2", "weight": 1, "endpoint": "http://canary-v2:8000"},
        {"name": "stable-v1", "weight": 9, "endpoint": "http://stable-v1:8000"},
    ]
    status_paths = [p for op, p in world.api.writes if p.endswith("/status")]
    assert len(status_paths) == 2
    assert {(name, reason) for name, reason, _ in world.api.events} == {
        ("canary-v2", "Routed"),
        ("stable-v1", "Routed"),
    }

    world.observe()
    world.api.writes.clear()
    world.api.events.clear()
    await world.reconciler.reconcile(("prod", "sentiment"))
    assert world.api.writes == []
    assert world.api.events == []


def reweighted(world: World, name: str, weight: int) -> None:
    """``name``'s spec.weight set to ``weight`` (its generation moves on), as the watch shows."""
    world.versions[("prod", "sentiment")] = [
        dataclasses.replace(
            v, spec=dataclasses.replace(v.spec, weight=weight), generation=v.generation + 1
        )
        if v.name == name and v.spec is not None
        else v
        for v in world.versions[("prod", "sentiment")]
    ]


async def test_a_weight_change_writes_the_status_of_that_version_only() -> None:
    """Its siblings' shares move, but their statuses hold only what is their own: a change to
    one of 50 versions is one status write, not 50."""
    world = World(*(external(f"v{i:02}", 1) for i in range(50)))
    await world.reconciler.reconcile(("prod", "sentiment"))
    world.observe()
    world.api.writes.clear()

    reweighted(world, "v07", 5)
    await world.reconciler.reconcile(("prod", "sentiment"))
    assert [p for op, p in world.api.writes if p.endswith("/status")] == [
        "/apis/modelroll.io/v1alpha1/namespaces/prod/modelversions/v07/status"
    ]
    assert status_of(world, "v07")["routedWeight"] == 5


async def test_the_last_version_gone_takes_the_models_key_and_leaves_others_alone() -> None:
    world = World(external("stable-v1", 9))
    world.api.objects[CM] = {"metadata": {"name": "modelroll-routes"}, "data": {"other": "{}"}}
    await world.reconciler.reconcile(("prod", "sentiment"))
    assert set(world.api.objects[CM]["data"]) == {"other", "sentiment"}
    world.versions[("prod", "sentiment")] = []
    await world.reconciler.reconcile(("prod", "sentiment"))
    assert world.api.objects[CM]["data"] == {"other": "{}"}


async def test_a_managed_version_is_applied_once_and_a_weight_change_does_not_reapply() -> None:
    world = World(version("canary-v2", weight=1, uid="uid-c"))
    await world.reconciler.reconcile(("prod", "sentiment"))
    applied = [p for op, p in world.api.writes if op == "apply"]
    assert applied == [  # the Deployment first: a refused one leaves no Service behind
        "/apis/apps/v1/namespaces/prod/deployments/canary-v2",
        "/api/v1/namespaces/prod/services/canary-v2",
    ]
    assert world.route("sentiment")["versions"] == []  # no ready replica yet

    world.observe()
    world.versions[("prod", "sentiment")] = [version("canary-v2", weight=5, uid="uid-c")]
    world.api.writes.clear()
    await world.reconciler.reconcile(("prod", "sentiment"))
    assert [op for op, _ in world.api.writes if op == "apply"] == []


async def test_a_failing_api_is_retried_and_the_workers_keep_going() -> None:
    world = World(external("stable-v1", 9))
    world.api.failures = 3
    world.reconciler.start()
    try:
        world.reconciler.enqueue(("prod", "sentiment"))
        for _ in range(200):
            if CM in world.api.objects:
                break
            await asyncio.sleep(0.01)
        assert world.route("sentiment")["versions"][0]["name"] == "stable-v1"
        # Still serving: another model goes through too.
        world.versions[("prod", "translate")] = [
            version("t1", model="translate", endpoint="http://t1")
        ]
        world.reconciler.enqueue(("prod", "translate"))
        for _ in range(200):
            if "translate" in world.api.objects[CM]["data"]:
                break
            await asyncio.sleep(0.01)
        assert "translate" in world.api.objects[CM]["data"]
        assert world.reconciler.pending == 0
    finally:
        await world.reconciler.stop()


async def test_a_configmap_created_meanwhile_is_patched_instead() -> None:
    world = World(external("stable-v1", 9))
    original_get = world.api.get

    async def racing_get(path: str) -> dict[str, Any] | None:
        if path == CM and CM not in world.api.objects:
            # Someone creates it between our read and our create.
            world.api.objects[CM] = {"metadata": {"name": "modelroll-routes"}, "data": {"x": "{}"}}
            return None
        return await original_get(path)

    world.api.get = racing_get  # type: ignore[method-assign]
    await world.reconciler.reconcile(("prod", "sentiment"))
    assert set(world.api.objects[CM]["data"]) == {"x", "sentiment"}


def status_of(world: World, name: str) -> dict[str, Any]:
    path = f"/apis/modelroll.io/v1alpha1/namespaces/prod/modelversions/{name}"
    status: dict[str, Any] = world.api.objects[path]["status"]
    return status


def condition_of(world: World, name: str, kind: str) -> dict[str, Any]:
    return next(c for c in status_of(world, name)["conditions"] if c["type"] == kind)


async def test_a_refused_workload_is_reported_on_its_version_and_the_rest_goes_on() -> None:
    world = World(external("stable-v1", 9), version("canary-v2", weight=1, uid="uid-c"))
    deployment = "/apis/apps/v1/namespaces/prod/deployments/canary-v2"
    world.api.refuse[deployment] = KubeApiError(403, "Forbidden", "exceeded quota: q")
    result = await world.reconciler.reconcile(("prod", "sentiment"))
    assert [v["name"] for v in world.route("sentiment")["versions"]] == ["stable-v1"]
    assert status_of(world, "stable-v1")["routedWeight"] == 9
    ready = condition_of(world, "canary-v2", "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "WorkloadRefused")
    assert "exceeded quota: q" in ready["message"]
    assert ("canary-v2", "WorkloadRefused") in {(n, r) for n, r, _ in world.api.events}
    assert len(result.problems) == 1
    assert "canary-v2" in result.problems[0]

    world.api.events.clear()
    await world.reconciler.reconcile(("prod", "sentiment"))  # a retry: no second warning
    assert world.api.events == []


async def test_a_refused_route_leaves_statuses_on_the_route_in_force() -> None:
    world = World(external("stable-v1", 1), external("canary-v2", 1))
    await world.reconciler.reconcile(("prod", "sentiment"))
    world.observe()
    world.api.refuse[CM] = KubeApiError(422, "Invalid", "frozen")
    reweighted(world, "stable-v1", 3)
    result = await world.reconciler.reconcile(("prod", "sentiment"))
    assert result.in_force is not None
    assert {v.name: v.weight for v in result.in_force.versions} == {"stable-v1": 1, "canary-v2": 1}
    assert status_of(world, "stable-v1")["routedWeight"] == 1  # what the gateway has, not 3
    routed = condition_of(world, "stable-v1", "Routed")
    assert routed["reason"] == "RoutesNotWritten"
    assert "frozen" in routed["message"]
    assert routed["message"].endswith("the gateway still routes it with weight 1")
    assert result.problems


async def test_a_workload_changed_by_someone_else_is_applied_again() -> None:
    world = World(version("canary-v2", weight=1, uid="uid-c"))
    await world.reconciler.reconcile(("prod", "sentiment"))
    world.observe()
    key = ("prod", "canary-v2")
    world.deployments[key] = [dataclasses.replace(world.deployments[key][0], generation=7)]
    world.api.writes.clear()
    await world.reconciler.reconcile(("prod", "sentiment"))
    assert [p for op, p in world.api.writes if op == "apply"] == [
        "/apis/apps/v1/namespaces/prod/deployments/canary-v2"
    ]


async def test_own_configmap_writes_requeue_nothing_and_foreign_keys_are_requeued() -> None:
    world = World(external("stable-v1", 9))
    await world.reconciler.reconcile(("prod", "sentiment"))
    data = dict(world.api.objects[CM]["data"])
    world.reconciler.routes_changed("prod", data)
    assert world.reconciler.pending == 0
    world.reconciler.routes_changed("prod", {**data, "ghost": "{}"})
    world.reconciler.routes_changed("prod", {"sentiment": "edited"})
    assert world.reconciler.pending == 2  # ghost (no versions: its key goes), sentiment


async def test_sidecar_settings_on_an_external_version_are_said_to_be_ignored() -> None:
    tuned = version(
        "stable-v1",
        endpoint="http://stable-v1:8000",
        uid="uid-s",
        batching={"maxBatchSize": 8},
        sidecar={"upstreamTimeoutMs": 1000},
    )
    world = World(tuned)
    await world.reconciler.reconcile(("prod", "sentiment"))
    ready = condition_of(world, "stable-v1", "Ready")
    assert (ready["status"], ready["reason"]) == ("True", "ExternalEndpoint")
    assert ready["message"] == (
        "External mode: requests go to http://stable-v1:8000; spec.batching.maxBatchSize, "
        "spec.sidecar.upstreamTimeoutMs are ignored: an external version runs no modelroll sidecar"
    )
    assert ("stable-v1", "SettingsIgnored") in {(n, r) for n, r, _ in world.api.events}


def serving(world: World, name: str, **status: Any) -> None:
    """What the watches show once the version's pod is ready (the status of its Deployment)."""
    world.observe()
    key = ("prod", name)
    (deployment,) = world.deployments[key]
    figures = {"replicas": 1, "ready_replicas": 1, **status}
    world.deployments[key] = [dataclasses.replace(deployment, **figures)]


DEPLOYMENT = "/apis/apps/v1/namespaces/prod/deployments/solo-v1"
SERVICE = "/api/v1/namespaces/prod/services/solo-v1"


@pytest.mark.parametrize(
    ("server", "refusal", "says"),
    [
        ({"port": 8000}, None, "spec.server.port 8000 is the batching sidecar's port"),
        (
            {"tolerations": [{"key": "gpu", "operator": "Sometimes"}]},
            KubeApiError(422, "Invalid", 'spec.template.spec.tolerations[0].operator: "Sometimes"'),
            "tolerations[0].operator",
        ),
        (
            {"imagePullSecrets": [{"name": "r"}, {"name": "r"}]},
            KubeApiError(
                500,
                "InternalError",
                "failed to create typed patch object: .spec.template.spec.imagePullSecrets: "
                'duplicate entries for key [name="r"]',
            ),
            "duplicate entries for key",
        ),
    ],
    ids=["operator refuses", "422", "server-side apply's duplicate keys"],
)
async def test_a_refused_edit_of_the_only_serving_version_changes_nothing_that_serves(
    server: dict[str, Any], refusal: KubeApiError | None, says: str
) -> None:
    """A single-version model whose edit cannot be applied keeps answering from its previous
    pods: same route, Ready on the previous spec with the refusal named, and a refusal for good
    is not retried (the pass reports no problem to retry)."""
    image = {"image": "ghcr.io/acme/solo:1", "port": 9000}
    world = World(version("solo-v1", weight=1, uid="uid-s", server=image))
    await world.reconciler.reconcile(("prod", "sentiment"))
    serving(world, "solo-v1")
    await world.reconciler.reconcile(("prod", "sentiment"))
    before = world.route("sentiment")
    assert [v["name"] for v in before["versions"]] == ["solo-v1"]

    world.observe()
    world.versions[("prod", "sentiment")] = [
        version("solo-v1", weight=1, uid="uid-s", generation=2, server={**image, **server})
    ]
    serving(world, "solo-v1")
    if refusal is not None:
        world.api.refuse[DEPLOYMENT] = refusal
    world.api.writes.clear()
    result = await world.reconciler.reconcile(("prod", "sentiment"))
    assert world.route("sentiment") == before
    ready = condition_of(world, "solo-v1", "Ready")
    assert (ready["status"], ready["reason"]) == ("True", "UpdateRefused")
    assert "running its previous spec" in ready["message"]
    assert says in ready["message"]
    assert result.problems == ()  # nothing to retry: the same spec would be refused again
    assert not [p for op, p in world.api.writes if op == "apply"]  # nothing was changed


async def test_a_new_version_whose_deployment_is_refused_gets_no_service() -> None:
    world = World(version("solo-v1", weight=1, uid="uid-s"))
    world.api.refuse[DEPLOYMENT] = KubeApiError(422, "Invalid", "spec.template: bad")
    await world.reconciler.reconcile(("prod", "sentiment"))
    ready = condition_of(world, "solo-v1", "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "InvalidSpec")
    assert SERVICE not in world.api.objects


async def test_pods_the_cluster_refuses_are_named_in_the_versions_status() -> None:
    """The ReplicaSet's FailedCreate (a quota, Pod Security admission), which the Deployment
    carries as its ReplicaFailure condition, is the version's Ready message and a Warning."""
    world = World(version("solo-v1", weight=1, uid="uid-s"))
    await world.reconciler.reconcile(("prod", "sentiment"))
    why = 'pods "solo-v1-abc" is forbidden: failed quota: q: must specify limits.cpu for: sidecar'
    serving(world, "solo-v1", ready_replicas=0, replicas=0, failure=why)
    await world.reconciler.reconcile(("prod", "sentiment"))
    ready = condition_of(world, "solo-v1", "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "PodsRefused")
    assert why in ready["message"]
    assert ("solo-v1", "PodsRefused") in {(n, r) for n, r, _ in world.api.events}


def test_the_deployments_replica_failure_is_read_from_its_conditions() -> None:
    body: dict[str, Any] = {
        "metadata": {"name": "solo-v1", "labels": {"modelroll.io/version": "solo-v1"}},
        "status": {
            "conditions": [
                {"type": "Available", "status": "False"},
                {
                    "type": "ReplicaFailure",
                    "status": "True",
                    "reason": "FailedCreate",
                    "message": "pods is forbidden: violates PodSecurity",
                },
            ]
        },
    }
    info = WorkloadInfo.from_body("Deployment", body)
    assert info is not None
    assert info.failure == "pods is forbidden: violates PodSecurity"
    body["status"]["conditions"][1]["status"] = "False"
    info = WorkloadInfo.from_body("Deployment", body)
    assert info is not None
    assert info.failure is None
