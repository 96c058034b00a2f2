"""The ModelVersions in examples/ (managed/, llm/, chat/): the images `make images` builds, the
engines' flags as the injected sidecar calls them, and the commands their comments give."""

from __future__ import annotations

import ast
import json
import shlex
import urllib.parse
from pathlib import Path

import pytest
import yaml

from modelroll_operator.config import OperatorConfig
from modelroll_operator.manifests import sidecar_args
from modelroll_operator.spec import parse_spec
from tests.support.chart import EXAMPLES, REPO, Manifest, commented_manifest
from tests.support.dockerfiles import Dockerfile, images
from tests.support.rendering import chart_meta


@pytest.mark.parametrize(
    ("directory", "command"),
    [("managed", "modelroll-demo-model"), ("llm", "modelroll-demo-llm")],
)
def test_the_managed_examples_use_the_demo_image_make_images_builds(
    directory: str, command: str
) -> None:
    """examples/managed/ runs the demo model, examples/llm/ the demo LLM, from the demo image:
    the name and tag `make images` gives it (hack/images/build.sh: the registry prefix, the
    image standins/pyproject.toml names, the chart's appVersion), never pulled on a node that
    has it, and the stable's file says how to get it."""
    build_sh = (REPO / "hack" / "images" / "build.sh").read_text()
    assert "registry=${IMAGE_REGISTRY:-ghcr.io/modelroll}" in build_sh
    assert "image=$registry/$name:$tag" in build_sh
    built = f"ghcr.io/modelroll/{images()['standins']}:" + chart_meta()["appVersion"]
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


def trained_models() -> dict[str, str]:
    """What models/mlserver/train.py writes: each model's folder and the name its
    model-settings.json gives it (``save(out / folder, ...)`` after ``model_settings(name, ...)``,
    in each train_* function)."""
    tree = ast.parse((REPO / "models" / "mlserver" / "train.py").read_text())
    trained = {}
    for function in (n for n in tree.body if isinstance(n, ast.FunctionDef)):
        calls = [c for c in ast.walk(function) if isinstance(c, ast.Call)]
        names = [c.args[0] for c in calls if getattr(c.func, "id", "") == "model_settings"]
        folders = [c.args[0] for c in calls if getattr(c.func, "id", "") == "save"]
        if names and folders:
            (name,), (folder,) = names, folders
            assert isinstance(name, ast.Constant)
            assert isinstance(folder, ast.BinOp)
            assert isinstance(folder.right, ast.Constant)
            trained[str(folder.right.value)] = str(name.value)
    return trained


def test_the_open_inference_examples_run_mlserver_from_the_image_make_images_builds() -> None:
    """examples/open-inference/: MLServer from the image `make images` tags, never pulled on a
    node that has it, serving a model folder the image holds under the name the sidecar calls,
    on the port the sidecar calls; the files build.sh puts in the image's context; the stable's
    file says how to get the image."""
    tag = chart_meta()["appVersion"]
    build_sh = (REPO / "hack" / "images" / "build.sh").read_text()
    assert "image=$registry/modelroll-mlserver:$tag" in build_sh
    dockerfile = Dockerfile.parse(REPO / "hack" / "images" / "mlserver.Dockerfile")
    for source in dockerfile.context_sources():
        assert f'"$mlserver_context/{source}"' in build_sh, source
    assert any("train.py /models" in run for run in dockerfile.all("RUN"))
    trained = trained_models()
    docs = {p.stem: yaml.safe_load(p.read_text()) for p in (EXAMPLES / "open-inference").glob("*")}
    assert set(docs) == {"digits-stable", "digits-canary"}
    for name, doc in docs.items():
        spec = doc["spec"]
        server = spec["server"]
        assert (doc["metadata"]["name"], spec["protocol"]) == (name, "OpenInference")
        assert server["image"] == f"ghcr.io/modelroll/modelroll-mlserver:{tag}", name
        assert server["imagePullPolicy"] == "IfNotPresent", name
        mlserver, start, folder = server["command"]
        assert (mlserver, start, folder.rsplit("/", 1)[0]) == ("mlserver", "start", "/models")
        env = {e["name"]: e["value"] for e in server["env"]}
        assert int(env["MLSERVER_HTTP_PORT"]) == server["port"], name
        sidecar = sidecar_args(name, parse_spec(spec), OperatorConfig())
        assert "--protocol=openinference" in sidecar, name
        served = server.get("servedModelName", spec["model"])
        assert trained[folder.rsplit("/", 1)[1]] == served, name
        [upstream] = [a for a in sidecar if a.startswith("--upstream=")]
        assert urllib.parse.urlsplit(upstream.removeprefix("--upstream=")).port == server["port"]
    assert {n: d["spec"]["weight"] for n, d in docs.items()} == {
        "digits-stable": 90,
        "digits-canary": 10,
    }
    text = (EXAMPLES / "open-inference" / "digits-stable.yaml").read_text()
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


def managed_examples() -> list[tuple[str, Manifest]]:
    """Every managed ModelVersion in examples/, and the vLLM one examples/llm shows in comments."""
    docs = [
        (str(path.relative_to(EXAMPLES)), yaml.safe_load(path.read_text()))
        for path in sorted(EXAMPLES.glob("*/*.yaml"))
    ]
    vllm = commented_manifest(EXAMPLES / "llm" / "chat-stable.yaml")
    docs.append(("llm/chat-stable.yaml (vLLM, in its comments)", vllm))
    return [(name, doc) for name, doc in docs if doc.get("kind") == "ModelVersion"]


def test_the_managed_examples_pass_pod_security_baseline() -> None:
    """What the operator (--pod-security=baseline, its default) and the chart's admission policy
    refuse is nowhere in the examples."""
    managed = {
        name: parse_spec(doc["spec"]).server
        for name, doc in managed_examples()
        if "server" in doc["spec"]
    }
    assert {Path(name).parts[0] for name in managed} >= {
        "managed",
        "encoder",
        "chat",
        "llm",
        "open-inference",
    }
    for name, server in managed.items():
        assert server is not None
        assert server.baseline_violations == (), name
