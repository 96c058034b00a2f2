"""`modelroll-gateway` as a real process in front of a real sidecar and demo model."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

from tests.support.flags import help_entries
from tests.support.gateway import route
from tests.support.processes import Spawn, free_port


def _post(
    url: str, payload: object, headers: dict[str, str] | None = None
) -> tuple[int, str, dict[str, object]]:
    request = urllib.request.Request(  # noqa: S310 (loopback URL)
        url,
        data=json.dumps({"payload": payload}).encode(),
        headers={"Content-Type": "application/json", **(headers or {})},
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:  # noqa: S310
            return resp.status, resp.headers["X-Modelroll-Version"], json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        version = exc.headers["X-Modelroll-Version"]
        return exc.code, version, {"error": exc.read().decode(errors="replace")}


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:  # noqa: S310 (loopback URL)
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def _stable_v1(spawn: Spawn, *model_args: str) -> str:
    """The URL of a sidecar of version stable-v1 of model sentiment, in front of a demo model
    started with ``model_args``."""
    model_port, sidecar_port = free_port(), free_port()
    spawn(
        "modelroll-demo-model",
        f"--port={model_port}",
        *model_args,
        ready=f"http://127.0.0.1:{model_port}/readyz",
    )
    spawn(
        "modelroll-sidecar",
        f"--port={sidecar_port}",
        f"--upstream=http://127.0.0.1:{model_port}",
        "--model=sentiment",
        "--version=stable-v1",
        ready=f"http://127.0.0.1:{sidecar_port}/readyz",
    )
    return f"http://127.0.0.1:{sidecar_port}"


def test_the_gateway_command_routes_to_a_sidecar_and_stops_on_sigterm(
    spawn: Spawn, tmp_path: Path
) -> None:
    endpoint, gw_port = _stable_v1(spawn, "--fixed-ms=1"), free_port()
    routes = tmp_path / "routes.json"
    routes.write_text(json.dumps({"sentiment": route("sentiment", ("stable-v1", 1, endpoint))}))
    gateway = spawn(
        "modelroll-gateway",
        ready=f"http://127.0.0.1:{gw_port}/readyz",
        env={
            "MODELROLL_PORT": str(gw_port),
            "MODELROLL_ADMIN_PORT": str(free_port()),
            "MODELROLL_ROUTES_FILE": str(routes),
        },
    )

    url = f"http://127.0.0.1:{gw_port}/v1/models/sentiment/infer"
    status, version, body = _post(url, "secret-payload-7f3a")
    assert (status, version) == (200, "stable-v1"), f"{body}\n{gateway.log()}"
    assert body["version"] == "stable-v1"

    gateway.signal(signal.SIGTERM)
    assert gateway.wait(timeout=20) == 0
    log = gateway.log()
    assert "Added the routes of model sentiment: stable-v1=1" in log
    assert "secret-payload-7f3a" not in log  # no payloads in logs


def test_unreleased_versions_are_out_of_reach_of_the_clients_port(
    spawn: Spawn, tmp_path: Path
) -> None:
    """With its defaults, what a client can send to the gateway's port reaches no weight-0
    version and does not tell its name from a guess; the routes and the metrics, which name it,
    are on the admin port."""
    stable, gw_port, admin_port = _stable_v1(spawn), free_port(), free_port()
    dark = f"http://127.0.0.1:{free_port()}"  # nothing listens: a request it got would be 502
    routes = tmp_path / "routes.json"
    versions = (("stable-v1", 1, stable), ("canary-v2", 0, dark))
    routes.write_text(json.dumps({"sentiment": route("sentiment", *versions)}))
    base, admin = f"http://127.0.0.1:{gw_port}", f"http://127.0.0.1:{admin_port}"
    gateway = spawn(
        "modelroll-gateway",
        f"--port={gw_port}",
        f"--admin-port={admin_port}",
        f"--routes-file={routes}",
        ready=f"{base}/readyz",
    )

    url = f"{base}/v1/models/sentiment/infer"
    real = _post(url, "hi", {"X-Modelroll-Version": "canary-v2"})
    guess = _post(url, "hi", {"X-Modelroll-Version": "canary-v9"})
    assert real == guess == _post(url, "hi"), gateway.log()
    assert real[:2] == (200, "stable-v1")
    for path in ("/metrics", "/v1/routes"):
        assert _get(f"{base}{path}") == (404, json.dumps({"error": f"no such path '{path}'"}))
    status, text = _get(f"{admin}/metrics")
    assert status == 200
    assert 'modelroll_gateway_weight{model="sentiment",version="canary-v2"} 0.0' in text
    assert "modelroll_gateway_pins_ignored_total 2.0" in text
    status, text = _get(f"{admin}/v1/routes")
    assert status == 200
    (model,) = json.loads(text)["models"]
    assert [v["name"] for v in model["versions"]] == ["stable-v1", "canary-v2"]
    assert "Serving GET /metrics and GET /v1/routes on 0.0.0.0:" in gateway.log()


def _run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    exe = Path(sys.executable).parent / "modelroll-gateway"
    return subprocess.run(
        [str(exe), *args],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
        env=env if env is not None else {"PATH": "/usr/bin:/bin"},
    )


def test_without_credentials_or_a_routes_file_it_exits_saying_what_to_pass(tmp_path: Path) -> None:
    result = _run(env={"PATH": "/usr/bin:/bin", "KUBECONFIG": str(tmp_path / "missing")})
    assert result.returncode == 2
    assert "pass --kubeconfig, set KUBECONFIG" in result.stderr


def test_a_failing_exec_plugin_is_named_in_the_error(tmp_path: Path) -> None:
    config = tmp_path / "kubeconfig"
    config.write_text(
        """
apiVersion: v1
kind: Config
current-context: c
contexts: [{name: c, context: {cluster: k, user: u}}]
clusters: [{name: k, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {exec: {apiVersion: client.authentication.k8s.io/v1, command: aws}}}]
"""
    )
    result = _run(f"--kubeconfig={config}")  # no `aws` on this PATH
    assert result.returncode == 2
    assert "the kubeconfig's exec credential plugin 'aws' gave no token" in result.stderr
    # Without the flag: MODELROLL_KUBECONFIG, then KUBECONFIG.
    for env in [{"MODELROLL_KUBECONFIG": str(config)}, {"KUBECONFIG": str(config)}]:
        result = _run(env={"PATH": "/usr/bin:/bin", "KUBECONFIG": str(tmp_path / "no"), **env})
        assert result.returncode == 2
        assert "the kubeconfig's exec credential plugin 'aws' gave no token" in result.stderr


def test_bad_values_are_refused_naming_the_flag_or_variable_they_came_from() -> None:
    result = _run("--routes-file=x.json", "--upstream-timeout=-1")
    assert result.returncode == 2
    error = "modelroll-gateway: error: --upstream-timeout -1: invalid positive number"
    assert result.stderr.splitlines()[-1] == error
    result = _run("--routes-file=x.json", env={"PATH": "/usr/bin", "MODELROLL_MAX_BODY_BYTES": "0"})
    assert result.returncode == 2
    error = "modelroll-gateway: error: MODELROLL_MAX_BODY_BYTES=0: invalid positive integer"
    assert result.stderr.splitlines()[-1] == error
    result = _run("--routes-file=x.json", env={"PATH": "/usr/bin", "MODELROLL_PORT": "80000"})
    assert result.returncode == 2
    error = "modelroll-gateway: error: MODELROLL_PORT=80000: invalid port number (0 to 65535)"
    assert result.stderr.splitlines()[-1] == error
    result = _run("--routes-file=x.json", "--admin-port=8080")
    assert result.returncode == 2
    error = "modelroll-gateway: error: --admin-port must differ from --port, got 8080 for both"
    assert result.stderr.splitlines()[-1] == error


DEFAULTS = {
    "--host": "0.0.0.0",
    "--port": "8080",
    "--admin-port": "9090",
    "--namespace": "the kubeconfig context's, else the service account's, else default",
    "--configmap": "modelroll-routes",
    "--routes-file": "none: routes come from the API",
    "--routes-poll-seconds": "0.25",
    "--kubeconfig": "$KUBECONFIG, else ~/.kube/config, else the in-cluster service account",
    "--upstream-timeout": "30.0",
    "--generation-timeout": "600.0",
    "--connect-timeout": "2.0",
    "--upstream-connection-max-age": "10.0",
    "--upstream-max-connections": "100",
    "--shadow-max-in-flight": "64",
    "--shadow-max-compare-bytes": "1048576",
    "--cohort-key-budget": "10",
    "--series-grace-seconds": "600.0",
    "--max-body-bytes": "1048576",
    "--read-timeout": "30.0",
    "--trusted-networks": "none",
    "--pins-from-any-client": "off",
    "--event-loop": "auto",
    "--log-level": "INFO",
}


def test_help_shows_every_flags_default_and_variable() -> None:
    result = _run("--help", env={"PATH": "/usr/bin:/bin", "COLUMNS": "1000"})
    assert result.returncode == 0, result.stderr
    entries = help_entries(result.stdout)
    assert set(entries) == {*DEFAULTS, "--help"}
    for flag, default in DEFAULTS.items():
        variable = "MODELROLL_" + flag[2:].replace("-", "_").upper()
        assert f"(default: {default}; env {variable})" in entries[flag]
