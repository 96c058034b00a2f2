"""The Helm chart's values, declared once: ``make generate`` writes ``values.yaml`` (each key with
its ``# --`` comment, helm-docs style), ``values.schema.json`` (closed objects, types, bounds,
enums, patterns) and the values table of the chart's README from :data:`VALUES`
(``hack/values_files.py``).

Why a typed table here rather than annotated comments in values.yaml: the schema holds much that
a helm-docs comment cannot say (enums, bounds, patterns, the items of lists, the label selector
it refuses unknown keys in), and groups of keys repeat for each component (an image, pod
placement, a ServiceAccount, an alert), which functions here declare once. Annotating
values.yaml with all of that would need a language of our own inside YAML comments, read by
regular expressions and checked by nothing; here mypy checks it. Chart users still read
values.yaml, which says where it comes from.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from modelroll_common.metric_names import GATEWAY_ADMIN_PORT
from modelroll_operator.cli import DEFAULT_METRICS_PORT
from modelroll_operator.permissions import PERMISSIONS, Feature, Permission

Schema = dict[str, Any]
"""JSON schema keywords of one value, besides its description."""

DURATION = "^([0-9]+(ms|s|m|h|d|w|y))+$"
"""A Prometheus duration."""
NAMESPACE = "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
"""A Kubernetes namespace's name (an RFC 1123 label)."""
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


def string(
    *,
    enum: tuple[str, ...] = (),
    pattern: str | None = None,
    min_length: int | None = None,
    max_length: int | None = None,
) -> Schema:
    schema: Schema = {"type": "string"}
    if enum:
        schema["enum"] = list(enum)
    if pattern is not None:
        schema["pattern"] = pattern
    if min_length is not None:
        schema["minLength"] = min_length
    if max_length is not None:
        schema["maxLength"] = max_length
    return schema


def boolean() -> Schema:
    return {"type": "boolean"}


def integer(minimum: int | None = None, maximum: int | None = None) -> Schema:
    schema: Schema = {"type": "integer"}
    if minimum is not None:
        schema["minimum"] = minimum
    if maximum is not None:
        schema["maximum"] = maximum
    return schema


def port() -> Schema:
    return integer(1, 65535)


def positive(maximum: float | None = None) -> Schema:
    """A number above 0."""
    schema: Schema = {"type": "number", "exclusiveMinimum": 0}
    if maximum is not None:
        schema["maximum"] = maximum
    return schema


def array(items: Schema) -> Schema:
    return {"type": "array", "items": items}


def objects() -> Schema:
    """A list of Kubernetes objects the chart passes on as they are (EnvVar, Toleration...)."""
    return array({"type": "object"})


def obj() -> Schema:
    """A Kubernetes object the chart passes on as it is (a security context, affinity...)."""
    return {"type": "object"}


def string_map() -> Schema:
    """Labels or annotations."""
    return {"type": "object", "additionalProperties": {"type": "string"}}


def duration(optional: bool = False) -> Schema:
    return string(pattern=f"^({DURATION[1:-1]})?$" if optional else DURATION)


def label_selector() -> Schema:
    return {"$ref": "#/definitions/labelSelector"}


@dataclass(frozen=True)
class Value:
    """One value: its default (None: not in values.yaml, only accepted), what it does, and
    what the schema accepts."""

    key: str
    default: Any
    description: str
    schema: Schema


@dataclass(frozen=True)
class Group:
    """A mapping of values; the schema refuses a key it does not list."""

    key: str
    children: tuple[Node, ...]
    description: str = ""
    """For the schema only: values.yaml and the README document each child."""
    note: str = ""
    """A plain comment above the key in values.yaml."""
    required: tuple[str, ...] = ()


Node = Value | Group


def rights(verbs: Iterable[str], permission: Permission, names: Iterable[str] = ()) -> str:
    """``get/patch `configmaps` named modelroll-routes``."""
    named = f" named {', '.join(names)}" if names else ""
    return f"{'/'.join(verbs)} `{permission.resource}`{named}"


def deletion_rights() -> str:
    """What the operator keeps cluster-wide to finish deleting a watched namespace, from the
    table of its calls."""
    always: list[str] = []
    optional: list[str] = []
    for p in PERMISSIONS:
        if p.deleting is None:
            continue
        kept = rights(p.deleting.verbs, p, p.deleting.names)
        if p.feature is Feature.ALWAYS:
            always.append(kept)
        else:
            optional.append(f"{kept}, with `{p.feature.value}`")
    return ", ".join(always) + (f" (and {'; '.join(optional)})" if optional else "")


HTTPROUTES = next(p for p in PERMISSIONS if p.feature is Feature.GATEWAY_API)
"""The operator's rights on HTTPRoutes, with operator.gatewayAPI."""
HTTPROUTES_KEPT = HTTPROUTES.deleting.verbs if HTTPROUTES.deleting else ()


def image(
    component: str, repository: str, repository_doc: str = "", pull_policy: bool = True
) -> Group:
    name = component.capitalize()
    children: list[Node] = [
        Value(
            "repository",
            repository,
            repository_doc or f"{name} image repository.",
            string(min_length=1),
        ),
        Value("tag", "", f"{name} image tag (default: the chart's appVersion).", string()),
    ]
    if pull_policy:
        children.append(
            Value(
                "pullPolicy",
                "IfNotPresent",
                f"{name} image pull policy.",
                string(enum=("Always", "IfNotPresent", "Never")),
            )
        )
    return Group("image", tuple(children), required=("repository",))


def pod_placement(component: str) -> tuple[Node, ...]:
    """What every Deployment's pods take: annotations, labels, scheduling."""
    return (
        Value("podAnnotations", {}, f"Annotations on the {component} pods.", string_map()),
        Value("podLabels", {}, f"Extra labels on the {component} pods.", string_map()),
        Value("nodeSelector", {}, f"Node selector for the {component} pods.", string_map()),
        Value("tolerations", [], f"Tolerations for the {component} pods.", objects()),
        Value("affinity", {}, f"Affinity for the {component} pods.", obj()),
        Value("priorityClassName", "", f"Priority class of the {component} pods.", string()),
    )


def service_account(component: str) -> Group:
    return Group(
        "serviceAccount",
        (
            Value(
                "create",
                True,
                f"Create the {component}'s ServiceAccount (and its RBAC).",
                boolean(),
            ),
            Value(
                "name",
                "",
                f"ServiceAccount name (default: `<fullname>-{component}`).",
                string(),
            ),
            Value(
                "annotations", {}, f"Annotations on the {component}'s ServiceAccount.", string_map()
            ),
        ),
    )


def scrape(enabled: str) -> tuple[Node, ...]:
    """A PodMonitor's or ServiceMonitor's switch, interval and timeout."""
    return (
        Value("enabled", False, enabled, boolean()),
        Value("interval", "15s", "Scrape interval.", duration()),
        Value(
            "scrapeTimeout",
            "",
            "Scrape timeout (empty: Prometheus's default).",
            duration(optional=True),
        ),
    )


def alert(key: str, threshold: Value, for_: str, severity: str) -> Group:
    return Group(
        key,
        (
            threshold,
            Value("for", for_, "...for this long.", duration()),
            Value("severity", severity, "Severity label of the alert.", string(min_length=1)),
        ),
    )


OPERATOR = Group(
    "operator",
    (
        Value(
            "enabled",
            True,
            "Deploy the operator, which reconciles ModelVersions into the routes ConfigMap and "
            "managed Deployments/Services.",
            boolean(),
        ),
        image("operator", "ghcr.io/modelroll/modelroll-operator"),
        Value(
            "replicas",
            1,
            "Operator replicas. More than one needs `peering: true` so that only one of them "
            "acts; the chart refuses to render more than one without it.",
            integer(0),
        ),
        Value(
            "watchNamespaces",
            [],
            "Namespaces whose ModelVersions the operator reconciles. Empty: every namespace (the "
            "operator gets a ClusterRole). Otherwise it gets a Role in each listed namespace, "
            "plus, in a ClusterRole, only what finishing a namespace's deletion takes once that "
            f"Role is deleted with it: {deletion_rights()}.",
            array(string(pattern=NAMESPACE, max_length=63)),
        ),
        Value(
            "peering",
            False,
            "kopf peering, for more than one replica: the replicas elect one active operator "
            "through a ClusterKopfPeering (or a KopfPeering per watched namespace) that the chart "
            "creates; kopf's peering CRDs ship in the chart's crds/. Off, the operator runs "
            "`--standalone`.",
            boolean(),
        ),
        Value(
            "gatewayAPI",
            False,
            "Route models by Gateway API HTTPRoutes too (`--gateway-api`); needs the Gateway API "
            "CRDs installed. The operator then watches the HTTPRoutes labelled "
            "`modelroll.io/model: <model>` and patches the backendRefs of their rule for that "
            f"model: {rights(HTTPROUTES.verbs, HTTPROUTES)} where its other rules are granted "
            "(cluster-wide, or in each of `watchNamespaces`, plus "
            f"{'/'.join(HTTPROUTES_KEPT)} in the ClusterRole "
            "described there). Its pods are admitted to the sidecars by the NetworkPolicy (an "
            "analysis reads their `/metrics`); the data plane's pods go in "
            "`networkPolicy.extraIngress`. Off, it has no access to HTTPRoutes at all.",
            boolean(),
        ),
        Value(
            "scaleBeforeShift",
            True,
            "Raise a version's ready replicas to what its new share of the model's traffic needs "
            "before that share is written into its route (an analysis step, a promotion, "
            "`kubectl modelroll promote` / `set-weight`), and keep the version the traffic left "
            "at its replicas for its `spec.scaleDownDelaySeconds`. Off "
            "(`--no-scale-before-shift`): weights move at once, whatever replicas the version "
            "has.",
            boolean(),
        ),
        Group(
            "podSecurity",
            (
                Value(
                    "level",
                    "baseline",
                    "What a ModelVersion's `spec.server` may give its pod (`--pod-security`). "
                    '`baseline`: what Pod Security "baseline" forbids (privileged or hostProcess '
                    "containers, capabilities beyond the container runtime's defaults, hostPath "
                    "volumes, host ports, hostIPC, probe and lifecycle hosts, unconfined seccomp "
                    "or AppArmor, custom SELinux options, an unmasked /proc) is refused by name, "
                    "in the version's InvalidSpec condition, and nothing is applied. "
                    "`privileged` relaxes all of that: whoever may write a ModelVersion may then "
                    "run pods with the node's privileges, unless the namespace's own Pod "
                    "Security level forbids it (Kubernetes' default level is `privileged`).",
                    string(enum=("baseline", "privileged")),
                ),
                Value(
                    "admissionPolicy",
                    True,
                    "Also refuse those ModelVersions at `kubectl apply`, with the same messages: "
                    "a ValidatingAdmissionPolicy and its binding (cluster-wide objects; limited "
                    "to the `watchNamespaces` when set) judge every create, and every update "
                    "that changes `spec.server`. Rendered only with `level: baseline`. Off: only "
                    "the operator's InvalidSpec condition says why, once the version is stored.",
                    boolean(),
                ),
            ),
        ),
        Group(
            "analysis",
            (
                Value(
                    "urlPrefixes",
                    [],
                    "URL prefixes that canary analyses may read metrics from "
                    "(`--analysis-url-prefix`), e.g. "
                    "`http://prometheus-operated.monitoring.svc:9090/` for a Prometheus shared "
                    "by namespaces. Empty: an analysis reads only Services of its own namespace "
                    "(`<service>.<namespace>.svc`). Each prefix relaxes that: the operator, from "
                    "its own pod, reads any URL under it for whoever may write a ModelVersion in "
                    "any namespace it serves.",
                    array(string(pattern="^https?://[^/?#@]+(/[^?#]*)?$", max_length=2048)),
                ),
                Value(
                    "gatewayNamespaces",
                    [],
                    "Namespaces whose gateway pods canary analyses of every namespace may list "
                    "and read (`--analysis-gateway-namespace`; "
                    "`spec.analysis.metrics.gateway.namespace`). Empty: an analysis reads the "
                    "gateway pods of its own namespace, where the chart's gateway serves the "
                    "release namespace's models. Each namespace relaxes that: the operator lists "
                    "its pods with its own rights for any namespace's analyses.",
                    array(string(pattern=NAMESPACE, max_length=63)),
                ),
            ),
            description="What canary analyses may read beyond their own namespace.",
        ),
        Value(
            "sidecarImage",
            "",
            "Sidecar image the operator puts next to every managed model container, as "
            "`repository:tag` (default: `sidecar.image` below).",
            string(),
        ),
        Value("logLevel", "INFO", "Operator log level.", string(enum=LOG_LEVELS)),
        Value(
            "metricsPort",
            DEFAULT_METRICS_PORT,
            "Port of the operator's Prometheus metrics (`--metrics-port`, container port "
            "`metrics`): its canary analyses' phase, step, weights and checks. "
            "`monitoring.operatorPodMonitor` scrapes it.",
            port(),
        ),
        Value(
            "extraArgs",
            [],
            "Extra command-line arguments for `modelroll-operator`.",
            array(string()),
        ),
        Value("env", [], "Extra environment variables for the operator container.", objects()),
        Value(
            "resources",
            {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"memory": "512Mi"}},
            "Operator resource requests and limits. The memory limit bounds what the operator "
            "can take: it starts near 70 MiB, and a Prometheus answer at the analyses' 16 MiB "
            "cap takes about 180 MiB more while it is parsed (about 250 MiB with four canaries' "
            "answers at once).",
            obj(),
        ),
        *pod_placement("operator"),
        service_account("operator"),
    ),
)

GATEWAY = Group(
    "gateway",
    (
        Value(
            "enabled",
            True,
            "Deploy the gateway, which splits each model's traffic across its versions by weight.",
            boolean(),
        ),
        image("gateway", "ghcr.io/modelroll/modelroll-gateway"),
        Value(
            "replicas",
            1,
            "Gateway replicas. Every replica follows the same routes ConfigMap. More than one "
            "also gets a PodDisruptionBudget (`podDisruptionBudget` below).",
            integer(0),
        ),
        Group(
            "podDisruptionBudget",
            (
                Value(
                    "maxUnavailable",
                    1,
                    "Gateway pods that a voluntary disruption (a node drain, a cluster upgrade) "
                    "may take down at once: a number (at least 1; 0 would block every node "
                    'drain), or a percentage of `replicas` such as "25%". The '
                    "PodDisruptionBudget is rendered only when `replicas` is more than 1: a "
                    "single pod has no others to keep serving.",
                    {"anyOf": [integer(1), string(pattern="^([1-9][0-9]?|100)%$")]},
                ),
            ),
            description="The gateway's PodDisruptionBudget, rendered when replicas is more than 1.",
        ),
        Value("port", 8080, "Port the gateway listens on in its container, for clients.", port()),
        Value(
            "adminPort",
            GATEWAY_ADMIN_PORT,
            "Port of the gateway's `GET /metrics` and `GET /v1/routes` (`--admin-port`, "
            "container port `admin`), which name every version, weight-0 ones too, and their "
            "endpoints: on `port` they are unknown paths. Its own ClusterIP Service, "
            "`<fullname>-gateway-admin`, serves it to the ServiceMonitor, and the NetworkPolicy "
            "admits only the scraper and the operator's pods to it. A canary analysis reads "
            "gateway pods on `spec.analysis.metrics.gateway.port` "
            f"({GATEWAY_ADMIN_PORT} unless set): move both together.",
            port(),
        ),
        Value(
            "upstreamTimeoutSeconds",
            30,
            "Seconds a sidecar may take to answer before the gateway answers 504 "
            "(`--upstream-timeout`). It also bounds the gateway's shutdown: after SIGTERM the "
            "gateway turns unready but serves 3 s more, while the Service stops sending it "
            "connections, then gives open requests this long to be answered. The pods' "
            "terminationGracePeriodSeconds is this plus 5 s.",
            positive(),
        ),
        Value(
            "readTimeoutSeconds",
            30,
            "Seconds a client has to send its whole request (from its first byte; a new "
            "connection: from connecting). Slower clients get 408 and are disconnected, counted "
            "in modelroll_gateway_client_timeouts_total.",
            positive(),
        ),
        Value(
            "trustedNetworks",
            [],
            "Networks (CIDR, e.g. `10.244.0.0/16`) whose clients may pin a version, a weight-0 "
            "one too, with the `X-Modelroll-Version` header (`--trusted-networks`); the header "
            "of any other client is ignored and its request routed by weight. Judged by the "
            "connection's source address: behind a Service that masquerades, that is the node's "
            "address on the pod network; behind a service mesh's sidecar in the gateway's pod "
            "(Istio's arrives from `127.0.0.6`) or an authenticating proxy there "
            "(`127.0.0.1`), it is loopback for every client, so trusting loopback trusts them "
            "all. Empty: no client pins. `127.0.0.1/32` lets `kubectl port-forward` pin, where "
            "nothing in the pod forwards clients from loopback.",
            array(string(pattern="^[0-9A-Fa-f.:]+(/[0-9]{1,3})?$")),
        ),
        Value(
            "pinsFromAnyClient",
            False,
            "Relaxes who may pin (`--pins-from-any-client`): every client may pin any version "
            "of a route, weight-0 ones too, and a 404 tells it a version's name from a guess. "
            "Off: only `trustedNetworks` pin.",
            boolean(),
        ),
        Value("logLevel", "INFO", "Gateway log level.", string(enum=LOG_LEVELS)),
        Value(
            "extraArgs",
            [],
            "Extra command-line arguments for `modelroll-gateway`.",
            array(string()),
        ),
        Value("env", [], "Extra environment variables for the gateway container.", objects()),
        Group(
            "service",
            (
                Value(
                    "type",
                    "ClusterIP",
                    "Gateway Service type.",
                    string(enum=("ClusterIP", "NodePort", "LoadBalancer")),
                ),
                Value("port", 8080, "Gateway Service port.", port()),
                Value("annotations", {}, "Annotations on the gateway Service.", string_map()),
            ),
        ),
        Value(
            "resources",
            {},
            "Gateway resource requests and limits (unset by default; set them for your cluster).",
            obj(),
        ),
        *pod_placement("gateway"),
        service_account("gateway"),
    ),
)

QUANTITIES = {"type": "object", "additionalProperties": {"type": ["string", "integer"]}}

SIDECAR = Group(
    "sidecar",
    (
        image(
            "sidecar",
            "ghcr.io/modelroll/modelroll-sidecar",
            "Batching sidecar image repository (the operator injects it into managed pods).",
            pull_policy=False,
        ),
        Value(
            "resources",
            {},
            "The sidecar container's resources in managed pods, unless a ModelVersion sets "
            "`spec.sidecar.resources` (empty: the operator's default, requests cpu 100m and "
            "memory 128Mi, limits cpu 1 and memory 1Gi). Its requests are raised to its limits "
            "when the model server's requests equal its limits, so that the pod is Guaranteed.",
            {
                "type": "object",
                "additionalProperties": False,
                "properties": {"requests": QUANTITIES, "limits": QUANTITIES},
            },
        ),
    ),
)

NETWORK_POLICY = Group(
    "networkPolicy",
    (
        Value(
            "enabled",
            True,
            "Create a NetworkPolicy over the managed model pods of the release namespace (the "
            "one the gateway routes): other pods reach them only on the sidecar's port 8000, "
            "and only from the gateway's pods, the scraper below when "
            "`monitoring.podMonitor.enabled`, and `extraIngress`. The model server's own port, "
            "which it may bind on every address, is out of their reach. And one over the "
            "gateway's pods: every client reaches `gateway.port`, but only the scraper below, "
            "the operator's pods and `gatewayAdminFrom` reach `gateway.adminPort`. They take "
            "effect only where the network plugin enforces NetworkPolicy (Calico, Cilium, ...).",
            boolean(),
        ),
        Group(
            "scraper",
            (
                Value(
                    "namespaceSelector",
                    {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
                    "The namespaces of the Prometheus that scrapes the sidecars and the "
                    "gateway's admin port (a NetworkPolicy namespaceSelector; `{}`: every "
                    "namespace). The default is kube-prometheus-stack installed in the "
                    "namespace `monitoring`.",
                    label_selector(),
                ),
                Value(
                    "podSelector",
                    {"matchLabels": {"app.kubernetes.io/name": "prometheus"}},
                    "Its pods in those namespaces (a podSelector; `{}`: every pod). The default "
                    "matches the Prometheus pods of kube-prometheus-stack (the Prometheus "
                    "Operator labels them so).",
                    label_selector(),
                ),
            ),
            description="The Prometheus that scrapes the sidecars (admitted when "
            "monitoring.podMonitor.enabled) and the gateway's admin port.",
            note="Helm merges given selectors into these defaults: in a values file, `null` "
            "drops a default (`matchLabels: null`, or a label set to null).",
        ),
        Value(
            "extraIngress",
            [],
            "More ingress rules for the model pods (NetworkPolicyIngressRule objects: `from` "
            "and `ports`), e.g. for a client that calls a version's Service directly, or, with "
            "`operator.gatewayAPI`, the pods of the Gateway API data plane that routes the "
            "models. With `operator.gatewayAPI` the operator's pods are admitted too (an "
            "analysis reads the sidecars).",
            objects(),
        ),
        Value(
            "gatewayAdminFrom",
            [],
            "More peers admitted to the gateway's admin port (NetworkPolicyPeer objects: "
            "`podSelector`, `namespaceSelector`, `ipBlock`), e.g. the operator's pods of another "
            "release when this one has `operator.enabled: false`. Each one named reads every "
            "version's name.",
            objects(),
        ),
    ),
    description="The NetworkPolicies over the managed model pods of the release namespace and "
    "over the gateway's pods.",
)

MONITORING = Group(
    "monitoring",
    (
        Value(
            "additionalLabels",
            {"release": "kube-prometheus-stack"},
            "Labels added to the PodMonitor, ServiceMonitor and PrometheusRule. "
            "kube-prometheus-stack selects these by `release: <its release name>`; set it to "
            "yours.",
            string_map(),
        ),
        Group(
            "podMonitor",
            (
                *scrape(
                    "Create a PodMonitor that scrapes every sidecar (needs the Prometheus "
                    "Operator CRDs)."
                ),
                Value(
                    "port",
                    "http",
                    "Name of the sidecar's container port that serves /metrics in managed pods.",
                    string(min_length=1),
                ),
                Value(
                    "selector",
                    {
                        "matchLabels": {"app.kubernetes.io/managed-by": "modelroll-operator"},
                        "matchExpressions": [
                            {"key": "modelroll.io/model", "operator": "Exists"},
                            {"key": "modelroll.io/version", "operator": "Exists"},
                        ],
                    },
                    "Which pods are model pods with a sidecar: the labels the operator puts on "
                    "them.",
                    obj(),
                ),
                Value(
                    "namespaceSelector",
                    {},
                    "Namespaces to look for model pods in (empty: the operator's "
                    "`watchNamespaces`, or every namespace when that is empty).",
                    obj(),
                ),
            ),
        ),
        Group(
            "serviceMonitor",
            scrape(
                "Create a ServiceMonitor that scrapes the gateway on its admin port, through the "
                "Service `<fullname>-gateway-admin` (needs the Prometheus Operator CRDs)."
            ),
        ),
        Group(
            "operatorPodMonitor",
            scrape(
                "Create a PodMonitor that scrapes the operator's canary-analysis metrics on "
                "`operator.metricsPort` (needs the Prometheus Operator CRDs). It honors the "
                "series' own `namespace` label: the canary's, not the operator's."
            ),
        ),
        Group(
            "prometheusRule",
            (
                Value(
                    "enabled",
                    False,
                    "Create a PrometheusRule with per-version recording rules and alerts.",
                    boolean(),
                ),
                Value(
                    "window",
                    "5m",
                    "Range of the rates and quantiles the rules compute.",
                    duration(),
                ),
                Value(
                    "errorCodes",
                    "5..|422",
                    "Response codes that count as a version's errors (a regex on the `code` "
                    "label): server errors and items the model rejected.",
                    string(min_length=1),
                ),
                Value("additionalAlertLabels", {}, "Labels added to every alert.", string_map()),
                alert(
                    "errorRatio",
                    Value(
                        "threshold",
                        0.05,
                        "Alert when a version's error ratio stays above this fraction.",
                        positive(maximum=1),
                    ),
                    "5m",
                    "critical",
                ),
                alert(
                    "latency",
                    Value(
                        "p99SloSeconds",
                        1,
                        "Alert when a version's p99 request latency stays above this many "
                        "seconds (the SLO).",
                        positive(),
                    ),
                    "10m",
                    "warning",
                ),
                alert(
                    "timeToFirstToken",
                    Value(
                        "p99SloSeconds",
                        2,
                        "Alert when a chat LLM version's (`spec.protocol: OpenAI`) p99 time to "
                        "first token, measured at its sidecars, stays above this many seconds "
                        "(the SLO).",
                        positive(),
                    ),
                    "10m",
                    "warning",
                ),
                alert(
                    "queueSaturation",
                    Value(
                        "depth",
                        800,
                        "Alert when a version's queue holds more than this many requests (the "
                        "sidecar's `--max-queue-size` default is 1024), or when it turns "
                        "requests away with 429...",
                        integer(1),
                    ),
                    "5m",
                    "warning",
                ),
            ),
        ),
        Group(
            "dashboard",
            (
                Value(
                    "enabled",
                    False,
                    "Create a ConfigMap holding the Grafana dashboard, for Grafana's dashboard "
                    "sidecar.",
                    boolean(),
                ),
                Value(
                    "namespace",
                    "",
                    "Namespace of the dashboard ConfigMap (default: the release namespace).",
                    string(),
                ),
                Value(
                    "labels",
                    {"grafana_dashboard": "1"},
                    "Labels on the dashboard ConfigMap; Grafana's sidecar loads ConfigMaps "
                    "labelled so.",
                    string_map(),
                ),
                Value(
                    "annotations",
                    {},
                    "Annotations on the dashboard ConfigMap (e.g. `grafana_folder`).",
                    string_map(),
                ),
            ),
        ),
    ),
)

SCALED_OBJECTS = next(p for p in PERMISSIONS if p.feature is Feature.AUTOSCALER)
"""The operator's rights on KEDA's ScaledObjects, with autoscaling.keda."""
KEDA_RESOURCES = {"requests": {"cpu": "100m", "memory": "100Mi"}, "limits": {"memory": "1000Mi"}}
"""KEDA's own manifests' requests and memory limit (config/manager and config/metrics-server)."""

AUTOSCALING = Group(
    "autoscaling",
    (
        Group(
            "keda",
            (
                Value(
                    "enabled",
                    False,
                    "Autoscale the ModelVersions with `spec.scaling` through KEDA "
                    "(`--autoscaler keda`): the operator writes a ScaledObject per such version, "
                    f"which KEDA turns into a HorizontalPodAutoscaler ("
                    f"{rights(SCALED_OBJECTS.verbs, SCALED_OBJECTS)} where its other rules are "
                    "granted). Needs KEDA in the cluster (a KEDA 2.x of its own, or `install`) "
                    "and `autoscaling.prometheusUrl`. Off, a version with `spec.scaling` says in "
                    "its Autoscaling condition that nothing scales it, and keeps "
                    "`spec.replicas`.",
                    boolean(),
                ),
                Value(
                    "install",
                    False,
                    "Install KEDA with the chart, for `enabled`: its operator and metrics "
                    "adapter (built by modelroll from KEDA's Go module) in the release "
                    "namespace, its CRDs (kept on uninstall), and the APIService "
                    "`v1beta1.external.metrics.k8s.io` that serves its metrics to the "
                    "HorizontalPodAutoscalers. A cluster has one such APIService: with a KEDA "
                    "installed already, leave this off. Refused without `enabled`.",
                    boolean(),
                ),
                image(
                    "KEDA",
                    "ghcr.io/modelroll/modelroll-keda",
                    "Image holding KEDA's operator (`/keda-operator`) and metrics adapter "
                    "(`/keda-adapter`), built by `make images`.",
                ),
                Group(
                    "operator",
                    (
                        Value(
                            "resources",
                            KEDA_RESOURCES,
                            "KEDA operator resource requests and limits.",
                            obj(),
                        ),
                    ),
                    description="KEDA's operator: it turns ScaledObjects into "
                    "HorizontalPodAutoscalers and queries their triggers.",
                ),
                Group(
                    "adapter",
                    (
                        Value(
                            "resources",
                            KEDA_RESOURCES,
                            "KEDA metrics adapter resource requests and limits.",
                            obj(),
                        ),
                    ),
                    description="KEDA's metrics adapter: the API server behind "
                    "`v1beta1.external.metrics.k8s.io`.",
                ),
                Value(
                    "logLevel", "info", "KEDA's log level.", string(enum=("debug", "info", "error"))
                ),
            ),
            description="KEDA, which serves the sidecars' metrics to HorizontalPodAutoscalers.",
        ),
        Value(
            "prometheusUrl",
            "",
            "The Prometheus that scrapes the sidecars (`monitoring.podMonitor`), which the "
            "autoscalers' queries read (`--prometheus-url`), e.g. "
            "`http://prometheus-operated.monitoring.svc:9090`: from KEDA's operator pod. A "
            "platform setting: no namespace's ModelVersion chooses it.",
            string(pattern="^(https?://[^/?#@]+(/[^?#]*)?)?$", max_length=2048),
        ),
    ),
    description="Autoscaling of ModelVersions on their serving signals (`spec.scaling`).",
)


VALUES: tuple[Node, ...] = (
    Value(
        "global",
        None,
        "Global values shared with subcharts (when modelroll is a dependency).",
        obj(),
    ),
    Value(
        "nameOverride",
        "",
        "Override the chart name used in resource names and the `app.kubernetes.io/name` label.",
        string(),
    ),
    Value(
        "fullnameOverride",
        "",
        "Override the full name (`<release>-<chart>` by default) that prefixes every resource.",
        string(),
    ),
    Value("commonLabels", {}, "Labels added to every resource the chart creates.", string_map()),
    Value(
        "imagePullSecrets",
        [],
        "Secrets for pulling the operator, gateway and sidecar images from a private registry.",
        objects(),
    ),
    Value(
        "podSecurityContext",
        {
            "runAsNonRoot": True,
            "runAsUser": 10001,
            "runAsGroup": 10001,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "Pod security context for the operator and gateway pods: non-root, with the runtime's "
        "default seccomp profile.",
        obj(),
    ),
    Value(
        "containerSecurityContext",
        {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        },
        "Container security context for the operator and gateway: no privilege escalation, no "
        "capabilities, and a read-only root filesystem (each pod gets a writable emptyDir at "
        "/tmp).",
        obj(),
    ),
    OPERATOR,
    GATEWAY,
    SIDECAR,
    AUTOSCALING,
    NETWORK_POLICY,
    MONITORING,
)
"""Every value of the chart, in values.yaml's order."""

DEFINITIONS = {
    "labelSelector": {
        "type": "object",
        "description": "A Kubernetes LabelSelector; an unknown key is refused, since a selector "
        "that loses it selects more.",
        "additionalProperties": False,
        "properties": {
            "matchLabels": string_map(),
            "matchExpressions": array(
                {
                    "type": "object",
                    "additionalProperties": False,
                    "required": ["key", "operator"],
                    "properties": {
                        "key": string(min_length=1),
                        "operator": string(enum=("In", "NotIn", "Exists", "DoesNotExist")),
                        "values": array(string()),
                    },
                }
            ),
        },
    }
}
