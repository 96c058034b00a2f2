"""The ModelVersion CRD as a person meets it through kubectl: validation, explain, get, scale.

No operator runs here: everything is the API server applying crds/modelversion.yaml.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from modelroll_devcluster import Cluster
from modelroll_devcluster.cluster import KubectlError, namespace_name
from tests.support.apiserver import model_version

pytestmark = pytest.mark.integration

SERVER = {"image": "ghcr.io/acme/sentiment:1.4"}


@pytest.fixture(scope="module")
def ns(cluster: Cluster, crd: None) -> Iterator[str]:
    """One namespace for the whole module (nothing here leaves a finalizer behind)."""
    name = cluster.create_namespace(namespace_name("crd"))
    yield name
    cluster.delete_namespace(name)


def canary(analysis: dict[str, Any]) -> dict[str, Any]:
    return model_version("canary", "sentiment", endpoint="http://s:8000", analysis=analysis)


def dry_run(cluster: Cluster, ns: str, manifest: dict[str, Any]) -> dict[str, Any]:
    """Create ``manifest`` with a server-side dry run: full validation and defaulting."""
    result = cluster.kubectl(
        "create",
        "--dry-run=server",
        "-o",
        "json",
        "-f",
        "-",
        namespace=ns,
        input=yaml.safe_dump(manifest),
    )
    doc: dict[str, Any] = json.loads(result.stdout)
    return doc


def open_inference(server: dict[str, Any] = SERVER, **spec: Any) -> dict[str, Any]:
    """A managed OpenInference version of model iris."""
    return model_version("v1", "iris", server=server, protocol="OpenInference", **spec)


def rejection(cluster: Cluster, ns: str, manifest: dict[str, Any]) -> str:
    with pytest.raises(KubectlError) as caught:
        dry_run(cluster, ns, manifest)
    return caught.value.stderr


@pytest.mark.parametrize(
    ("manifest", "message"),
    [
        pytest.param(
            model_version("v1", "sentiment", weight=-1, endpoint="http://s:8000"),
            "spec.weight: Invalid value: -1: spec.weight in body should be greater than or "
            "equal to 0",
            id="negative-weight",
        ),
        pytest.param(
            model_version("v1", "sentiment", weight=1001, endpoint="http://s:8000"),
            "spec.weight in body should be less than or equal to 1000",
            id="weight-above-1000",
        ),
        pytest.param(
            model_version("v1", "sentiment", endpoint="http://s:8000", server=SERVER),
            "exactly one of spec.server (managed mode: the operator runs the model) and "
            "spec.endpoint (external mode: route to an existing URL) must be set",
            id="server-and-endpoint",
        ),
        pytest.param(
            model_version("v1", "sentiment"),
            "exactly one of spec.server",
            id="neither-server-nor-endpoint",
        ),
        pytest.param(
            {
                **model_version("v1", "x", endpoint="http://s:8000"),
                "spec": {"endpoint": "http://s"},
            },
            "spec.model: Required value",
            id="missing-model",
        ),
        pytest.param(
            model_version("v1", "sentiment", server=SERVER, batching={"maxBatchSize": 0}),
            "spec.batching.maxBatchSize: Invalid value: 0: spec.batching.maxBatchSize in body "
            "should be greater than or equal to 1",
            id="max-batch-size-0",
        ),
        pytest.param(
            model_version(
                "v1", "sentiment", server=SERVER, batching={"maxWaitMs": 500, "timeoutMs": 100}
            ),
            "spec.batching.maxWaitMs must not exceed spec.batching.timeoutMs",
            id="wait-longer-than-timeout",
        ),
        pytest.param(  # timeoutMs left out: its default, 30000, is what the rule compares with
            model_version("v1", "sentiment", server=SERVER, batching={"maxWaitMs": 45000}),
            "spec.batching: Invalid value: spec.batching.maxWaitMs must not exceed "
            "spec.batching.timeoutMs: a request would time out before its batch could close",
            id="wait-longer-than-the-default-timeout",
        ),
        pytest.param(
            model_version("v1", "sentiment", server=SERVER, batching={"batchBy": "Sorted"}),
            'spec.batching.batchBy: Unsupported value: "Sorted": supported values: "Length", '
            '"Arrival"',
            id="batch-by-unknown",
        ),
        pytest.param(  # the sidecar's flag takes any case; the resource takes the enum's spelling
            model_version("v1", "sentiment", server=SERVER, batching={"waitPolicy": "adaptive"}),
            'spec.batching.waitPolicy: Unsupported value: "adaptive": supported values: "Auto", '
            '"Fixed", "Adaptive"',
            id="wait-policy-lowercase",
        ),
        pytest.param(
            model_version(
                "v1",
                "chat",
                server=SERVER,
                protocol="OpenAI",
                batching={"lengthFrom": "Tokenizer"},
            ),
            "spec.batching.lengthFrom Tokenizer needs spec.protocol Batch",
            id="tokenizer-lengths-for-an-openai-engine",
        ),
        pytest.param(
            open_inference(batching={"lengthFrom": "Tokenizer"}),
            "spec.batching.lengthFrom Tokenizer needs spec.protocol Batch: an OpenInference "
            "server serves no tokenizer",
            id="tokenizer-lengths-for-an-open-inference-server",
        ),
        pytest.param(
            model_version("v1", "iris", server={**SERVER, "servedModelName": "iris-sklearn"}),
            "spec.server.servedModelName needs spec.protocol OpenInference",
            id="served-model-name-on-a-batch-version",
        ),
        pytest.param(
            model_version(
                "v1",
                "chat",
                server={**SERVER, "servedModelName": "chat"},
                protocol="OpenAI",
            ),
            "spec.server.servedModelName needs spec.protocol OpenInference",
            id="served-model-name-on-an-openai-version",
        ),
        pytest.param(
            open_inference({**SERVER, "servedModelName": "iris/v2"}),
            "spec.server.servedModelName in body should match",
            id="served-model-name-not-one-path-segment",
        ),
        pytest.param(
            open_inference(scaling={"maxReplicas": 2, "timeToFirstTokenP95Ms": 500}),
            "spec.scaling.timeToFirstTokenP95Ms and tokensPerSecond need spec.protocol OpenAI",
            id="scaling-chat-target-on-open-inference",
        ),
        pytest.param(
            model_version("v1", "sentiment", endpoint="ftp://s"),
            "spec.endpoint must be an http:// or https:// URL",
            id="endpoint-not-http",
        ),
        pytest.param(
            model_version("v1", "Sentiment", endpoint="http://s:8000"),
            "spec.model must be a DNS label",
            id="model-not-a-dns-label",
        ),
        pytest.param(
            model_version("v1.5", "sentiment", server=SERVER),
            "metadata.name: Invalid value: a managed ModelVersion (spec.server) names its "
            "Deployment and Service",
            id="managed-name-not-a-dns-1035-label",
        ),
        pytest.param(
            model_version("v1", "sentiment", server=SERVER, batching={"maxBatchSise": 8}),
            'unknown field "spec.batching.maxBatchSise"',
            id="misspelt-field",
        ),
        pytest.param(
            canary({"steps": []}),
            "spec.analysis.steps: Invalid value: 0: spec.analysis.steps in body should have at "
            "least 1 items",
            id="analysis-without-steps",
        ),
        pytest.param(
            canary({"steps": [{"weight": 100}]}),
            "spec.analysis.steps[0].weight in body should be less than or equal to 99",
            id="analysis-step-of-100",
        ),
        pytest.param(
            canary({"steps": [{"weight": 10}], "minSeconds": 60, "maxSeconds": 30}),
            "spec.analysis.minSeconds must not exceed spec.analysis.maxSeconds",
            id="analysis-min-above-max",
        ),
        pytest.param(
            canary({"steps": [{"weight": 10}], "onInconclusive": "Retry"}),
            'spec.analysis.onInconclusive: Unsupported value: "Retry"',
            id="analysis-unknown-policy",
        ),
        pytest.param(
            canary({"steps": [{"weight": 10}], "checks": {"errors": {"maxRatio": 0.5}}}),
            "spec.analysis.checks.errors.maxRatio must be within 1..100",
            id="analysis-ratio-below-1",
        ),
        pytest.param(
            canary({"steps": [{"weight": 10}], "checks": {"errors": {"codes": ["5XX"]}}}),
            "spec.analysis.checks.errors.codes[0]",
            id="analysis-bad-code",
        ),
        pytest.param(
            canary(
                {
                    "steps": [{"weight": 10}],
                    "metrics": {
                        "gateway": {"url": "http://gw:8080/metrics"},
                        "prometheus": {"url": "http://prom:9090"},
                    },
                }
            ),
            "spec.analysis.metrics takes one of gateway and prometheus",
            id="analysis-two-sources",
        ),
        pytest.param(
            canary({"steps": [{"weight": 10}], "metrics": {"prometheus": {"url": "prom:9090"}}}),
            "spec.analysis.metrics.prometheus.url must be an http(s) URL",
            id="analysis-prometheus-not-a-url",
        ),
        pytest.param(
            canary({"steps": [{"weight": 10}], "checks": {"timeToFirstToken": {"quantile": 1}}}),
            "spec.analysis.checks.timeToFirstToken.quantile must be within 0.5..1 (1 excluded)",
            id="analysis-ttft-quantile-1",
        ),
        pytest.param(
            canary({"steps": [{"weight": 10}], "shadow": {"minCopies": 10}}),
            "spec.analysis.shadow needs spec.shadow",
            id="shadow-gate-without-shadow",
        ),
        pytest.param(
            model_version("v1", "chat", endpoint="http://s", cohortHeader="x-modelroll-version"),
            "spec.cohortHeader cannot be X-Modelroll-Version",
            id="cohort-header-pins",
        ),
        pytest.param(
            model_version("v1", "chat", endpoint="http://s", cohortHeader="X User"),
            "spec.cohortHeader in body should match",
            id="cohort-header-not-a-header",
        ),
        pytest.param(
            canary({"steps": [{"weight": 10}], "falseRollbackBudget": 0.6}),
            "spec.analysis.falseRollbackBudget must be above 0 and below 0.5",
            id="analysis-budget-too-large",
        ),
        pytest.param(
            model_version(
                "v1",
                "m",
                server=SERVER,
                scaling={"minReplicas": 5, "maxReplicas": 2, "inFlight": 4},
            ),
            "spec.scaling.minReplicas must not exceed spec.scaling.maxReplicas",
            id="scaling-min-above-max",
        ),
        pytest.param(
            model_version("v1", "m", server=SERVER, scaling={"maxReplicas": 2, "inFlight": 0}),
            "spec.scaling.inFlight in body should be greater than or equal to 1",
            id="scaling-target-zero",
        ),
        pytest.param(
            model_version("v1", "m", server=SERVER, scaling={"maxReplicas": 2}),
            "spec.scaling needs exactly one target",
            id="scaling-no-target",
        ),
        pytest.param(
            model_version(
                "v1", "m", endpoint="http://s:8000", scaling={"maxReplicas": 2, "inFlight": 4}
            ),
            "spec.scaling is for managed versions (spec.server)",
            id="scaling-external",
        ),
        pytest.param(
            model_version(
                "v1", "m", server=SERVER, scaling={"maxReplicas": 2, "tokensPerSecond": 100}
            ),
            "spec.scaling.timeToFirstTokenP95Ms and tokensPerSecond need spec.protocol OpenAI",
            id="scaling-chat-target-on-batch",
        ),
    ],
)
def test_an_invalid_model_version_is_rejected_with_a_message_naming_the_problem(
    cluster: Cluster, ns: str, manifest: dict[str, Any], message: str
) -> None:
    assert message in rejection(cluster, ns, manifest)


def test_the_api_server_fills_in_the_documented_defaults(cluster: Cluster, ns: str) -> None:
    managed = dry_run(cluster, ns, model_version("stable-v1", "sentiment", server=SERVER))
    assert managed["spec"] == {
        "model": "sentiment",
        "weight": 0,
        "replicas": 1,
        "scaleDownDelaySeconds": 600,
        "protocol": "Batch",
        "server": {"image": "ghcr.io/acme/sentiment:1.4", "port": 8080},
        "batching": {
            "maxBatchSize": 32,
            "maxWaitMs": 10,
            "maxQueueSize": 1024,
            "maxBatchTokens": 0,
            "timeoutMs": 30000,
            "maxConcurrentBatches": 1,
            "batchBy": "Length",
            "waitPolicy": "Auto",
            "lengthFrom": "Auto",
        },
    }
    # maxWaitMs 0 (send what is queued at once, Triton's default) is a legal setting.
    eager = model_version("eager", "sentiment", server=SERVER, batching={"maxWaitMs": 0})
    assert dry_run(cluster, ns, eager)["spec"]["batching"]["maxWaitMs"] == 0
    # The DESIGN example's `endpoint: ""` next to a server is managed mode, not a conflict.
    example = model_version("stable-v1", "sentiment", endpoint="", server=SERVER, weight=9)
    assert dry_run(cluster, ns, example)["spec"]["weight"] == 9


def test_an_open_inference_version_with_its_servers_model_name_is_accepted(
    cluster: Cluster, ns: str
) -> None:
    oip = open_inference(
        {**SERVER, "servedModelName": "iris-sklearn"},
        scaling={"maxReplicas": 3, "queueWaitP95Ms": 50},
    )
    made = dry_run(cluster, ns, oip)["spec"]
    assert (made["protocol"], made["server"]["servedModelName"]) == (
        "OpenInference",
        "iris-sklearn",
    )


def test_length_aware_batching_with_an_adaptive_wait_is_accepted_with_the_other_defaults(
    cluster: Cluster, ns: str
) -> None:
    tuned = model_version(
        "tuned",
        "sentiment",
        server=SERVER,
        batching={
            "batchBy": "Length",
            "waitPolicy": "Adaptive",
            "lengthFrom": "Tokenizer",
            "maxWaitMs": 25,
        },
    )
    assert dry_run(cluster, ns, tuned)["spec"]["batching"] == {
        "maxBatchSize": 32,
        "maxWaitMs": 25,
        "maxQueueSize": 1024,
        "maxBatchTokens": 0,
        "timeoutMs": 30000,
        "maxConcurrentBatches": 1,
        "batchBy": "Length",
        "waitPolicy": "Adaptive",
        "lengthFrom": "Tokenizer",
    }
    # Each alone, too: the other keeps its default.
    fifo = model_version("fifo", "sentiment", server=SERVER, batching={"batchBy": "Arrival"})
    made = dry_run(cluster, ns, fifo)["spec"]["batching"]
    assert (made["batchBy"], made["waitPolicy"]) == ("Arrival", "Auto")


def test_the_api_server_fills_in_the_analysis_defaults(cluster: Cluster, ns: str) -> None:
    made = dry_run(cluster, ns, canary({"steps": [{"weight": 10}], "checks": {"errors": {}}}))
    assert made["spec"]["analysis"] == {
        "steps": [{"weight": 10, "pause": False}],
        "intervalSeconds": 3,
        "warmupSeconds": 5,
        "warmupRequests": 0,
        "minSeconds": 30,
        "minRequests": 100,
        "maxSeconds": 600,
        "onInconclusive": "Hold",
        "falseRollbackBudget": 0.01,
        "checks": {"errors": {"maxRatio": 1.5, "dryRun": False}},
    }


def test_the_model_of_a_version_cannot_change(cluster: Cluster, ns: str) -> None:
    cluster.apply(model_version("moving", "sentiment", endpoint="http://s:8000"), namespace=ns)
    with pytest.raises(KubectlError) as caught:
        cluster.kubectl(
            "patch",
            "mv",
            "moving",
            "--type=merge",
            "-p",
            '{"spec":{"model":"other"}}',
            namespace=ns,
        )
    assert "spec.model is immutable" in caught.value.stderr


def test_kubectl_explain_describes_every_batching_field(cluster: Cluster) -> None:
    text = cluster.kubectl("explain", "mv.spec.batching").stdout
    assert "how the sidecar groups requests into batches" in text
    fields = {
        "maxBatchSize": "A batch closes when it holds this many requests",
        "maxWaitMs": "A batch closes when its oldest request has waited",
        "maxQueueSize": "refused with 429",
        "maxBatchTokens": "Padded-token budget per batch",
        "timeoutMs": "gets\n    504",
        "maxConcurrentBatches": "Batches sent to the model at the same time",
    }
    for name, words in fields.items():
        assert f"  {name}\t<integer>" in text
        assert " ".join(words.split()) in " ".join(text.split())
    policies = {
        "batchBy": ("Arrival", "Length", "oldest request always goes in the next batch"),
        "waitPolicy": ("Auto", "Fixed", "Adaptive", "no batch waits longer than maxWaitMs"),
    }
    for name, phrases in policies.items():
        assert f"  {name}\t<string>" in text
        explained = " ".join(cluster.kubectl("explain", f"mv.spec.batching.{name}").stdout.split())
        for phrase in phrases:
            assert phrase in explained, (name, phrase)
    spec = cluster.kubectl("explain", "mv.spec").stdout
    assert "model\t<string> -required-" in spec
    assert "Relative routing weight, 0 to 1000" in " ".join(spec.split())


COLUMNS = ["NAME", "MODEL", "WEIGHT", "READY", "ROUTED", "ANALYSIS", "STEP", "CAPACITY", "AGE"]
"""What ``kubectl get mv`` prints; ``-o wide`` adds more after them."""


def test_kubectl_get_shows_the_columns_people_scan(cluster: Cluster, ns: str) -> None:
    cluster.apply(model_version("stable-v1", "sentiment", weight=9, endpoint="http://s:8000"), ns)
    header, row = cluster.kubectl("get", "mv", "stable-v1", namespace=ns).stdout.splitlines()
    assert header.split() == COLUMNS
    assert row.split()[:3] == ["stable-v1", "sentiment", "9"]
    wide = cluster.kubectl("get", "modelversions", "stable-v1", "-o", "wide", namespace=ns).stdout
    assert wide.splitlines()[0].split() == [*COLUMNS, "REPLICAS", "ENDPOINT", "MESSAGE"]
    # The category lists ModelVersions along with anything else modelroll adds later.
    assert (
        "modelversion.modelroll.io/stable-v1"
        in cluster.kubectl("get", "modelroll", "-o", "name", namespace=ns).stdout
    )


def test_kubectl_scale_sets_the_replicas_of_a_version(cluster: Cluster, ns: str) -> None:
    cluster.apply(model_version("scaled", "sentiment", server=SERVER), namespace=ns)
    cluster.kubectl("scale", "mv", "scaled", "--replicas=3", namespace=ns)
    assert cluster.kubectl_json("get", "mv", "scaled", namespace=ns)["spec"]["replicas"] == 3
    scale = json.loads(
        cluster.kubectl(
            "get",
            "--raw",
            f"/apis/modelroll.io/v1alpha1/namespaces/{ns}/modelversions/scaled/scale",
        ).stdout
    )
    assert scale["kind"] == "Scale"
    assert scale["spec"]["replicas"] == 3
