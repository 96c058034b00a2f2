"""The chart as a user meets it: lint, rendering, values and their schema, security, RBAC, CRD.

Everything here runs helm (built by `make helm`) without a cluster; tests/chart/test_cluster.py
sends the rendered objects to a real API server.
"""

from __future__ import annotations

import json
import re
import shlex
import urllib.parse
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry

from modelroll_gateway import cli as gateway_cli
from modelroll_operator import cli as operator_cli
from modelroll_operator.analysis.exporter import PHASES, AnalysisMetrics
from modelroll_operator.settings import DEFAULT_SIDECAR_IMAGE, OperatorConfig
from modelroll_operator.spec import parse_spec
from modelroll_operator.workload import sidecar_args
from modelroll_sidecar.metrics import CLOSE_REASONS, STREAM_OUTCOMES, LLMMetrics, SidecarMetrics
from tests.chart.conftest import (
    CHART,
    EXAMPLES,
    FULL_VALUES,
    REPO,
    Helm,
    Manifest,
    by_kind,
    commented_manifest,
    containers,
    one,
)
from tests.chart.test_dockerfiles import Dockerfile

MONITORING_ON = (
    "--set",
    "monitoring.podMonitor.enabled=true,monitoring.serviceMonitor.enabled=true,"
    "monitoring.operatorPodMonitor.enabled=true,"
    "monitoring.prometheusRule.enabled=true,monitoring.dashboard.enabled=true",
)


def chart_meta() -> dict[str, Any]:
    meta: dict[str, Any] = yaml.safe_load((CHART / "Chart.yaml").read_text())
    return meta


# --- lint and render ---------------------------------------------------------------------------


@pytest.mark.parametrize("values", [(), (FULL_VALUES,)], ids=["default", "full"])
def test_helm_lint_strict_passes(helm: Helm, values: tuple[Path, ...]) -> None:
    args = ["lint", "--strict", str(CHART)]
    for path in values:
        args += ["--values", str(path)]
    result = helm.run(*args)
    assert "1 chart(s) linted, 0 chart(s) failed" in result.stdout
    assert "[ERROR]" not in result.stdout, result.stdout
    assert "[WARNING]" not in result.stdout, result.stdout


def test_chart_yaml_is_v2_with_kube_version() -> None:
    meta = chart_meta()
    assert meta["apiVersion"] == "v2"
    assert meta["kubeVersion"].startswith(">=")
    assert meta["type"] == "application"


def test_default_install_is_operator_and_gateway_without_monitoring(helm: Helm) -> None:
    docs = helm.template()
    kinds = sorted({d["kind"] for d in docs})
    assert kinds == [
        "ClusterRole",
        "ClusterRoleBinding",
        "Deployment",
        "NetworkPolicy",
        "Role",
        "RoleBinding",
        "Service",
        "ServiceAccount",
    ]
    assert [d["metadata"]["name"] for d in by_kind(docs, "Deployment")] == [
        "modelroll-gateway",
        "modelroll-operator",
    ]


def test_full_values_render_every_optional_object(helm: Helm) -> None:
    docs = helm.template(values=[FULL_VALUES])
    for kind in ("PodMonitor", "ServiceMonitor", "PrometheusRule", "ConfigMap"):
        assert by_kind(docs, kind), f"no {kind} rendered with {FULL_VALUES.name}"
    # The operator watches two namespaces: a Role and RoleBinding in each, no ClusterRole for them.
    roles = {(r["metadata"]["namespace"], r["metadata"]["name"]) for r in by_kind(docs, "Role")}
    assert ("models", "modelroll-operator") in roles
    assert ("models-staging", "modelroll-operator") in roles
    cluster_roles = [r["metadata"]["name"] for r in by_kind(docs, "ClusterRole")]
    assert cluster_roles == ["modelroll-operator-cluster"]
    # Cluster-wide, only what lets it finish deleting a watched namespace once the Role is gone.
    deletion = rules_of(one(docs, "ClusterRole", "-operator-cluster")) - rules_of(
        one(helm.template(), "ClusterRole", "-operator-cluster")
    )
    assert deletion == {
        ("modelroll.io", "modelversions", "list"),
        ("modelroll.io", "modelversions", "watch"),
        ("modelroll.io", "modelversions", "patch"),
        *(("", "configmaps", verb) for verb in ("get", "list", "watch", "patch")),
        ("apps", "deployments", "list"),
        ("apps", "deployments", "watch"),
        ("", "services", "list"),
        ("", "services", "watch"),
        # peering is on in the full values: the replicas' KopfPeering there goes too
        *(("kopf.dev", "kopfpeerings", verb) for verb in ("get", "list", "watch", "patch")),
    }
    configmaps = [
        r
        for r in one(docs, "ClusterRole", "-operator-cluster")["rules"]
        if "configmaps" in r["resources"]
    ]
    assert [r.get("resourceNames") for r in configmaps] == [["modelroll-routes"]]


def test_the_crd_is_shipped_in_crds_and_not_templated(helm: Helm) -> None:
    assert not by_kind(helm.template(), "CustomResourceDefinition")
    crds = by_kind(helm.template("--include-crds"), "CustomResourceDefinition")
    assert sorted(c["metadata"]["name"] for c in crds) == [
        "clusterkopfpeerings.kopf.dev",
        "kopfpeerings.kopf.dev",
        "modelversions.modelroll.io",
    ]


# --- values and schema -------------------------------------------------------------------------


KEY_LINE = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z0-9_]+):")


def undocumented_keys(text: str) -> list[str]:
    """Keys of values.yaml that have no `# --` comment, on themselves or on all their children.

    helm-docs reads a `# --` comment block right above a key; a mapping documented as a whole
    (e.g. `podSecurityContext`) needs nothing more on its children.
    """
    nodes: list[tuple[int, str, bool]] = []  # (indent, dotted path, documented)
    stack: list[tuple[int, str]] = []
    comment: list[str] = []
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("#"):
            comment.append(stripped)
            continue
        match = KEY_LINE.match(line)
        if not match:
            comment = []
            continue
        indent = len(match["indent"])
        while stack and stack[-1][0] >= indent:
            stack.pop()
        path = ".".join([p for _, p in stack] + [match["key"]])
        documented = any(c.startswith("# --") for c in comment)
        nodes.append((indent, path, documented))
        stack.append((indent, match["key"]))
        comment = []

    def ok(i: int) -> bool:
        _indent, path, documented = nodes[i]
        if documented:
            return True
        children = [
            j
            for j in range(i + 1, len(nodes))
            if nodes[j][1].startswith(path + ".") and nodes[j][1].count(".") == path.count(".") + 1
        ]
        return bool(children) and all(ok(j) for j in children)

    top = [i for i, (indent, _, _) in enumerate(nodes) if indent == 0]
    missing: list[str] = []

    def collect(i: int) -> None:
        if ok(i):
            return
        _, path, _ = nodes[i]
        children = [
            j
            for j in range(i + 1, len(nodes))
            if nodes[j][1].startswith(path + ".") and nodes[j][1].count(".") == path.count(".") + 1
        ]
        if not children:
            missing.append(path)
        for j in children:
            collect(j)

    for i in top:
        collect(i)
    return missing


def test_every_value_is_documented_with_a_helm_docs_comment() -> None:
    text = (CHART / "values.yaml").read_text()
    assert undocumented_keys(text) == []
    # The checker itself catches a key without a comment.
    assert undocumented_keys("a:\n  # -- fine\n  b: 1\n  c: 2\n") == ["a.c"]


def schema_gaps(values: Any, schema: dict[str, Any], path: str = "") -> list[str]:
    """Keys present in values.yaml that the schema does not list (they would be rejected)."""
    gaps: list[str] = []
    if isinstance(values, dict) and "properties" in schema:
        for key, value in values.items():
            sub = schema["properties"].get(key)
            if sub is None:
                gaps.append(f"{path}{key}")
            else:
                gaps += schema_gaps(value, sub, f"{path}{key}.")
    return gaps


def test_schema_lists_every_default_value_and_closes_every_mapping() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    schema = json.loads((CHART / "values.schema.json").read_text())
    assert schema_gaps(values, schema) == []

    def open_objects(node: dict[str, Any], path: str = "") -> list[str]:
        found = []
        if "properties" in node and node.get("additionalProperties") is not False:
            found.append(path or "(top)")
        for key, sub in node.get("properties", {}).items():
            found += open_objects(sub, f"{path}{key}.")
        return found

    assert open_objects(schema) == []


@pytest.mark.parametrize(
    ("setting", "key"),
    [
        ("replica=2", "replica"),
        ("operator.replica=2", "replica"),
        ("gateway.service.nodePort=30080", "nodePort"),
        ("monitoring.podMonitor.enable=true", "enable"),
        ("monitoring.prometheusRule.errorRatio.treshold=0.1", "treshold"),
        ("monitoring.prometheusRule.timeToFirstToken.p99Seconds=1", "p99Seconds"),
    ],
)
def test_schema_rejects_unknown_keys(helm: Helm, setting: str, key: str) -> None:
    result = helm.run("template", "modelroll", str(CHART), "--set", setting, check=False)
    assert result.returncode != 0, f"--set {setting} was accepted"
    assert "values don't meet the specifications of the schema" in result.stderr
    assert key in result.stderr, result.stderr


@pytest.mark.parametrize(
    "setting",
    [
        "gateway.port=http",
        "operator.image.pullPolicy=Sometimes",
        "monitoring.podMonitor.interval=5",
    ],
)
def test_schema_rejects_wrong_types_and_values(helm: Helm, setting: str) -> None:
    result = helm.run("template", "modelroll", str(CHART), "--set", setting, check=False)
    assert result.returncode != 0, f"--set {setting} was accepted"
    assert "values don't meet the specifications of the schema" in result.stderr


# --- pods: security, resources, images ---------------------------------------------------------


@pytest.mark.parametrize("values", [(), (FULL_VALUES,)], ids=["default", "full"])
def test_containers_run_non_root_with_read_only_root_and_a_writable_tmp(
    helm: Helm, values: tuple[Path, ...]
) -> None:
    rendered = list(containers(helm.template(values=values)))
    assert len(rendered) == 2
    for name, pod, container in rendered:
        assert pod["securityContext"]["runAsNonRoot"] is True, name
        assert pod["securityContext"]["runAsUser"] != 0, name
        security = container["securityContext"]
        assert security["readOnlyRootFilesystem"] is True, name
        assert security["allowPrivilegeEscalation"] is False, name
        assert security["capabilities"]["drop"] == ["ALL"], name
        mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
        volumes = {v["name"]: v for v in pod["volumes"]}
        assert "emptyDir" in volumes[mounts["/tmp"]], name


def test_resources_are_unset_by_default_and_passed_through_when_set(helm: Helm) -> None:
    for name, _, container in containers(helm.template()):
        assert "resources" not in container, name
    full = {n: c for n, _, c in containers(helm.template(values=[FULL_VALUES]))}
    assert full["modelroll-operator"]["resources"]["limits"] == {"memory": "256Mi"}


def test_images_default_to_the_app_version(helm: Helm) -> None:
    app_version = chart_meta()["appVersion"]
    images = {n: c["image"] for n, _, c in containers(helm.template())}
    assert images == {
        "modelroll-gateway": f"ghcr.io/modelroll/modelroll-gateway:{app_version}",
        "modelroll-operator": f"ghcr.io/modelroll/modelroll-operator:{app_version}",
    }


@pytest.mark.parametrize(
    ("directory", "command"),
    [("managed", "modelroll-demo-model"), ("llm", "modelroll-demo-llm")],
)
def test_the_managed_examples_use_the_demo_image_make_images_builds(
    directory: str, command: str
) -> None:
    """examples/managed/ runs the demo model, examples/llm/ the demo LLM, from the demo image:
    the name and tag `make images` gives it (hack/images/build.sh: the registry prefix, the demo
    folder's image, the chart's appVersion), never pulled on a node that has it, and the stable's
    file says how to get it."""
    build_sh = (REPO / "hack" / "images" / "build.sh").read_text()
    assert "registry=${IMAGE_REGISTRY:-ghcr.io/modelroll}" in build_sh
    assert " demo:demo;" in build_sh
    built = "ghcr.io/modelroll/modelroll-demo:" + chart_meta()["appVersion"]
    paths = sorted((EXAMPLES / directory).glob("*.yaml"))
    assert len(paths) == 2, paths
    for path in paths:
        server = yaml.safe_load(path.read_text())["spec"]["server"]
        assert (server["image"], server["imagePullPolicy"]) == (built, "IfNotPresent"), path
        assert server["command"] == [command], path
    [stable] = [p.read_text() for p in paths if p.name.endswith("-stable.yaml")]
    for how in ("`make images` builds", "kind load docker-image", "docker push"):
        assert how in stable, how


def demo_llm_args(doc: Manifest) -> dict[str, str]:
    args: list[str] = doc["spec"]["server"]["args"]
    return dict(a.removeprefix("--").split("=", 1) for a in args)


def test_the_llm_examples_are_a_chat_pair_with_the_canary_slower_to_its_first_token() -> None:
    """examples/llm/: two OpenAI versions of one model, 90/10, each engine serving the model's
    name (clients name it in the body), the canary's iterations slower; the sidecar's cap set."""
    docs = {
        path.stem: yaml.safe_load(path.read_text())
        for path in sorted((EXAMPLES / "llm").glob("*.yaml"))
    }
    assert set(docs) == {"chat-stable", "chat-canary"}
    for name, doc in docs.items():
        spec = doc["spec"]
        assert doc["metadata"]["name"] == name
        assert (spec["model"], spec["protocol"]) == ("chat", "OpenAI"), name
        assert spec["sidecar"]["maxInFlight"] >= 1, name
        args = demo_llm_args(doc)
        assert args["served-model-name"] == spec["model"], name
        assert int(args["port"]) == spec["server"]["port"], name
    assert {n: d["spec"]["weight"] for n, d in docs.items()} == {
        "chat-stable": 90,
        "chat-canary": 10,
    }
    stable, canary = demo_llm_args(docs["chat-stable"]), demo_llm_args(docs["chat-canary"])
    assert float(canary["step-ms"]) > float(stable["step-ms"])
    assert {k: v for k, v in canary.items() if k != "step-ms"} == {
        k: v for k, v in stable.items() if k != "step-ms"
    }


def llama_args(doc: Manifest) -> dict[str, str | None]:
    """llama-server's flags as it parses them: `--flag value` or a lone `--flag`."""
    args: list[str] = doc["spec"]["server"]["args"]
    flags: dict[str, str | None] = {}
    previous = ""
    for arg in args:
        if arg.startswith("-"):
            flags[arg] = None
            previous = arg
        else:
            assert flags.get(previous, "") is None, f"{arg!r} follows no flag"
            flags[previous] = arg
    return flags


def test_the_chat_examples_run_the_llama_image_make_images_builds() -> None:
    """examples/chat/: llama-server from the image `make images` tags (hack/images/build.sh: the
    registry prefix, the chart's appVersion), never pulled on a node that has it; its model the
    file that image holds, served as spec.model, on the address and port the sidecar the operator
    injects calls; every flag as llama-server reads it (it refuses `--flag=value`); the same
    context per slot in both versions, whatever their slots."""
    tag = chart_meta()["appVersion"]
    build_sh = (REPO / "hack" / "images" / "build.sh").read_text()
    assert "registry=${IMAGE_REGISTRY:-ghcr.io/modelroll}" in build_sh
    assert "image=$registry/modelroll-llama:$tag" in build_sh
    dockerfile = Dockerfile.parse(REPO / "hack" / "images" / "llama.Dockerfile")
    for source in dockerfile.context_sources():  # build.sh puts them in the build's context
        assert f'"$llama_context/{source}"' in build_sh, source
    held = {shlex.split(c)[-1] for c in dockerfile.all("COPY")}
    paths = sorted((EXAMPLES / "chat").glob("*.yaml"))
    docs = {path.stem: yaml.safe_load(path.read_text()) for path in paths}
    assert set(docs) == {"smollm2-serial", "smollm2-continuous"}
    for name, doc in docs.items():
        spec = doc["spec"]
        server = spec["server"]
        assert doc["metadata"]["name"] == name
        assert server["image"] == f"ghcr.io/modelroll/modelroll-llama:{tag}", name
        assert server["imagePullPolicy"] == "IfNotPresent", name
        assert not [a for a in server["args"] if a.startswith("-") and "=" in a], name
        args = llama_args(doc)
        assert args["--model"] in held, name
        assert args["--alias"] == spec["model"], name
        sidecar = sidecar_args(name, parse_spec(spec), OperatorConfig())
        assert "--protocol=openai" in sidecar, name
        [upstream] = [
            urllib.parse.urlsplit(a.removeprefix("--upstream=")) for a in sidecar if "upstream" in a
        ]
        assert upstream.port == int(str(args["--port"])) == server["port"], name
        assert args["--host"] in {upstream.hostname, "0.0.0.0"}, name
    # --ctx-size is shared by the --parallel slots: what one conversation gets is the quotient.
    per_slot = {
        name: int(str(args["--ctx-size"])) // int(str(args["--parallel"]))
        for name, args in ((n, llama_args(d)) for n, d in docs.items())
    }
    assert len(set(per_slot.values())) == 1, per_slot
    assert min(per_slot.values()) >= 1024, per_slot
    text = (EXAMPLES / "chat" / "smollm2-serial.yaml").read_text()
    for how in ("`make images` builds", "kind load docker-image", "docker push"):
        assert how in text, how


def comment_lines(path: Path) -> list[str]:
    return [line[1:].strip() for line in path.read_text().splitlines() if line.startswith("#")]


def test_the_llm_examples_comments_show_how_to_call_and_roll_back() -> None:
    """A streamed chat completion through the gateway naming the model `chat`, and a rollback
    that is a weight patch."""
    stable = "\n".join(comment_lines(EXAMPLES / "llm" / "chat-stable.yaml"))
    call = stable[stable.index("curl ") :]
    call = call[: call.index("}'") + 2]
    assert "/v1/chat/completions" in call
    body = json.loads(call[call.index("-d '") + 4 : -1].replace("\\\n", " "))
    assert body["model"] == "chat"
    assert body["stream"] is True
    assert body["messages"][0]["role"] == "user"
    assert "port-forward service/modelroll-gateway" in stable
    canary = comment_lines(EXAMPLES / "llm" / "chat-canary.yaml")
    patches = [line for line in canary if line.startswith("kubectl -n models patch mv ")]
    assert len(patches) == 1
    assert patches[0].split()[5] == "chat-canary"
    assert json.loads(patches[0].split("-p ", 1)[1].strip("'")) == {"spec": {"weight": 0}}
    assert "kubectl modelroll -n models rollback chat-canary" in canary


def test_the_llm_examples_show_the_same_version_with_vllm() -> None:
    """The comment's vLLM version is the applied one with only spec.server changed: vLLM's image,
    the model's name served, a GPU, a startup probe on the engine's port; not a second document."""
    path = EXAMPLES / "llm" / "chat-stable.yaml"
    assert len([d for d in yaml.safe_load_all(path.read_text()) if d]) == 1
    applied = yaml.safe_load(path.read_text())
    vllm = commented_manifest(path)
    assert {k: v for k, v in vllm.items() if k != "spec"} == {
        k: v for k, v in applied.items() if k != "spec"
    }
    assert {k: v for k, v in vllm["spec"].items() if k != "server"} == {
        k: v for k, v in applied["spec"].items() if k != "server"
    }
    server = vllm["spec"]["server"]
    assert server["image"].startswith("vllm/vllm-openai:v"), "pin a vLLM release"
    assert f"--served-model-name={vllm['spec']['model']}" in server["args"]
    assert f"--port={server['port']}" in server["args"]
    assert server["port"] != 8000, "the sidecar's port"
    assert server["resources"]["limits"]["nvidia.com/gpu"] == 1
    probe = server["startupProbe"]
    assert probe["httpGet"] == {"path": "/health", "port": server["port"]}
    assert probe["periodSeconds"] * probe["failureThreshold"] >= 600, "weights load for minutes"


def test_the_canary_examples_promote_comment_gives_it_all_the_traffic() -> None:
    """Both weights are patched, the canary's first: patching the canary to 90 alone, with the
    stable still at 90, would be a 50/50 split."""
    text = (EXAMPLES / "managed" / "sentiment-canary.yaml").read_text()
    comment = [line[1:].strip() for line in text.splitlines() if line.startswith("#")]
    assert "kubectl modelroll promote sentiment-canary" in comment
    patches = {
        line.split()[3]: json.loads(line.split("-p ", 1)[1].strip("'"))["spec"]["weight"]
        for line in comment
        if line.startswith("kubectl patch mv ")
    }
    assert patches == {"sentiment-canary": 100, "sentiment-stable": 0}


def operator_args(docs: list[Manifest]) -> list[str]:
    container = one(docs, "Deployment", "-operator")["spec"]["template"]["spec"]["containers"][0]
    args: list[str] = container["args"]
    return args


def test_operator_gets_the_sidecar_image_from_values(helm: Helm) -> None:
    app_version = chart_meta()["appVersion"]
    default = operator_args(helm.template())
    assert f"--sidecar-image=ghcr.io/modelroll/modelroll-sidecar:{app_version}" in default
    retagged = operator_args(
        helm.template("--set", "sidecar.image.repository=reg.local/sc,sidecar.image.tag=1.2.3")
    )
    assert "--sidecar-image=reg.local/sc:1.2.3" in retagged
    explicit = operator_args(helm.template("--set", "operator.sidecarImage=reg.local/other:9"))
    assert "--sidecar-image=reg.local/other:9" in explicit


def test_operator_watches_all_namespaces_or_the_listed_ones(helm: Helm) -> None:
    assert "--all-namespaces" in operator_args(helm.template())
    listed = operator_args(helm.template("--set", "operator.watchNamespaces={a,b}"))
    assert "--namespace=a" in listed
    assert "--namespace=b" in listed
    assert "--all-namespaces" not in listed


def test_gateway_follows_the_routes_configmap_of_its_own_namespace(helm: Helm) -> None:
    deployment = one(helm.template(), "Deployment", "-gateway")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert "--namespace=$(POD_NAMESPACE)" in container["args"]
    assert "--configmap=modelroll-routes" in container["args"]
    env = {e["name"]: e for e in container["env"]}
    assert env["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
    probes = {p: container[p]["httpGet"]["path"] for p in ("readinessProbe", "livenessProbe")}
    assert probes == {"readinessProbe": "/readyz", "livenessProbe": "/livez"}


def test_selectors_use_only_stable_labels(helm: Helm) -> None:
    docs = helm.template(values=[FULL_VALUES])
    selectors = [d["spec"]["selector"]["matchLabels"] for d in by_kind(docs, "Deployment")]
    selectors += [d["spec"]["selector"] for d in by_kind(docs, "Service")]
    for selector in selectors:
        assert set(selector) == {
            "app.kubernetes.io/name",
            "app.kubernetes.io/instance",
            "app.kubernetes.io/component",
        }
    for deployment in by_kind(docs, "Deployment"):
        pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
        selector = deployment["spec"]["selector"]["matchLabels"]
        assert selector.items() <= pod_labels.items()


# --- RBAC --------------------------------------------------------------------------------------


def rules_of(doc: Manifest) -> set[tuple[str, str, str]]:
    """(apiGroup, resource, verb) triples a Role or ClusterRole grants."""
    return {
        (group, resource, verb)
        for rule in doc["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def test_gateway_may_only_read_its_routes_configmap(helm: Helm) -> None:
    role = one(helm.template(), "Role", "-gateway")
    assert rules_of(role) == {("", "configmaps", v) for v in ("get", "list", "watch")}
    assert role["rules"][0]["resourceNames"] == ["modelroll-routes"]


def test_operator_rbac_covers_exactly_what_it_uses(helm: Helm) -> None:
    docs = helm.template()
    namespaced = rules_of(one(docs, "ClusterRole", "-operator"))
    resources = {(g, r) for g, r, _ in namespaced}
    assert resources == {
        ("modelroll.io", "modelversions"),
        ("modelroll.io", "modelversions/status"),
        ("modelroll.io", "modelversions/finalizers"),
        ("", "configmaps"),
        ("apps", "deployments"),
        ("", "services"),
        ("", "events"),
        ("", "pods"),
    }
    # Canary analyses list the gateway pods to read their /metrics: list, nothing else.
    assert {v for _, r, v in namespaced if r == "pods"} == {"list"}
    # It patches keys; it deletes only the routes ConfigMap, to replace one made immutable.
    deletable = [
        rule
        for rule in one(docs, "ClusterRole", "-operator")["rules"]
        if "configmaps" in rule["resources"] and "delete" in rule["verbs"]
    ]
    assert [r.get("resourceNames") for r in deletable] == [["modelroll-routes"]]
    assert deletable[0]["verbs"] == ["delete"]
    assert ("modelroll.io", "modelversions", "delete") not in namespaced
    assert not any(verb in ("*", "escalate", "bind", "impersonate") for _, _, verb in namespaced)
    kopf = rules_of(one(docs, "ClusterRole", "-operator-cluster"))
    assert kopf == {
        ("apiextensions.k8s.io", "customresourcedefinitions", "list"),
        ("apiextensions.k8s.io", "customresourcedefinitions", "watch"),
        ("", "namespaces", "list"),
        ("", "namespaces", "watch"),
    }


def test_peering_creates_the_peering_object_the_replicas_share(helm: Helm) -> None:
    standalone = helm.template()
    assert "--standalone" in operator_args(standalone)
    assert not by_kind(standalone, "ClusterKopfPeering")
    peering = helm.template("--set", "operator.peering=true,operator.replicas=2")
    assert "--peering=modelroll" in operator_args(peering)
    assert "--standalone" not in operator_args(peering)
    assert one(peering, "ClusterKopfPeering")["metadata"]["name"] == "modelroll"
    assert ("kopf.dev", "clusterkopfpeerings", "patch") in rules_of(
        one(peering, "ClusterRole", "-operator-cluster")
    )
    limited = helm.template("--set", "operator.peering=true,operator.watchNamespaces={a,b}")
    peerings = by_kind(limited, "KopfPeering")
    assert sorted(p["metadata"]["namespace"] for p in peerings) == ["a", "b"]
    assert not by_kind(limited, "ClusterKopfPeering")
    for role in by_kind(limited, "Role"):
        if role["metadata"]["name"].endswith("-operator"):
            assert ("kopf.dev", "kopfpeerings", "patch") in rules_of(role)


@pytest.mark.parametrize("replicas", ["2", "3"])
def test_more_than_one_operator_without_peering_is_refused_naming_the_fix(
    helm: Helm, replicas: str
) -> None:
    """Two standalone operators would both act on every ModelVersion at once."""
    for values in (
        f"operator.replicas={replicas}",
        f"operator.replicas={replicas},operator.peering=false",
    ):
        refused = helm.run("template", "modelroll", str(CHART), "--set", values, check=False)
        assert refused.returncode != 0, f"--set {values} was rendered"
        assert f"operator.replicas is {replicas}" in refused.stderr, refused.stderr
        assert "set operator.peering=true" in refused.stderr, refused.stderr
    peering = helm.template("--set", f"operator.replicas={replicas},operator.peering=true")
    assert one(peering, "Deployment", "-operator")["spec"]["replicas"] == int(replicas)
    # One replica (or none) needs no peering; nor does a chart that deploys no operator.
    for values in ("operator.replicas=1", "operator.replicas=0"):
        assert "--standalone" in operator_args(helm.template("--set", values))
    helm.template("--set", f"operator.replicas={replicas},operator.enabled=false")


# --- monitoring objects ------------------------------------------------------------------------


def test_monitoring_is_opt_in_and_labelled_for_kube_prometheus_stack(helm: Helm) -> None:
    docs = helm.template(*MONITORING_ON)
    monitors = [
        ("PodMonitor", "-sidecars"),
        ("PodMonitor", "-operator"),
        ("ServiceMonitor", ""),
        ("PrometheusRule", ""),
    ]
    for kind, suffix in monitors:
        labels = one(docs, kind, suffix)["metadata"]["labels"]
        assert labels["release"] == "kube-prometheus-stack", kind
    relabelled = helm.template(*MONITORING_ON, "--set", "monitoring.additionalLabels.release=prom")
    for monitor in by_kind(relabelled, "PodMonitor"):
        assert monitor["metadata"]["labels"]["release"] == "prom"


def test_podmonitor_selects_sidecars_by_the_modelroll_labels(helm: Helm) -> None:
    spec = one(helm.template(*MONITORING_ON), "PodMonitor", "-sidecars")["spec"]
    keys = {e["key"] for e in spec["selector"]["matchExpressions"]}
    assert keys == {"modelroll.io/model", "modelroll.io/version"}
    assert spec["selector"]["matchLabels"] == {"app.kubernetes.io/managed-by": "modelroll-operator"}
    assert spec["namespaceSelector"] == {"any": True}
    assert spec["podMetricsEndpoints"][0]["port"] == "http"
    assert spec["podMetricsEndpoints"][0]["path"] == "/metrics"
    limited = helm.template(*MONITORING_ON, "--set", "operator.watchNamespaces={models}")
    assert one(limited, "PodMonitor", "-sidecars")["spec"]["namespaceSelector"] == {
        "matchNames": ["models"]
    }


def test_the_operator_serves_metrics_on_a_port_its_podmonitor_scrapes(helm: Helm) -> None:
    docs = helm.template(*MONITORING_ON)
    deployment = one(docs, "Deployment", "-operator")
    pod = deployment["spec"]["template"]
    ports = {p["name"]: p["containerPort"] for p in pod["spec"]["containers"][0]["ports"]}
    assert ports == {"health": 8081, "metrics": 8082}
    assert "--metrics-port=8082" in operator_args(docs)
    monitor = one(docs, "PodMonitor", "-operator")
    assert monitor["metadata"]["namespace"] == "models"
    spec = monitor["spec"]
    assert spec["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    assert spec["selector"]["matchLabels"]["app.kubernetes.io/component"] == "operator"
    assert spec["namespaceSelector"] == {"matchNames": ["models"]}
    [endpoint] = spec["podMetricsEndpoints"]
    assert (endpoint["port"], endpoint["path"]) == ("metrics", "/metrics")
    # The series name the canary's namespace: it must not become exported_namespace.
    assert endpoint["honorLabels"] is True
    # Off by default, and with no operator to scrape; the port follows operator.metricsPort.
    assert not by_kind(helm.template(), "PodMonitor")
    no_operator = helm.template(*MONITORING_ON, "--set", "operator.enabled=false")
    assert [m["metadata"]["name"] for m in by_kind(no_operator, "PodMonitor")] == [
        "modelroll-sidecars"
    ]
    moved = helm.template(*MONITORING_ON, "--set", "operator.metricsPort=9102")
    assert "--metrics-port=9102" in operator_args(moved)
    container = one(moved, "Deployment", "-operator")["spec"]["template"]["spec"]["containers"][0]
    assert {"name": "metrics", "containerPort": 9102, "protocol": "TCP"} in container["ports"]


def test_servicemonitor_selects_the_gateway_service(helm: Helm) -> None:
    docs = helm.template(*MONITORING_ON)
    monitor = one(docs, "ServiceMonitor")["spec"]
    service = one(docs, "Service", "-gateway")
    assert monitor["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert monitor["endpoints"][0]["port"] in {p["name"] for p in service["spec"]["ports"]}


def test_dashboard_configmap_holds_the_dashboard_file_unchanged(helm: Helm) -> None:
    configmap = one(helm.template(*MONITORING_ON), "ConfigMap", "-dashboard")
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    shipped = (CHART / "dashboards" / "modelroll.json").read_text()
    assert configmap["data"]["modelroll.json"] == shipped.rstrip("\n")
    elsewhere = helm.template(*MONITORING_ON, "--set", "monitoring.dashboard.namespace=grafana")
    assert one(elsewhere, "ConfigMap", "-dashboard")["metadata"]["namespace"] == "grafana"


def test_alert_thresholds_come_from_values(helm: Helm) -> None:
    rule = one(helm.template(values=[FULL_VALUES]), "PrometheusRule")
    alerts = {r["alert"]: r for g in rule["spec"]["groups"] for r in g["rules"] if "alert" in r}
    assert set(alerts) == {
        "ModelrollVersionErrorRatioHigh",
        "ModelrollVersionLatencyHigh",
        "ModelrollVersionTimeToFirstTokenHigh",
        "ModelrollVersionQueueSaturated",
    }
    assert alerts["ModelrollVersionErrorRatioHigh"]["expr"].endswith("> 0.01")
    assert alerts["ModelrollVersionErrorRatioHigh"]["for"] == "2m"
    assert alerts["ModelrollVersionLatencyHigh"]["expr"].endswith("> 0.25")
    ttft = alerts["ModelrollVersionTimeToFirstTokenHigh"]
    assert ttft["expr"].endswith("> 0.5")
    assert (ttft["for"], ttft["labels"]["severity"]) == ("5m", "critical")
    assert "0.5s SLO" in ttft["annotations"]["description"]
    assert "> 500" in alerts["ModelrollVersionQueueSaturated"]["expr"]
    for alert in alerts.values():
        assert alert["labels"]["team"] == "ml-platform"
        assert "{{ $labels.version }}" in alert["annotations"]["summary"]
    records = [r["expr"] for g in rule["spec"]["groups"] for r in g["rules"] if "record" in r]
    assert all("[10m]" in expr for expr in records)
    assert any('code=~"5..|422|429"' in expr for expr in records)


def test_the_readme_lists_every_alert_with_its_values_and_defaults(helm: Helm) -> None:
    """The chart README's alert table: one row per alert the chart renders, each naming its
    values under monitoring.prometheusRule with their defaults."""
    rule = one(helm.template("--set", "monitoring.prometheusRule.enabled=true"), "PrometheusRule")
    alerts = [r["alert"] for g in rule["spec"]["groups"] for r in g["rules"] if "alert" in r]
    readme = (CHART / "README.md").read_text()
    rows = re.findall(r"^\| `(Modelroll\w+)` \|[^|]+\| (.+) \|$", readme, re.MULTILINE)
    assert [name for name, _ in rows] == alerts
    values = yaml.safe_load((CHART / "values.yaml").read_text())["monitoring"]["prometheusRule"]
    for name, cell in rows:
        group = ""
        for key, default in re.findall(r"`([\w.]+)` \(([^)]+)\)", cell):
            if not key.startswith("."):
                group, key = key.split(".")
            assert str(values[group][key.lstrip(".")]) == default, (name, group, key)
    assert f"`window` ({values['window']})" in readme


# --- the dashboard file ------------------------------------------------------------------------


def dashboard() -> dict[str, Any]:
    board: dict[str, Any] = json.loads((CHART / "dashboards" / "modelroll.json").read_text())
    return board


def dashboard_targets(board: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    return [
        (panel["title"], target) for panel in board["panels"] for target in panel.get("targets", [])
    ]


def test_dashboard_is_provisionable_with_a_fixed_uid() -> None:
    board = dashboard()
    assert board["uid"] == "modelroll-versions"
    assert "__inputs" not in board
    assert "__requires" not in board
    assert board.get("id") is None


def test_dashboard_variables_are_datasource_namespace_model_and_multi_version() -> None:
    variables = {v["name"]: v for v in dashboard()["templating"]["list"]}
    assert list(variables) == ["datasource", "namespace", "model", "version"]
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    assert variables["version"]["multi"] is True
    assert variables["version"]["includeAll"] is True
    for name in ("namespace", "model", "version"):
        assert variables[name]["datasource"]["uid"] == "${datasource}"


def test_every_dashboard_query_keeps_versions_apart_and_uses_rate_interval() -> None:
    targets = dashboard_targets(dashboard())
    assert len(targets) >= 12
    for title, target in targets:
        expr = target["expr"]
        assert target["datasource"]["uid"] == "${datasource}", title
        assert re.search(r"by \((version\b[^)]*)\)", expr), f"{title}: not split by version"
        ranges = re.findall(r"\[([^\]]+)\]", expr)
        assert all(r == "$__rate_interval" for r in ranges), f"{title}: fixed range {ranges}"
        assert 'version=~"$version"' in expr, f"{title}: ignores the version variable"


def test_dashboard_covers_the_per_version_panels() -> None:
    board = dashboard()
    exprs = "\n".join(t["expr"] for _, t in dashboard_targets(board))
    for metric in (
        "modelroll_requests_total",
        "modelroll_request_duration_seconds_bucket",
        "modelroll_queue_wait_seconds_bucket",
        "modelroll_batch_size_bucket",
        "modelroll_batch_size_sum",
        "modelroll_batches_total",
        "modelroll_batch_tokens_total",
        "modelroll_queue_depth",
        "modelroll_rejected_total",
        "modelroll_client_timeouts_total",
        "modelroll_gateway_weight",
        "modelroll_gateway_requests_total",
        "modelroll_gateway_upstream_errors_total",
        "modelroll_gateway_upstream_connections",
        "modelroll_gateway_upstream_waiting",
        "modelroll_gateway_llm_time_to_first_token_seconds_bucket",
        "modelroll_gateway_llm_requests_total",
        *llm_metric_names(),
        *analysis_metric_names(),
    ):
        assert metric in exprs, f"no panel shows {metric}"
    for quantile in ("0.5", "0.95", "0.99"):
        assert f"histogram_quantile({quantile}," in exprs
    repeated = [p for p in board["panels"] if p.get("repeat") == "version"]
    assert repeated, "no panel is repeated per version"
    for panel in repeated:
        # Grafana lays a panel's copies side by side across the whole row.
        assert panel["repeatDirection"] == "h"
        assert panel["gridPos"]["w"] == 24, f"{panel['title']} shares its row"
    # No two panels overlap on the grid.
    cells: set[tuple[int, int]] = set()
    for panel in board["panels"]:
        pos = panel["gridPos"]
        for x in range(pos["x"], pos["x"] + pos["w"]):
            for y in range(pos["y"], pos["y"] + pos["h"]):
                assert (x, y) not in cells, f"{panel['title']} overlaps another panel"
                cells.add((x, y))


def llm_metric_names() -> list[str]:
    """Every series name of the sidecar's `--protocol openai` metrics that a panel queries (a
    histogram through its buckets), as Prometheus stores it."""
    registry = CollectorRegistry()
    LLMMetrics(SidecarMetrics("m", "v", registry), "m", "v")
    suffix = {"counter": "_total", "histogram": "_bucket", "gauge": ""}
    names = [
        m.name + suffix[m.type] for m in registry.collect() if m.name.startswith("modelroll_llm_")
    ]
    assert len(names) == 6, names
    return names


def test_the_llm_row_shows_chat_versions_apart_before_the_canary_analyses() -> None:
    board = dashboard()
    titles = [p["title"] for p in board["panels"]]
    row = titles.index("LLM versions")
    assert board["panels"][row]["type"] == "row"
    end = titles.index("Canary analyses")
    below = board["panels"][row + 1 : end]
    assert below, "the row is empty"
    assert all(p["type"] != "row" for p in below)
    for panel in below:
        assert panel["description"], panel["title"]
        for target in panel["targets"]:
            assert re.search(r"\bmodelroll_(gateway_)?llm_", target["expr"]), panel["title"]
            assert target["legendFormat"].startswith("{{version}}"), panel["title"]
    ttft = [p for p in below if p["title"].startswith("Time to first token")]
    assert len(ttft) == 1
    assert [t["expr"][: t["expr"].index(",")] for t in ttft[0]["targets"]] == [
        "histogram_quantile(0.5",
        "histogram_quantile(0.99",
    ]
    assert ttft[0]["fieldConfig"]["defaults"]["unit"] == "s"
    # The outcomes panel says what each outcome the sidecar counts means.
    [outcomes] = [p for p in below if p["title"] == "Generation outcomes by version"]
    for outcome in STREAM_OUTCOMES:
        assert re.search(rf"\b{outcome} \(", outcomes["description"]), outcome


def analysis_metric_names() -> list[str]:
    """Every series name of the operator's analysis metrics, as Prometheus stores it."""
    registry = CollectorRegistry()
    AnalysisMetrics(registry)
    return [m.name + ("_total" if m.type == "counter" else "") for m in registry.collect()]


def test_the_canary_analyses_row_shows_each_canary_apart() -> None:
    board = dashboard()
    titles = [p["title"] for p in board["panels"]]
    assert "Canary analyses" in titles
    row = titles.index("Canary analyses")
    assert board["panels"][row]["type"] == "row"
    below = board["panels"][row + 1 :]
    assert below, "the row is empty"
    assert all(p["type"] != "row" for p in below), "the canary row is not the last one"
    exprs = [t["expr"] for p in below for t in p["targets"]]
    assert all("modelroll_operator_analysis_" in e for e in exprs)
    for panel in below:
        for target in panel["targets"]:
            assert re.search(r"by \(version\b", target["expr"]), panel["title"]
            # A check's series are per check (and per arm): the legend says which.
            if "check" in target["expr"] and panel["type"] == "timeseries":
                assert "{{check}}" in target["legendFormat"], panel["title"]
    # The phase timeline maps every phase the operator exports to its name.
    [timeline] = [p for p in below if p["type"] == "state-timeline"]
    mapped = timeline["fieldConfig"]["defaults"]["mappings"][0]["options"]
    assert sorted(o["text"] for o in mapped.values()) == sorted(PHASES)
    expr = timeline["targets"][0]["expr"]
    for value, option in mapped.items():
        if value != "0":  # the first phase is what the sum of the others leaves
            assert f'phase="{option["text"]}"}}) * {value}' in expr, option


def test_the_batching_panels_show_padding_efficiency_and_every_close_reason() -> None:
    panels = {p["title"]: p for p in dashboard()["panels"]}
    padding = panels["Padding efficiency by version"]
    defaults = padding["fieldConfig"]["defaults"]
    assert (defaults["unit"], defaults["min"], defaults["max"]) == ("percentunit", 0, 1)
    assert padding["description"]
    (target,) = padding["targets"]
    useful, padded = target["expr"].split("\n/\n")
    assert 'kind="useful"' in useful
    assert useful.replace('kind="useful"', 'kind="padded"') == padded
    # The close reasons panel says what each reason the sidecar counts means.
    described = panels["Batch close reasons: $version"]["description"]
    for reason in CLOSE_REASONS:
        assert re.search(rf"\b{reason} \(", described), reason


def test_dashboard_and_alerts_count_the_same_codes_as_errors() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    codes = values["monitoring"]["prometheusRule"]["errorCodes"]
    error_panels = [
        t["expr"] for title, t in dashboard_targets(dashboard()) if "error ratio" in title.lower()
    ]
    assert error_panels
    for expr in error_panels:
        assert f'code=~"{codes}"' in expr


# --- the chart and the programs it runs --------------------------------------------------------


def container_args(docs: list[Manifest], suffix: str) -> list[str]:
    container = one(docs, "Deployment", suffix)["spec"]["template"]["spec"]["containers"][0]
    args: list[str] = container["args"]
    return args


@pytest.mark.parametrize("values", [(), (FULL_VALUES,)], ids=["default", "full"])
def test_the_operator_and_the_gateway_accept_the_rendered_arguments(
    helm: Helm, values: tuple[Path, ...]
) -> None:
    """Their own argument parsers read what the chart passes (a wrong flag exits the pod)."""
    docs = helm.template(values=values)
    operator = operator_cli.build_parser().parse_args(container_args(docs, "-operator"))
    config = operator_cli.parse_config(operator)
    gateway = gateway_cli.config_from_args(
        gateway_cli.build_parser().parse_args(container_args(docs, "-gateway"))
    )
    deployment = one(docs, "Deployment", "-gateway")["spec"]["template"]["spec"]
    assert gateway.port == deployment["containers"][0]["ports"][0]["containerPort"]
    operator_pod = one(docs, "Deployment", "-operator")["spec"]["template"]["spec"]
    health = {p["name"]: p["containerPort"] for p in operator_pod["containers"][0]["ports"]}
    assert urllib.parse.urlsplit(operator.liveness).port == health["health"]
    assert config.metrics_port == health["metrics"]
    if values:
        assert config.peering == "modelroll"
        assert operator.namespace == ["models", "models-staging"]
        assert config.sidecar_image == "registry.example.com/modelroll/sidecar:0.1.0"
    else:
        assert config.peering is None
        assert operator.all_namespaces


def test_the_charts_default_sidecar_image_is_the_operators_default() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    image = values["sidecar"]["image"]
    assert f"{image['repository']}:{chart_meta()['appVersion']}" == DEFAULT_SIDECAR_IMAGE


def test_the_sidecars_resources_in_values_reach_the_operator_parsed_as_its_flag(
    helm: Helm,
) -> None:
    assert not [a for a in operator_args(helm.template()) if a.startswith("--sidecar-resources")]
    guaranteed = (
        "sidecar.resources.requests.cpu=250m,sidecar.resources.limits.cpu=250m,"
        "sidecar.resources.requests.memory=256Mi,sidecar.resources.limits.memory=256Mi"
    )
    given = operator_args(helm.template("--set", guaranteed))
    (flag,) = [a for a in given if a.startswith("--sidecar-resources=")]
    config = operator_cli.parse_config(operator_cli.build_parser({}).parse_args([flag]))
    assert config.sidecar_resources == {
        "requests": {"cpu": "250m", "memory": "256Mi"},
        "limits": {"cpu": "250m", "memory": "256Mi"},
    }
