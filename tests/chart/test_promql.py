"""Every PromQL expression the chart ships, evaluated by a real Prometheus against real metrics.

A gateway (routes from a file) splits load between two versions of one model, `stable` and
`canary`, each a sidecar in front of a demo model; the canary's model fails a share of its items.
The same gateway splits a light load of streamed chat completions between two versions of a chat
model, each a sidecar in `--protocol openai` mode in front of a demo LLM engine; the canary's
engine is slower per iteration, so its time to first token is higher. The operator's metrics of
the canary's analysis (analysis/exporter.py, fed a judged state) are served next to them.
Prometheus (built by `make prometheus`) scrapes them all on loopback every second and evaluates
the chart's PrometheusRule. Then every query of the Grafana dashboard, with its template
variables substituted the way Grafana does, and every rule expression must parse and return
series for both versions (the LLM row's: the chat model's; the analysis and shadow queries:
the canary alone, which also shadows the stable); the canary's error ratio must show and the
stable's must be zero, and the chat canary's time to first token must show above the chat
stable's.
"""

from __future__ import annotations

import http.client
import json
import math
import re
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry

from modelroll_devcluster import MissingBinaryError
from modelroll_devcluster.chat import ChatLoad
from modelroll_devcluster.prometheus import Prometheus as PrometheusServer
from modelroll_devcluster.prometheus import PrometheusError, Series, find_tool, static_job
from modelroll_operator.analysis import machine, statistics
from modelroll_operator.analysis.exporter import PREFIX as ANALYSIS_PREFIX
from modelroll_operator.analysis.exporter import AnalysisMetrics, serve
from modelroll_operator.analysis.phases import Reason
from modelroll_operator.analysis.spec import parse_analysis
from modelroll_operator.analysis.state import AnalysisState, CheckState
from tests.support.chart import CHART, Helm, one
from tests.support.processes import VENV_BIN, Proc, free_port, start_proc, wait_http

NAMESPACE = "models"
MODEL = "sentiment"
VERSIONS = ("stable", "canary")
WEIGHTS = {"stable": 3, "canary": 1}
CANARY_ERROR_RATE = 0.3
CHAT_MODEL = "chat"
CHAT_VERSIONS = ("stable", "canary")
CHAT_WEIGHTS = {"stable": 1, "canary": 1}
CHAT_STEP_MS = {"stable": 5, "canary": 60}
"""The demo engines' iteration cost in ms: a first token takes one iteration or two (the one
running when the request arrives, then the one that admits it), so the canary's is far above
the stable's."""
LLM_METRICS = re.compile(r"\bmodelroll_(gateway_)?llm_")
"""The series of chat LLM versions: their queries select the chat model."""
ANALYSED = {"canary"}
"""The versions with an analysis: the operator exports series for them alone."""
SHADOW_PERCENT = 50
"""The canary also shadows: half the requests the stable answers are copied to it."""
SHADOWS = {"canary"}
"""The versions with shadow series (copies of the stable's requests)."""
SHADOW_PREFIX = "modelroll_gateway_shadow_"
SCRAPE_INTERVAL = "1s"
# What Grafana substitutes: $__rate_interval is at least four scrape intervals; a multi-value
# variable with several values selected becomes a regex group.
VARIABLES = {
    "namespace": NAMESPACE,
    "model": MODEL,
    "version": "(" + "|".join(VERSIONS) + ")",
    "__rate_interval": "10s",
}
SETTLE_TIMEOUT = 60.0
"""Seconds an expression may take to return every version once the load runs."""


def prometheus_binary(name: str) -> str:
    try:
        return str(find_tool(name))
    except MissingBinaryError as err:
        pytest.fail(str(err), pytrace=False)


# --- what the chart ships ----------------------------------------------------------------------


def dashboard() -> dict[str, Any]:
    board: dict[str, Any] = json.loads((CHART / "dashboards" / "modelroll.json").read_text())
    return board


@dataclass(frozen=True)
class Query:
    """One dashboard target."""

    panel: str
    ref: str
    expr: str
    legend: str
    repeated: bool

    @property
    def id(self) -> str:
        return re.sub(r"[^A-Za-z0-9]+", "-", f"{self.panel} {self.ref}").strip("-").lower()


def dashboard_queries() -> list[Query]:
    return [
        Query(p["title"], t["refId"], t["expr"], t.get("legendFormat", ""), "repeat" in p)
        for p in dashboard()["panels"]
        for t in p.get("targets", [])
    ]


def substitute(expr: str, variables: dict[str, str] = VARIABLES) -> str:
    """Replace $var and ${var} as Grafana does, and insist that nothing is left over."""

    def value(match: re.Match[str]) -> str:
        name = match["braced"] or match["plain"]
        assert name in variables, f"unknown variable ${name} in {expr}"
        return variables[name]

    out = re.sub(r"\$(?:\{(?P<braced>\w+)\}|(?P<plain>\w+))", value, expr)
    assert "$" not in out, out
    return out


def rendered_rules(helm: Helm) -> dict[str, Any]:
    """The PrometheusRule's groups as a Prometheus rule file, with the default values."""
    docs = helm.template("--set", "monitoring.prometheusRule.enabled=true")
    groups: dict[str, Any] = {"groups": one(docs, "PrometheusRule")["spec"]["groups"]}
    return groups


def as_bool(expr: str) -> str:
    """An alert expression whose comparisons with a threshold keep every series (0 or 1)."""
    out, count = re.subn(r" (>|<|>=|<=|==|!=) (?=[0-9])", r" \1 bool ", expr)
    assert count, f"no comparison with a threshold in {expr}"
    return out


# --- the running stack -------------------------------------------------------------------------


class Load:
    """A bounded load on the gateway: a few threads, each pacing its own keep-alive connection."""

    def __init__(self, port: int, threads: int = 4, pause: float = 0.01, limit: float = 300.0):
        self.port = port
        self.pause = pause
        self.deadline = time.monotonic() + limit
        self.codes: Counter[int] = Counter()
        self.versions: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(threads)]

    def __enter__(self) -> Load:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(10)

    def _run(self) -> None:
        body = json.dumps({"payload": "a fine day for a canary"})
        headers = {"Content-Type": "application/json"}
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        while not self._stop.is_set() and time.monotonic() < self.deadline:
            try:
                conn.request("POST", f"/v1/models/{MODEL}/infer", body, headers)
                response = conn.getresponse()
                response.read()
            except OSError:
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
                time.sleep(0.1)
                continue
            with self._lock:
                self.codes[response.status] += 1
                self.versions[response.getheader("X-Modelroll-Version", "")] += 1
            self._stop.wait(self.pause)
        conn.close()


@dataclass
class Prometheus:
    """The shared Prometheus (modelroll_devcluster.prometheus), with the tests' assertions."""

    server: PrometheusServer

    def api(self, path: str, **params: str) -> Any:
        return self.server.api(path, **params)

    def query(self, expr: str) -> Series:
        """An instant query; fails the test if Prometheus cannot parse or evaluate it."""
        doc = self.api("/api/v1/query", query=expr)
        assert doc["status"] == "success", f"{expr}\n{doc.get('errorType')}: {doc.get('error')}"
        assert doc["data"]["resultType"] == "vector", expr
        result: Series = doc["data"]["result"]
        return result

    def until(
        self, expr: str, ok: Callable[[Series], bool], timeout: float = SETTLE_TIMEOUT
    ) -> Series:
        """Query until `ok(result)`; fail with the last result after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            result = self.query(expr)
            if ok(result):
                return result
            if time.monotonic() > deadline:
                pytest.fail(f"after {timeout:.0f}s, {expr}\nreturned {result}")
            time.sleep(0.5)


def versions_of(result: Series) -> set[str]:
    return {s["metric"].get("version", "") for s in result}


def values_by_version(result: Series) -> dict[str, float]:
    out: dict[str, float] = {}
    for series in result:
        version = series["metric"]["version"]
        assert version not in out, f"two series for {version}: {result}"
        out[version] = float(series["value"][1])
    return out


def every_version(result: Series) -> bool:
    return versions_of(result) >= set(VERSIONS)


def is_llm(expr: str) -> bool:
    return bool(LLM_METRICS.search(expr))


def variables_for(expr: str) -> dict[str, str]:
    """The variables a person looking at the query's panel selects: the chat model for the LLM
    row, the batch model for every other panel."""
    if not is_llm(expr):
        return VARIABLES
    return {**VARIABLES, "model": CHAT_MODEL, "version": "(" + "|".join(CHAT_VERSIONS) + ")"}


def expected_versions(expr: str) -> set[str]:
    """Whose series a dashboard query shows: the analysed versions' for the operator's metrics,
    the shadows' for the shadow metrics, the chat versions' for the LLM metrics."""
    if ANALYSIS_PREFIX in expr:
        return ANALYSED
    if SHADOW_PREFIX in expr:
        return SHADOWS
    return set(CHAT_VERSIONS) if is_llm(expr) else set(VERSIONS)


def models_and_versions(result: Series) -> set[tuple[str, str]]:
    return {(s["metric"].get("model", ""), s["metric"].get("version", "")) for s in result}


def covers(expected: set[tuple[str, str]]) -> Callable[[Series], bool]:
    """Whether a result holds a series for each (model, version) expected."""
    return lambda result: models_and_versions(result) >= expected


def expected_pairs(expr: str) -> set[tuple[str, str]]:
    """The (model, version) series a rule records: every sidecar exports the batch series (an
    OpenAI sidecar counts its requests too), only the chat versions' the LLM series."""
    chat = {(CHAT_MODEL, v) for v in CHAT_VERSIONS}
    return chat if is_llm(expr) else chat | {(MODEL, v) for v in VERSIONS}


def analysed_state() -> AnalysisState:
    """The canary's analysis as the operator exports it mid-step: both checks judged, their
    ratios known."""
    spec = parse_analysis({"steps": [{"weight": 25}, {"weight": 50}]})
    assert spec is not None
    state = machine.start(spec, "stable", WEIGHTS["stable"], time.time(), "h").state
    checks = {}
    for name, (canary, baseline, verdict) in {
        "errors": ((100, 30), (300, 3), statistics.FAIL),
        "latency": ((100, 2), (300, 5), statistics.INCONCLUSIVE),
    }.items():
        evidence = statistics.update(
            statistics.new_evidence(), 1.5, statistics.Counts(*canary), statistics.Counts(*baseline)
        )
        checks[name] = CheckState(evidence, verdict)
    return replace(state, reason=Reason.INSUFFICIENT_DATA, checks=checks)


@dataclass
class Stack:
    prometheus: Prometheus
    load: Load
    chat_load: ChatLoad
    procs: list[Proc] = field(default_factory=list)


def _start(name: str, argv: list[str], log_dir: Path, procs: list[Proc]) -> Proc:
    proc = start_proc(name, argv, log_dir / f"{name}.log")
    procs.append(proc)
    return proc


@pytest.fixture(scope="module")
def stack(helm: Helm, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """Gateway, two versions of a batch model and two of a chat model, and Prometheus on
    loopback, with load on both models running for the module."""
    prometheus_binary("prometheus")
    prometheus_binary("promtool")
    tmp = tmp_path_factory.mktemp("promql")
    procs: list[Proc] = []
    server: PrometheusServer | None = None
    operator_server = None
    try:
        sidecars: list[str] = []

        def version_behind_sidecar(
            name: str, server: list[str], sidecar_flags: list[str], weight: int
        ) -> dict[str, Any]:
            """Start a model server and its sidecar; the version's route."""
            model_port, sidecar_port = free_port(), free_port()
            model = _start(
                f"model-{name}", [*server, f"--port={model_port}", "--seed=7"], tmp, procs
            )
            wait_http(f"http://127.0.0.1:{model_port}/readyz", model)
            sidecar = _start(
                f"sidecar-{name}",
                [
                    str(VENV_BIN / "modelroll-sidecar"),
                    f"--port={sidecar_port}",
                    f"--upstream=http://127.0.0.1:{model_port}",
                    "--host=127.0.0.1",
                    *sidecar_flags,
                ],
                tmp,
                procs,
            )
            wait_http(f"http://127.0.0.1:{sidecar_port}/readyz", sidecar)
            sidecars.append(f"127.0.0.1:{sidecar_port}")
            return {
                "name": name.rsplit("-", 1)[-1],
                "weight": weight,
                "endpoint": f"http://127.0.0.1:{sidecar_port}",
                **({"shadow": SHADOW_PERCENT} if name == f"{MODEL}-canary" else {}),
            }

        routes = [
            version_behind_sidecar(
                f"{MODEL}-{version}",
                [
                    str(VENV_BIN / "modelroll-demo-model"),
                    "--fixed-ms=1",
                    "--per-token-ms=0.05",
                    f"--error-rate={CANARY_ERROR_RATE if version == 'canary' else 0.0}",
                ],
                [f"--model={MODEL}", f"--version={version}", "--max-wait-ms=2"],
                WEIGHTS[version],
            )
            for version in VERSIONS
        ]
        chat_routes = [
            version_behind_sidecar(
                f"{CHAT_MODEL}-{version}",
                [
                    str(VENV_BIN / "modelroll-demo-llm"),
                    f"--served-model-name={CHAT_MODEL}",
                    f"--step-ms={CHAT_STEP_MS[version]}",
                    "--step-ms-per-seq=0.1",
                ],
                [
                    "--protocol=openai",
                    f"--model={CHAT_MODEL}",
                    f"--version={version}",
                    "--max-in-flight=16",
                ],
                CHAT_WEIGHTS[version],
            )
            for version in CHAT_VERSIONS
        ]
        routes_file = tmp / "routes.json"
        routes_file.write_text(
            json.dumps(
                {
                    MODEL: {"model": MODEL, "versions": routes},
                    CHAT_MODEL: {"model": CHAT_MODEL, "versions": chat_routes},
                }
            )
        )
        gateway_port, admin_port = free_port(), free_port()
        gateway = _start(
            "gateway",
            [
                str(VENV_BIN / "modelroll-gateway"),
                f"--port={gateway_port}",
                f"--admin-port={admin_port}",
                "--host=127.0.0.1",
                f"--routes-file={routes_file}",
            ],
            tmp,
            procs,
        )
        wait_http(f"http://127.0.0.1:{gateway_port}/readyz", gateway)
        # The operator's series of the canary's analysis, served as the operator serves them.
        operator_registry = CollectorRegistry()
        analyses = AnalysisMetrics(operator_registry)
        analyses.observe(NAMESPACE, MODEL, "canary", analysed_state())
        analyses.decided(NAMESPACE, MODEL, "canary", "step")
        operator_port = free_port()
        operator_server = serve(operator_registry, operator_port, "127.0.0.1")

        # `namespace` is what the PodMonitor/ServiceMonitor add in a cluster; the operator's
        # series carry their own (its PodMonitor honors them). The gateway is scraped on its
        # admin port, as the ServiceMonitor does.
        server = PrometheusServer(
            tmp / "prometheus",
            [
                static_job("modelroll-sidecars", sidecars, namespace=NAMESPACE),
                static_job("modelroll-gateway", [f"127.0.0.1:{admin_port}"], namespace=NAMESPACE),
                static_job("modelroll-operator", [f"127.0.0.1:{operator_port}"]),
            ],
            rule_files=[write_rules(helm, tmp)],
            scrape_interval=SCRAPE_INTERVAL,
        )
        try:
            server.start()
        except PrometheusError as err:
            pytest.fail(str(err), pytrace=False)
        with (
            Load(gateway_port) as load,
            ChatLoad(
                f"http://127.0.0.1:{gateway_port}", CHAT_MODEL, concurrency=2, max_tokens=16
            ) as chat_load,
        ):
            yield Stack(Prometheus(server), load, chat_load, procs)
    finally:
        if server is not None:
            server.stop()
        if operator_server is not None:
            operator_server.shutdown()
            operator_server.server_close()
        for proc in reversed(procs):
            proc.stop()


# --- the rule file on its own ------------------------------------------------------------------


def write_rules(helm: Helm, directory: Path) -> Path:
    rules = directory / "rules.yaml"
    rules.write_text(yaml.safe_dump(rendered_rules(helm), sort_keys=False))
    return rules


def promtool(*args: str) -> str:
    """Run promtool; fail with its output unless it exits 0. Returns stdout and stderr."""
    result = subprocess.run(
        [prometheus_binary("promtool"), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    return output


def test_the_rule_file_passes_promtool_check_rules(helm: Helm, tmp_path: Path) -> None:
    output = promtool("check", "rules", str(write_rules(helm, tmp_path)))
    assert "SUCCESS: 10 rules found" in output


def test_the_error_alert_fires_for_the_failing_version_only(helm: Helm, tmp_path: Path) -> None:
    """`promtool test rules`: 20% errors on the canary for 10 minutes fire the alert after its
    `for`; the stable, without errors, never does."""
    rules = write_rules(helm, tmp_path)
    labels = f'namespace="{NAMESPACE}", model="{MODEL}"'
    series = [
        {
            "series": f'modelroll_requests_total{{{labels}, version="stable", code="200"}}',
            "values": "0+100x20",
        },
        {
            "series": f'modelroll_requests_total{{{labels}, version="stable", code="422"}}',
            "values": "0+0x20",
        },
        {
            "series": f'modelroll_requests_total{{{labels}, version="canary", code="200"}}',
            "values": "0+80x20",
        },
        {
            "series": f'modelroll_requests_total{{{labels}, version="canary", code="422"}}',
            "values": "0+20x20",
        },
    ]
    canary = {"namespace": NAMESPACE, "model": MODEL, "version": "canary", "severity": "critical"}
    # The annotations render with the alert's labels and value, as a person paged reads them.
    annotations = {
        "summary": "Version canary of model sentiment fails 20% of its requests.",
        "description": "More than 5% of the requests answered by version canary of model "
        "sentiment in namespace models over the last 5m were errors (codes matching 5..|422). "
        "Move its weight to another version, or roll it back.",
    }
    tests = {
        "rule_files": [str(rules)],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": series,
                "alert_rule_test": [
                    {
                        "eval_time": "3m",
                        "alertname": "ModelrollVersionErrorRatioHigh",
                        "exp_alerts": [],
                    },
                    {
                        "eval_time": "10m",
                        "alertname": "ModelrollVersionErrorRatioHigh",
                        "exp_alerts": [{"exp_labels": canary, "exp_annotations": annotations}],
                    },
                ],
            }
        ],
    }
    test_file = tmp_path / "test.yaml"
    test_file.write_text(yaml.safe_dump(tests, sort_keys=False))
    assert "SUCCESS" in promtool("test", "rules", str(test_file))


def ttft_buckets(labels: str, per_minute: dict[str, int]) -> list[dict[str, str]]:
    """Input series of the sidecar's time-to-first-token histogram: `per_minute` observations
    a minute up to each bucket's bound (cumulative, as Prometheus stores them)."""
    return [
        {
            "series": f'modelroll_llm_time_to_first_token_seconds_bucket{{{labels}, le="{le}"}}',
            "values": f"0+{count}x20",
        }
        for le, count in per_minute.items()
    ]


def test_the_time_to_first_token_alert_fires_for_the_slow_version_only(
    helm: Helm, tmp_path: Path
) -> None:
    """`promtool test rules`: a chat canary whose every first token takes 2.5 to 5 s (above the
    default 2 s SLO) for 20 minutes fires the alert after its `for`; the stable, whose first
    tokens all come within 250 ms, never does."""
    rules = write_rules(helm, tmp_path)
    labels = f'namespace="{NAMESPACE}", model="{CHAT_MODEL}"'
    series = ttft_buckets(
        f'{labels}, version="stable"', {"0.1": 30, "0.25": 60, "2.5": 60, "5.0": 60, "+Inf": 60}
    ) + ttft_buckets(
        f'{labels}, version="canary"', {"0.1": 0, "0.25": 0, "2.5": 0, "5.0": 10, "+Inf": 10}
    )
    canary = {
        "namespace": NAMESPACE,
        "model": CHAT_MODEL,
        "version": "canary",
        "severity": "warning",
    }
    # The canary's p99 falls in its (2.5, 5] bucket, 2.5 + 0.99 x 2.5 s; the stable's in its
    # (0.1, 0.25] bucket, which holds half its observations: 0.1 + 0.98 x 0.15 s.
    annotations = {
        "summary": "Version canary of model chat takes 4.975s to its first token (p99).",
        "description": "The p99 time to first token of version canary of model chat in namespace "
        "models, measured at its sidecars over 5m, is above the 2s SLO: its engine queues "
        "requests or prefills slowly. Add replicas, or move its weight to another version.",
    }
    alert = "ModelrollVersionTimeToFirstTokenHigh"
    record = "namespace_model_version:modelroll_llm_time_to_first_token_seconds:p99_rate5m"
    recorded = [
        {"labels": f'{record}{{{labels}, version="{version}"}}', "value": value}
        for version, value in (("canary", 4.975), ("stable", 0.247))
    ]
    tests = {
        "rule_files": [str(rules)],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": series,
                "promql_expr_test": [
                    {"expr": record, "eval_time": "10m", "exp_samples": recorded},
                ],
                "alert_rule_test": [
                    {"eval_time": "5m", "alertname": alert, "exp_alerts": []},
                    {
                        "eval_time": "15m",
                        "alertname": alert,
                        "exp_alerts": [{"exp_labels": canary, "exp_annotations": annotations}],
                    },
                ],
            }
        ],
    }
    test_file = tmp_path / "test.yaml"
    test_file.write_text(yaml.safe_dump(tests, sort_keys=False))
    assert "SUCCESS" in promtool("test", "rules", str(test_file))


# --- against the running stack -----------------------------------------------------------------


def test_the_load_reaches_both_versions_and_the_canary_fails_some(stack: Stack) -> None:
    deadline = time.monotonic() + SETTLE_TIMEOUT
    while time.monotonic() < deadline and not (
        stack.load.versions.keys() >= set(VERSIONS) and stack.load.codes[422] > 0
    ):
        time.sleep(0.2)
    assert stack.load.versions.keys() >= set(VERSIONS), stack.load.versions
    assert set(stack.load.codes) == {200, 422}, stack.load.codes


def test_the_chat_load_streams_whole_answers_from_both_chat_versions(stack: Stack) -> None:
    load = stack.chat_load
    deadline = time.monotonic() + SETTLE_TIMEOUT
    while time.monotonic() < deadline and not {s.version for s in load.records} >= set(
        CHAT_VERSIONS
    ):
        time.sleep(0.2)
    streams = load.records[:]
    assert {s.version for s in streams} == set(CHAT_VERSIONS)
    assert [s for s in streams if not s.complete] == []


@pytest.mark.parametrize(
    ("name", "expected"),
    [("namespace", {NAMESPACE}), ("model", {MODEL, CHAT_MODEL}), ("version", set(VERSIONS))],
)
def test_dashboard_variables_list_what_was_scraped(
    stack: Stack, name: str, expected: set[str]
) -> None:
    variable = next(v for v in dashboard()["templating"]["list"] if v["name"] == name)
    match = re.fullmatch(r"label_values\((?:(.+),\s*)?(\w+)\)", variable["definition"])
    assert match, variable["definition"]
    selector, label = match[1], match[2]
    assert variable["query"]["query"] == variable["definition"]
    deadline = time.monotonic() + SETTLE_TIMEOUT
    while True:
        params = {"match[]": substitute(selector)} if selector else {}
        doc = stack.prometheus.api(f"/api/v1/label/{label}/values", **params)
        assert doc["status"] == "success", doc
        if set(doc["data"]) >= expected or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert set(doc["data"]) == expected


@pytest.mark.parametrize("query", dashboard_queries(), ids=lambda q: q.id)
def test_every_dashboard_query_returns_series_for_both_versions(stack: Stack, query: Query) -> None:
    """Both versions; a query of the operator's analysis metrics, the canary alone; a query of the
    LLM row, both versions of the chat model."""
    variables = variables_for(query.expr)
    expr = substitute(query.expr, variables)
    expected = expected_versions(query.expr)
    result = stack.prometheus.until(expr, lambda r: versions_of(r) >= expected)
    assert versions_of(result) == expected, result
    # The legend names every series: each label it uses is on every series.
    for label in re.findall(r"\{\{\s*(\w+)\s*\}\}", query.legend):
        assert all(label in s["metric"] for s in result), f"legend {{{{{label}}}}} is empty"
    if query.repeated:
        # A panel repeated per version shows that version alone.
        single = substitute(query.expr, {**variables, "version": "canary"})
        assert versions_of(stack.prometheus.until(single, bool)) == {"canary"}


def test_the_error_ratio_panel_shows_the_canary_failing_and_the_stable_at_zero(
    stack: Stack,
) -> None:
    panels = [q for q in dashboard_queries() if q.panel.lower().startswith("error ratio")]
    assert len(panels) == 1
    expr = substitute(panels[0].expr)

    def settled(result: Series) -> bool:
        ratios = values_by_version(result) if every_version(result) else {}
        return bool(ratios) and ratios["canary"] > 0.1

    ratios = values_by_version(stack.prometheus.until(expr, settled))
    assert ratios["stable"] == 0.0
    assert 0.1 < ratios["canary"] < 0.5  # the demo model fails 30% of the canary's items


def test_the_padding_efficiency_panel_shows_no_padding_for_requests_of_one_length(
    stack: Stack,
) -> None:
    """Every request of the load has the same length: no batch pads, whatever its size."""
    (query,) = [q for q in dashboard_queries() if q.panel.startswith("Padding efficiency")]
    expr = substitute(query.expr)

    def settled(result: Series) -> bool:
        # 0/0 (NaN) until a version's first batch is inside the rate interval.
        values = values_by_version(result).values()
        return every_version(result) and not any(math.isnan(v) for v in values)

    efficiency = values_by_version(stack.prometheus.until(expr, settled))
    assert efficiency == {version: 1.0 for version in VERSIONS}


def test_configured_weights_and_the_share_the_gateway_sent_agree(stack: Stack) -> None:
    panel = [q for q in dashboard_queries() if q.panel.startswith("Configured weight share")]
    configured, sent = (substitute(q.expr) for q in sorted(panel, key=lambda q: q.ref))
    total = sum(WEIGHTS.values())
    expected = {v: w / total for v, w in WEIGHTS.items()}
    assert values_by_version(stack.prometheus.until(configured, every_version)) == expected
    shares = values_by_version(stack.prometheus.until(sent, every_version))
    for version, share in shares.items():
        assert share == pytest.approx(expected[version], abs=0.1), shares


def test_the_ttft_panels_show_the_slower_canary_above_the_stable(stack: Stack) -> None:
    """The chat canary's engine takes 60 ms an iteration against the stable's 5: its time to
    first token, p50 and p99, at the sidecars and at the gateway, shows above the stable's."""
    queries = [q for q in dashboard_queries() if "time to first token" in q.panel.lower()]
    assert {q.panel for q in queries} == {
        "Time to first token p50 / p99 by version",
        "Gateway time to first token p99 by version",
    }
    assert len(queries) == 3

    def canary_above(result: Series) -> bool:
        # NaN until a version's first stream is inside the rate interval.
        values = values_by_version(result)
        if not values.keys() >= set(CHAT_VERSIONS) or any(map(math.isnan, values.values())):
            return False
        return values["canary"] > values["stable"]

    for query in queries:
        expr = substitute(query.expr, variables_for(query.expr))
        # Within the settle timeout (a stable stream delayed by a busy machine may top the p99
        # for the length of a rate interval), else the last values fail the test.
        ttft = values_by_version(stack.prometheus.until(expr, canary_above))
        # One iteration of the canary's engine is 60 ms: its first token never comes sooner.
        assert ttft["canary"] >= 0.05, (query.panel, query.legend, ttft)


def rules_of(helm: Helm) -> list[dict[str, Any]]:
    return [rule for group in rendered_rules(helm)["groups"] for rule in group["rules"]]


def test_every_recording_rule_returns_and_records_both_versions(helm: Helm, stack: Stack) -> None:
    """Of both models; the LLM rules, of the chat model alone."""
    records = [r for r in rules_of(helm) if "record" in r]
    assert len(records) == 6
    for rule in records:
        expected = expected_pairs(rule["expr"])
        stack.prometheus.until(rule["expr"], covers(expected))
        # Prometheus evaluates the rule file itself, and records a series per version.
        result = stack.prometheus.until(rule["record"], covers(expected))
        assert models_and_versions(result) == expected, rule["record"]


def test_every_alert_expression_parses_and_measures_both_versions(helm: Helm, stack: Stack) -> None:
    alerts = [r for r in rules_of(helm) if "alert" in r]
    assert len(alerts) == 4
    for rule in alerts:
        stack.prometheus.query(rule["expr"])  # parses and evaluates
        expected = expected_pairs(rule["expr"])
        result = stack.prometheus.until(as_bool(rule["expr"]), covers(expected))
        assert models_and_versions(result) == expected, rule["alert"]


def test_the_error_ratio_alert_is_pending_for_the_canary_alone(helm: Helm, stack: Stack) -> None:
    alert = next(r for r in rules_of(helm) if r.get("alert") == "ModelrollVersionErrorRatioHigh")
    assert models_and_versions(stack.prometheus.until(alert["expr"], bool)) == {(MODEL, "canary")}
    pending = stack.prometheus.until('ALERTS{alertname="ModelrollVersionErrorRatioHigh"}', bool)
    assert models_and_versions(pending) == {(MODEL, "canary")}
    assert pending[0]["metric"]["alertstate"] == "pending"  # `for: 5m` has not passed yet
    assert pending[0]["metric"]["severity"] == "critical"


def test_prometheus_scraped_every_target(stack: Stack) -> None:
    result = stack.prometheus.until("up", lambda r: len(r) == 6)
    assert {s["metric"]["job"]: s["value"][1] for s in result} == {
        "modelroll-sidecars": "1",
        "modelroll-gateway": "1",
        "modelroll-operator": "1",
    }
    assert {s["value"][1] for s in result} == {"1"}
