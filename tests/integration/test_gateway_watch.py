"""The gateway follows the routes ConfigMap through a real kube-apiserver.

The gateway runs as its own process (`modelroll-gateway --namespace ... --kubeconfig ...`); the
test writes the ConfigMap with kubectl, using the merge patches the operator will send.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from kubernetes import client as k8s
from prometheus_client import CollectorRegistry
from pytest_aiohttp import AiohttpServer

from modelroll_common.kube import connect
from modelroll_common.routes import (
    CONFIGMAP_NAME,
    ModelRoute,
    VersionRoute,
    configmap_delete_patch,
    configmap_patch,
)
from modelroll_devcluster import Cluster
from modelroll_gateway.metrics import GatewayMetrics
from modelroll_gateway.table import RouteTable
from modelroll_gateway.watch import ConfigMapWatcher
from tests.support.credentials import credential_plugin, exec_kubeconfig
from tests.support.processes import Proc, Spawn, free_port

pytestmark = pytest.mark.integration

PICKUP_BOUND = 1.0
"""DESIGN: new weights are in force in under a second (a functional bound, not a benchmark)."""


def model_route(model: str, **versions: tuple[int, str]) -> ModelRoute:
    return ModelRoute(model, tuple(VersionRoute(n, w, e) for n, (w, e) in versions.items()))


class RoutesConfigMap:
    """The namespace's routes ConfigMap, written the way the operator writes it."""

    def __init__(self, cluster: Cluster, namespace: str) -> None:
        self.cluster = cluster
        self.namespace = namespace

    def create(self, data: dict[str, str] | None = None) -> None:
        manifest = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": CONFIGMAP_NAME},
            "data": data or {},
        }
        self.cluster.apply(manifest, namespace=self.namespace)

    def merge(self, patch: dict[str, Any]) -> None:
        self.cluster.kubectl(
            "patch",
            "configmap",
            CONFIGMAP_NAME,
            "--type=merge",
            "-p",
            json.dumps(patch),
            namespace=self.namespace,
        )

    def set_route(self, route: ModelRoute) -> None:
        self.merge(configmap_patch(route))

    def delete(self) -> None:
        self.cluster.kubectl("delete", "configmap", CONFIGMAP_NAME, namespace=self.namespace)


@pytest.fixture
def routes(cluster: Cluster, namespace: str) -> RoutesConfigMap:
    return RoutesConfigMap(cluster, namespace)


class GatewayProcess:
    def __init__(
        self, proc: Proc, port: int, admin_port: int, session: aiohttp.ClientSession
    ) -> None:
        self.proc = proc
        self.base = f"http://127.0.0.1:{port}"
        self.admin = f"http://127.0.0.1:{admin_port}"
        """Its admin port: GET /metrics and GET /v1/routes."""
        self.session = session

    async def routes(self) -> dict[str, Any]:
        async with self.session.get(f"{self.admin}/v1/routes") as resp:
            assert resp.status == 200
            doc: dict[str, Any] = await resp.json()
            return doc

    async def weights(self, model: str) -> dict[str, int] | None:
        for item in (await self.routes())["models"]:
            if item["model"] == model:
                return {v["name"]: v["weight"] for v in item["versions"]}
        return None

    async def until(
        self, check: Callable[[dict[str, Any]], bool], within: float = 15.0
    ) -> tuple[float, dict[str, Any]]:
        """Poll GET /v1/routes until `check` holds: (seconds it took, the document)."""
        started = time.monotonic()
        while True:
            doc = await self.routes()
            if check(doc):
                return time.monotonic() - started, doc
            if time.monotonic() - started > within:
                pytest.fail(f"the gateway never saw the change; it shows {doc}\n{self.proc.log()}")
            await asyncio.sleep(0.02)

    async def infer(self, model: str) -> tuple[int, str]:
        url = f"{self.base}/v1/models/{model}/infer"
        async with self.session.post(url, json={"payload": "a fine film"}) as resp:
            await resp.read()
            return resp.status, resp.headers["X-Modelroll-Version"]

    async def metric(self, line_start: str) -> float:
        async with self.session.get(f"{self.admin}/metrics") as resp:
            for line in (await resp.text()).splitlines():
                if line.startswith(line_start):
                    return float(line.rsplit(" ", 1)[1])
        return 0.0


StartGateway = Callable[..., GatewayProcess]


@pytest.fixture
async def start_gateway(
    spawn: Spawn, cluster: Cluster, namespace: str
) -> AsyncIterator[StartGateway]:
    """Start `modelroll-gateway` watching the test namespace; wait until it is ready."""
    session = aiohttp.ClientSession()

    def start(*extra: str, kubeconfig: Path | None = None) -> GatewayProcess:
        port, admin_port = free_port(), free_port()
        proc = spawn(
            "modelroll-gateway",
            f"--port={port}",
            f"--admin-port={admin_port}",
            f"--namespace={namespace}",
            f"--kubeconfig={kubeconfig or cluster.kubeconfig}",
            *extra,
            ready=f"http://127.0.0.1:{port}/readyz",
        )
        return GatewayProcess(proc, port, admin_port, session)

    yield start
    await session.close()


async def eventually(check: Callable[[], bool], what: str, within: float = 15.0) -> None:
    deadline = time.monotonic() + within
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"{what} did not happen within {within:.0f}s")
        await asyncio.sleep(0.05)


async def kubectl(fn: Callable[..., None], *args: Any) -> None:
    """Run a blocking kubectl helper off the event loop."""
    await asyncio.to_thread(fn, *args)


async def test_a_weight_change_is_in_force_within_one_second(
    routes: RoutesConfigMap, start_gateway: StartGateway
) -> None:
    routes.create()
    routes.set_route(
        model_route("sentiment", stable=(9, "http://s:8000"), canary=(1, "http://c:8000"))
    )
    gw = start_gateway()
    await gw.until(lambda d: bool(d["models"]))
    assert await gw.weights("sentiment") == {"stable": 9, "canary": 1}

    for stable, canary in ((1, 1), (0, 10), (9, 1)):
        route = model_route(
            "sentiment", stable=(stable, "http://s:8000"), canary=(canary, "http://c:8000")
        )
        await kubectl(routes.set_route, route)
        expected = [{"stable": stable, "canary": canary}]

        def seen(doc: dict[str, Any], want: list[dict[str, int]] = expected) -> bool:
            return [{v["name"]: v["weight"] for v in m["versions"]} for m in doc["models"]] == want

        took, _ = await gw.until(seen)
        assert took < PICKUP_BOUND, f"weights {expected} took {took:.2f}s to reach the gateway"
    assert await gw.metric('modelroll_gateway_weight{model="sentiment",version="stable"}') == 9


async def test_an_invalid_document_keeps_the_old_routes(
    routes: RoutesConfigMap, start_gateway: StartGateway
) -> None:
    routes.create()
    routes.set_route(
        model_route("sentiment", stable=(9, "http://s:8000"), canary=(1, "http://c:8000"))
    )
    gw = start_gateway()
    await gw.until(lambda d: bool(d["models"]))

    bad = {"model": "sentiment", "versions": [{"name": "stable", "weight": "ten", "endpoint": "x"}]}
    await kubectl(routes.merge, {"data": {"sentiment": json.dumps(bad)}})
    _, doc = await gw.until(lambda d: "invalid" in d["models"][0])
    assert "weight must be an integer" in doc["models"][0]["invalid"]
    assert await gw.weights("sentiment") == {"stable": 9, "canary": 1}
    assert await gw.metric("modelroll_gateway_routes_invalid_total") == 1
    assert gw.proc.popen.poll() is None
    assert "Rejected the routes of model sentiment (it kept its last good route)" in gw.proc.log()

    await kubectl(routes.merge, {"data": {"sentiment": "{not json"}})
    await gw.until(lambda d: "not JSON" in d["models"][0].get("invalid", ""))
    assert await gw.weights("sentiment") == {"stable": 9, "canary": 1}

    await kubectl(routes.set_route, model_route("sentiment", stable=(1, "http://s:8000")))
    _, doc = await gw.until(lambda d: "invalid" not in d["models"][0])
    assert await gw.weights("sentiment") == {"stable": 1}


async def test_a_missing_configmap_means_no_routes_while_the_watch_goes_on(
    routes: RoutesConfigMap, start_gateway: StartGateway
) -> None:
    gw = start_gateway()  # ready although the ConfigMap does not exist yet
    assert (await gw.routes())["models"] == []
    assert await gw.infer("sentiment") == (404, "")

    await kubectl(routes.create, {})
    await kubectl(routes.set_route, model_route("sentiment", v2=(3, "http://s:8000")))
    _, doc = await gw.until(lambda d: bool(d["models"]))
    assert doc["models"][0]["versions"][0]["weight"] == 3

    await kubectl(routes.merge, configmap_delete_patch("sentiment"))
    await gw.until(lambda d: d["models"] == [])


async def test_a_deleted_configmap_leaves_the_last_routes_in_force(
    aiohttp_server: AiohttpServer, routes: RoutesConfigMap, start_gateway: StartGateway
) -> None:
    """As Envoy keeps its last good configuration: a deleted ConfigMap is not "no routes"."""
    sidecar = await stand_in_sidecar(aiohttp_server)
    routes.create()
    routes.set_route(model_route("sentiment", stable=(1, sidecar)))
    gw = start_gateway()
    await gw.until(lambda d: bool(d["models"]))

    await kubectl(routes.delete)
    _, doc = await gw.until(lambda d: "deleted" in d.get("invalid", ""))
    assert "stay in force until it exists again" in doc["invalid"]
    assert await gw.weights("sentiment") == {"stable": 1}
    assert await gw.infer("sentiment") == (200, "stable")
    assert "Rejected the routes document from configmap" in gw.proc.log()
    assert "it was deleted" in gw.proc.log()

    await kubectl(routes.create, {})
    await kubectl(routes.set_route, model_route("sentiment", v2=(3, sidecar)))
    _, doc = await gw.until(lambda d: [v["name"] for v in d["models"][0]["versions"]] == ["v2"])
    assert "invalid" not in doc
    assert await gw.infer("sentiment") == (200, "v2")


async def stand_in_sidecar(aiohttp_server: AiohttpServer) -> str:
    """A server that answers the sidecar's POST /v1/infer: its base URL."""

    async def infer(request: web.Request) -> web.Response:
        return web.json_response({"output": (await request.json())["payload"]})

    app = web.Application()
    app.router.add_post("/v1/infer", infer)
    server = await aiohttp_server(app, host="127.0.0.1")
    return str(server.make_url("")).rstrip("/")


async def test_the_watch_resumes_after_the_api_server_restarts(
    cluster: Cluster, routes: RoutesConfigMap, start_gateway: StartGateway
) -> None:
    if not cluster.is_local:
        pytest.skip("restarting the API server needs the local control plane")
    routes.create()
    routes.set_route(model_route("sentiment", stable=(1, "http://s:8000")))
    gw = start_gateway()
    await gw.until(lambda d: bool(d["models"]))

    # On this thread: the restarted API server dies with the thread that started it.
    cluster.restart_apiserver()
    await kubectl(routes.set_route, model_route("sentiment", stable=(4, "http://s:8000")))
    await gw.until(lambda d: d["models"][0]["versions"][0]["weight"] == 4, within=30.0)
    assert "Lost the ConfigMap" in gw.proc.log()  # it noticed, retried, and came back


async def test_an_expired_resource_version_leads_to_a_fresh_list(
    cluster: Cluster, namespace: str, routes: RoutesConfigMap
) -> None:
    """410 Gone: the watcher lists again and follows from there (in-process, same API server)."""
    routes.create()
    routes.set_route(model_route("sentiment", stable=(5, "http://s:8000")))
    metrics = GatewayMetrics(CollectorRegistry())
    table = RouteTable(metrics)
    client, _ = connect(cluster.kubeconfig)
    watcher = ConfigMapWatcher(k8s.CoreV1Api(client), table, namespace, CONFIGMAP_NAME)
    task = asyncio.create_task(watcher.run(resume_from="1"))  # long compacted away
    try:
        await eventually(lambda: "sentiment" in table.models, "the relist")
        assert table.models["sentiment"].route.versions[0].weight == 5
        expired = metrics.registry.get_sample_value(
            "modelroll_gateway_watch_restarts_total", {"reason": "expired"}
        )
        assert expired == 1
        await kubectl(routes.set_route, model_route("sentiment", stable=(6, "http://s:8000")))
        await eventually(
            lambda: table.models["sentiment"].route.versions[0].weight == 6,
            "the watch following after the relist",
        )
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        client.close()  # type: ignore[no-untyped-call]


def reader_token(cluster: Cluster, namespace: str) -> str:
    """The token of a service account allowed get/list/watch on modelroll-routes alone."""
    rbac = f"""
apiVersion: v1
kind: ServiceAccount
metadata: {{name: gateway}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {{name: gateway}}
rules:
  - apiGroups: [""]
    resources: [configmaps]
    resourceNames: [{CONFIGMAP_NAME}]
    verbs: [get, list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: gateway}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: gateway}}
subjects: [{{kind: ServiceAccount, name: gateway, namespace: {namespace}}}]
"""
    cluster.apply(rbac, namespace=namespace)
    return cluster.kubectl("create", "token", "gateway", namespace=namespace).stdout.strip()


async def follows_changes(
    routes: RoutesConfigMap, start_gateway: StartGateway, kubeconfig: Path
) -> GatewayProcess:
    """A gateway with ``kubeconfig`` reads the routes and then follows a change within a second."""
    routes.create()
    routes.set_route(model_route("sentiment", stable=(2, "http://s:8000")))
    gw = start_gateway(kubeconfig=kubeconfig)
    await gw.until(lambda d: bool(d["models"]))
    await kubectl(routes.set_route, model_route("sentiment", stable=(3, "http://s:8000")))
    took, _ = await gw.until(lambda d: d["models"][0]["versions"][0]["weight"] == 3)
    assert took < PICKUP_BOUND
    assert "Lost the ConfigMap" not in gw.proc.log()
    return gw


@pytest.mark.parametrize("login", ["token", "exec plugin"])
async def test_read_access_to_its_own_configmap_is_enough(
    login: str,
    cluster: Cluster,
    namespace: str,
    routes: RoutesConfigMap,
    start_gateway: StartGateway,
    tmp_path: Path,
) -> None:
    """A service account allowed get/list/watch on modelroll-routes alone; its token is in the
    kubeconfig, or printed by an exec credential plugin as on EKS, GKE or AKS."""
    token = reader_token(cluster, namespace)
    kubeconfig = tmp_path / "gateway.kubeconfig"
    if login == "exec plugin":
        exec_kubeconfig(cluster, kubeconfig, credential_plugin(tmp_path / "get-token", token))
    else:
        ca = cluster.kubectl_json("config", "view", "--raw", "--minify")["clusters"][0]["cluster"]
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "current-context": "gw",
            "contexts": [{"name": "gw", "context": {"cluster": "c", "user": "gateway"}}],
            "clusters": [{"name": "c", "cluster": ca}],
            "users": [{"name": "gateway", "user": {"token": token}}],
        }
        kubeconfig.write_text(json.dumps(config))
    await follows_changes(routes, start_gateway, kubeconfig)


async def test_weight_changes_under_load_fail_no_request(
    spawn: Spawn, routes: RoutesConfigMap, start_gateway: StartGateway
) -> None:
    """Real sidecars and demo models behind the gateway; the operator's patches land meanwhile."""
    endpoints = {}
    for version in ("stable", "canary"):
        model_port, sidecar_port = free_port(), free_port()
        spawn(
            "modelroll-demo-model",
            f"--port={model_port}",
            "--fixed-ms=2",
            ready=f"http://127.0.0.1:{model_port}/readyz",
        )
        spawn(
            "modelroll-sidecar",
            f"--port={sidecar_port}",
            f"--upstream=http://127.0.0.1:{model_port}",
            "--model=sentiment",
            f"--version={version}",
            "--max-wait-ms=2",
            ready=f"http://127.0.0.1:{sidecar_port}/readyz",
        )
        endpoints[version] = f"http://127.0.0.1:{sidecar_port}"
    plans = [(9, 1), (1, 1), (0, 1), (1, 0), (5, 5)]

    def route_for(stable: int, canary: int) -> ModelRoute:
        return model_route(
            "sentiment", stable=(stable, endpoints["stable"]), canary=(canary, endpoints["canary"])
        )

    routes.create()
    routes.set_route(route_for(*plans[0]))
    gw = start_gateway()
    await gw.until(lambda d: bool(d["models"]))

    codes: Counter[int] = Counter()
    stop = asyncio.Event()

    async def client() -> None:
        for _ in range(5000):  # bounded; the weight changes end the run far sooner
            if stop.is_set():
                return
            status, _ = await gw.infer("sentiment")
            codes[status] += 1

    clients = [asyncio.create_task(client()) for _ in range(16)]
    for plan in plans[1:] * 2:
        await asyncio.sleep(0.2)
        await kubectl(routes.set_route, route_for(*plan))
    await gw.until(lambda d: {v["weight"] for v in d["models"][0]["versions"]} == {5})
    await asyncio.sleep(0.2)
    stop.set()
    await asyncio.gather(*clients)

    assert sum(codes.values()) > 100
    assert codes == {200: sum(codes.values())}, f"failed requests: {codes}"
    versions = {v["name"]: v for v in (await gw.routes())["models"][0]["versions"]}
    assert versions["stable"]["requests"] > 0
    assert versions["canary"]["requests"] > 0
