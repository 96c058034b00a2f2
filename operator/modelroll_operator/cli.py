"""`modelroll-operator`: run the operator. Every flag can also be set as MODELROLL_<FLAG>."""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
from collections.abc import Mapping, Sequence
from pathlib import Path

import kopf

from modelroll_common.flags import EnvArgumentParser, port_number, positive_int, show_default
from modelroll_common.kube import KubeConfigError, connect

from . import handlers  # importing it registers the kopf handlers
from .analysis.access import parse_url
from .config import (
    AUTOSCALERS,
    DEFAULT_SIDECAR_IMAGE,
    SIDECAR_RESOURCES,
    OperatorConfig,
    served_namespaces,
)
from .pod_security import DEFAULT_LEVEL, LEVELS
from .spec import SpecError, parse_resources

DEFAULT_LIVENESS = "http://0.0.0.0:8081/healthz"
"""kopf's liveness endpoint (--liveness), on every address so that the kubelet reaches it; port
8081 is the one the chart's probe names."""
DEFAULT_METRICS_PORT = 8082
"""Next to the liveness probe's 8081 (the gateway listens on 8080)."""


def resources(text: str) -> dict[str, dict[str, int | str]]:
    """--sidecar-resources: a container's resources as JSON."""
    try:
        return parse_resources(json.loads(text), "--sidecar-resources")
    except (ValueError, SpecError) as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def url_prefix(text: str) -> str:
    """--analysis-url-prefix: an http(s) URL with a host, no credentials and no query."""
    try:
        parse_url(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc
    return text


def build_parser(environ: Mapping[str, str] | None = None) -> EnvArgumentParser:
    """The operator's flags; each falls back on its MODELROLL_* variable in ``environ``
    (default: the process environment)."""
    p = EnvArgumentParser(
        prog="modelroll-operator",
        description="Reconcile ModelVersions: routing weights into each namespace's "
        "modelroll-routes ConfigMap, managed versions into Deployments and Services. Every flag "
        "can also be set as MODELROLL_<FLAG> in the environment (a repeatable flag's as a "
        "comma-separated list, a switch's as 1/0, true/false, yes/no or on/off); a flag "
        "replaces its variable.",
        environ=environ,
    )
    scope = p.add_mutually_exclusive_group()
    show_default(
        scope.add_argument(
            "-n",
            "--namespace",
            action="append",
            default=[],
            help="serve only this namespace; repeatable; globs allowed",
        ),
        "all namespaces",
    )
    scope.add_argument(
        "-A",
        "--all-namespaces",
        action="store_true",
        help="serve every namespace (what the operator does without --namespace; excludes it)",
    )
    p.add_argument(
        "--sidecar-image",
        default=DEFAULT_SIDECAR_IMAGE,
        help="the batching sidecar's image in managed pods",
    )
    p.add_argument(
        "--sidecar-resources",
        type=resources,
        default=json.dumps(SIDECAR_RESOURCES, separators=(",", ":")),
        metavar="JSON",
        help="the batching sidecar's resources in managed pods, as a container's resources "
        "in JSON, unless a version sets spec.sidecar.resources; its requests are raised to its "
        "limits when the model container's requests equal its limits for cpu and memory (a "
        "Guaranteed pod). With limits, a namespace whose ResourceQuota covers limits.cpu "
        "admits the pods",
    )
    p.add_argument(
        "--drain-timeout-s",
        type=positive_int,
        default=30,
        help="the sidecar's --drain-timeout-s in managed pods unless a version sets "
        "spec.sidecar.drainTimeoutS; pods get 15 s more as grace period",
    )
    show_default(
        p.add_argument(
            "--kubeconfig",
            type=Path,
            help="kubeconfig file, read as kubectl reads it (contexts, certificates, tokens, "
            "exec and auth-provider plugins); unusable credentials exit 2 with the reason",
        ),
        "$KUBECONFIG, else ~/.kube/config, else the in-cluster service account",
    )
    p.add_argument(
        "--liveness",
        "--liveness-endpoint",
        dest="liveness",
        default=DEFAULT_LIVENESS,
        metavar="URL",
        help="serve kopf's liveness probe at this URL (address and path); '' for none",
    )
    p.add_argument(
        "--metrics-port",
        type=port_number,
        default=DEFAULT_METRICS_PORT,
        metavar="PORT",
        help="serve Prometheus metrics (the canary analyses') at http://0.0.0.0:PORT/metrics; "
        "0 for none. A port that cannot be bound stops the operator at startup",
    )
    peering = p.add_mutually_exclusive_group()
    show_default(
        peering.add_argument(
            "--peering",
            metavar="NAME",
            help="run with kopf peering under this name, so that of several replicas only one "
            "is active (needs the kopf peering CRDs, charts/modelroll/crds/kopf-peering.yaml)",
        ),
        "none: standalone",
    )
    peering.add_argument(
        "--standalone",
        action="store_true",
        help="no peering: this replica acts alone (what it does without --peering; excludes it)",
    )
    show_default(
        p.add_argument(
            "--priority",
            type=int,
            help="peering priority: the replica with the highest one is active (kopf pauses "
            "every replica when the highest is shared)",
        ),
        # Replicas of equal priority would all pause.
        "a random number when peering, else 0",
    )
    p.add_argument(
        "--gateway-api",
        action="store_true",
        help="also route models by Gateway API HTTPRoutes: a model whose namespace holds an "
        "HTTPRoute labelled modelroll.io/model=<model> gets its weights written into that "
        "route's backendRefs instead of the routes ConfigMap (needs the Gateway API CRDs)",
    )
    show_default(
        p.add_argument(
            "--analysis-url-prefix",
            action="append",
            type=url_prefix,
            default=[],
            metavar="URL",
            help="let canary analyses read metrics URLs (spec.analysis.metrics.gateway.url, "
            "prometheus.url) under this prefix, for any namespace's analyses; repeatable. A URL "
            "is under a prefix when its scheme and host are the prefix's, its port too unless "
            "the prefix names none, and its path is the prefix's or below it: e.g. "
            "http://prometheus-operated.monitoring.svc:9090/ for a shared Prometheus",
        ),
        "none: Services of the version's namespace only (<service>.<namespace>.svc)",
    )
    show_default(
        p.add_argument(
            "--analysis-gateway-namespace",
            action="append",
            default=[],
            metavar="NAMESPACE",
            help="let canary analyses of every namespace list and read the gateway pods of "
            "this namespace (spec.analysis.metrics.gateway.namespace); repeatable",
        ),
        "none: the version's own namespace only",
    )
    p.add_argument(
        "--pod-security",
        choices=LEVELS,
        default=DEFAULT_LEVEL,
        help="what a managed version's spec.server may give its pod: baseline refuses what "
        'Pod Security "baseline" forbids (privileged or hostProcess containers, added '
        "capabilities beyond the runtime's defaults, hostPath volumes, host ports, hostIPC, "
        "probe and lifecycle hosts, unconfined seccomp or AppArmor, custom SELinux options, an "
        "unmasked /proc), whatever the namespace's own Pod Security level: the version's "
        "InvalidSpec names each field and its control, and nothing is applied; privileged "
        "refuses none of it",
    )
    p.add_argument(
        "--scale-before-shift",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="give a managed version whose share of its model's traffic rises the ready "
        "replicas that share needs before its new weight goes into the route, and keep a "
        "version whose share fell at its replicas for its spec.scaleDownDelaySeconds; "
        "--no-scale-before-shift moves weights at once and leaves replicas to spec.replicas",
    )
    p.add_argument(
        "--autoscaler",
        choices=AUTOSCALERS,
        default="none",
        help="what turns spec.scaling into a HorizontalPodAutoscaler: keda (the operator writes "
        "a KEDA ScaledObject per version, whose Prometheus trigger queries --prometheus-url); "
        "none: a version with spec.scaling says in its Autoscaling condition that nothing "
        "scales it",
    )
    show_default(
        p.add_argument(
            "--prometheus-url",
            type=url_prefix,
            metavar="URL",
            help="the Prometheus that scrapes the sidecars, which the autoscalers' triggers "
            "query (with --autoscaler keda)",
        ),
        "none",
    )
    p.add_argument(
        "--workers",
        type=positive_int,
        default=4,
        help="models reconciled at the same time (a model is never reconciled twice at once)",
    )
    p.add_argument(
        "--log-format",
        choices=["json", "plain", "full"],
        default="json",
        help="json (one object per line), plain (messages) or full (with time and level)",
    )
    p.add_argument(
        "--log-level",
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        type=str.upper,
        default="INFO",
        help="INFO logs every change the operator makes; DEBUG adds kopf's handler calls",
    )
    return p


def parse_config(args: argparse.Namespace) -> OperatorConfig:
    peering = None if args.standalone else args.peering or None
    priority = args.priority
    if priority is None:
        # kopf pauses every replica when the highest priority is shared; replicas of one
        # Deployment all get the same flags, so each draws its own.
        priority = random.SystemRandom().randint(1, 1_000_000) if peering else 0
    return OperatorConfig(
        sidecar_image=args.sidecar_image,
        sidecar_resources=args.sidecar_resources,
        drain_timeout_s=args.drain_timeout_s,
        kubeconfig=args.kubeconfig,
        workers=args.workers,
        metrics_port=args.metrics_port,
        peering=peering,
        priority=int(priority),
        gateway_api=args.gateway_api,
        pod_security=args.pod_security,
        analysis_url_prefixes=tuple(args.analysis_url_prefix),
        analysis_gateway_namespaces=tuple(args.analysis_gateway_namespace),
        scale_before_shift=args.scale_before_shift,
        autoscaler=args.autoscaler,
        prometheus_url=args.prometheus_url,
    )


def main(argv: Sequence[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    config = parse_config(args)
    if config.autoscaler != "none" and config.prometheus_url is None:
        parser.error(f"--autoscaler {config.autoscaler} needs --prometheus-url")
    if config.kubeconfig is not None:
        # kopf's own login reads $KUBECONFIG: both clients then use the same credentials.
        os.environ["KUBECONFIG"] = str(config.kubeconfig)
    try:
        # Unusable credentials (a failing exec plugin, no kubeconfig outside a pod) end the
        # process with the reason, rather than a startup handler retried every minute.
        client = connect(config.kubeconfig).client
    except KubeConfigError as exc:
        parser.exit(2, f"modelroll-operator: {exc}\n")
    log_format = {
        "json": kopf.LogFormat.JSON,
        "plain": kopf.LogFormat.PLAIN,
        "full": kopf.LogFormat.FULL,
    }[args.log_format]
    kopf.configure(log_format=log_format, log_prefix=None)
    logging.getLogger().setLevel(args.log_level)
    if args.log_level != "DEBUG":
        # kopf reports every handler call at INFO; the operator logs what it changed itself.
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    namespaces = [] if args.all_namespaces else list(args.namespace or [])
    if config.gateway_api:
        handlers.register_gateway_api()
    kopf.run(
        clusterwide=not namespaces,
        namespaces=namespaces,
        # Also a namespace being deleted when the operator starts: its ModelVersions wait for
        # our finalizer to go (see served_namespaces).
        insights=served_namespaces(namespaces) if namespaces else None,
        standalone=config.peering is None,
        peering_name=config.peering,
        priority=config.priority,
        liveness_endpoint=args.liveness or None,
        memo=kopf.Memo(config=config, client=client),
    )


if __name__ == "__main__":
    main()
